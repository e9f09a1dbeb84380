// tandem kernels — the GEMM launchers as a table of plain function pointers.
//
// Why: torch.ops.tandem.gemm / scaled_gemm get C++ kernels for torch's CUDA dispatch key (python/torch_ops/), so a
// call does not pay for a Python function behind the dispatcher. That library is built against torch's headers
// and must not link tandem's kernels a second time (their cubins and launch caches live in tandem._C, which stays
// torch-free, in the manner of DeepEP's kernel layer). tandem._C hands this table over as a PyCapsule named
// kGemmLaunchTableName; the reader checks `version` and the Args sizes before it uses any entry.
//
// Contract of every entry: the Args are a prepared copy (shape, strides, configuration, schedule; made by the
// Python planner after the full input checks); the entry launches on a copy of them with this call's addresses,
// so one prepared Args may be shared by threads. It returns a tandem::Status code (0 = launched) and, when it is
// not 0, writes a NUL-terminated reason of at most why_len bytes (why may be null when why_len is 0).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tandem/kernels/gemm/gemm.h"
#include "tandem/kernels/gemm/scaled_gemm.h"

namespace tandem::kernels::gemm {

inline constexpr uint32_t kGemmLaunchTableVersion = 1;
inline constexpr const char* kGemmLaunchTableName = "tandem.gemm_launch_table.v1";

extern "C" {
struct GemmLaunchTable {
  uint32_t version;                // kGemmLaunchTableVersion
  uint32_t gemm_args_bytes;        // sizeof(GemmArgs) in tandem._C
  uint32_t scaled_gemm_args_bytes; // sizeof(ScaledGemmArgs) in tandem._C
  // The GEMM core (gemm::run).
  int32_t (*gemm)(const GemmArgs* args, const void* a, const void* b, void* d, void* workspace, cudaStream_t stream,
                  char* why, size_t why_len);
  // A named bf16 configuration (gemm_variants.h, variants::run).
  int32_t (*gemm_variant)(const char* name, const GemmArgs* args, const void* a, const void* b, void* d,
                          void* workspace, cudaStream_t stream, char* why, size_t why_len);
  // The FP8 GEMM with scales (scaled_gemm.h, run).
  int32_t (*scaled_gemm)(const ScaledGemmArgs* args, const void* a, const void* b, void* d, const float* scale_a,
                         const float* scale_b, void* workspace, cudaStream_t stream, char* why, size_t why_len);
};
}

// The table of this build (defined in the library that links the launchers: tandem._C's kernels bindings).
const GemmLaunchTable* gemm_launch_table();

}  // namespace tandem::kernels::gemm
