// tandem kernels — the Hopper GEMM core on its own: D = alpha * A @ B (+ beta * C), bf16/fp16 in, fp32
// accumulate, row-major A (M x K), B (K x N) and D (M x N). Built on CUTLASS 3 (TMA loads, wgmma, mbarrier
// pipeline, warp-specialized persistent cooperative kernel). The fused kernels reuse its configuration; this
// unfused entry is the world-1 baseline and the fallback below the fusion crossover.
//
// Host adapter in the CUTLASS manner: can_implement -> workspace_size -> run, each returning a Status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tandem/transport/device_comm.h"

namespace tandem::kernels::gemm {

enum class DType : int32_t { kBF16 = 0, kFP16 = 1 };

struct GemmArgs {
  int m = 0, n = 0, k = 0;
  DType dtype = DType::kBF16;
  const void* a = nullptr;  // M x K, row-major, leading dimension lda (elements)
  int64_t lda = 0;
  const void* b = nullptr;  // K x N, row-major, leading dimension ldb
  int64_t ldb = 0;
  void* d = nullptr;        // M x N, row-major, leading dimension ldd
  int64_t ldd = 0;
  const void* c = nullptr;  // optional M x N source of beta * C (nullptr: beta must be 0)
  int64_t ldc = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  int sm_count = 0;         // SMs the persistent grid may use (the rank's MPS share); 0 = the device's
};

// kOk, or kInvalidArgument with the reason in *why (if given): shape, alignment (16-byte rows for TMA),
// leading dimensions, null pointers.
Status can_implement(const GemmArgs& args, std::string* why = nullptr);
size_t workspace_size(const GemmArgs& args);
// Launch on `stream`. `workspace` must hold workspace_size(args) bytes (may be null when that is 0).
Status run(const GemmArgs& args, void* workspace, cudaStream_t stream, std::string* why = nullptr);

}  // namespace tandem::kernels::gemm
