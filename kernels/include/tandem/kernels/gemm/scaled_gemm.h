// tandem kernels — FP8 (e4m3) GEMM with scales, bf16 out, on Hopper: D = scale_a * (scale_b * (A @ B)), the
// product accumulated in fp32, the scales applied to the fp32 accumulator, one rounding to bf16. The semantics of
// torch._scaled_mm for the same scaling mode:
//
//   tensor: scale_a and scale_b are one float each (a 0-dim tensor in torch);
//   row:    scale_a has one float per row of A (M), scale_b one per column of B (N) (torch: (M, 1) and (1, N)).
//
// Layouts as _scaled_mm takes them (FP8 tensor-core operands are K-major on Hopper): A is M x K row-major
// (element (m, k) at a[m * lda + k]), B is K x N column-major (element (k, n) at b[n * ldb + k]; in torch the
// transpose of a row-major N x K weight). D is M x N row-major bf16.
//
// The scales multiply as scale_a * (scale_b * acc) in fp32 (the order of torch's row-wise CUTLASS kernel; with
// cuBLAS >= 12.9 torch sends row-wise scaling to cuBLASLt instead, whose order is its own, so results agree to
// fp32 rounding, not necessarily bit for bit). The mainloop accumulates in fp32 with CUTLASS's periodic promotion
// (every 128 of K; not the "fast accumulation" mode), as _scaled_mm does by default (use_fast_accum=False).
//
// Host adapter in the CUTLASS manner: can_implement -> workspace_size -> run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tandem/kernels/gemm/gemm.h"

namespace tandem::kernels::gemm {

enum class Scaling : int32_t { kTensor = 0, kRow = 1 };

// The CUTLASS configuration that computes the product (tile M x N x 128, cluster, schedule). Every configuration
// has the semantics above; the unsplit 128-wide ones give the same bits (each output element's K loop in the same
// order, promoted every 128), the unsplit 192-wide ones run the same K blocks and promotions on a wider wgmma
// (m64n192k32), whose order of summing an element's k32 products no document fixes (tests/gpu/test_gemm.py holds
// them to one bf16 rounding step of the default and records whether they were identical), and the split ones sum
// fp32 partial tiles through the workspace in a fixed order (deterministic, but other bits). Which one is fastest depends on the shape (tandem.ops.gemm_plan).
enum class ScaledConfig : int32_t {
  kCoop128C2 = 0,      // cooperative 128x128, 2x1 clusters (the default)
  kCoop128C1 = 1,      // cooperative 128x128, no cluster
  kCoop128C1x2 = 2,    // cooperative 128x128, 1x2 clusters (A multicast along N)
  kPingpong64C1 = 3,   // ping-pong 64x128 (one 64-row tile a warp group: small M)
  kSplitK2Coop128 = 4, // cooperative 128x128, K in 2 slices (tiles too few to fill the GPU)
  kStreamKCoop128 = 5, // cooperative 128x128, stream-K (K iterations balanced over the grid)
  // 128x192 / 64x192 tiles (128x192: 1.2x the MMA work per byte loaded of 128x128): the widest N that the
  // promotion buffer leaves room for (the consumer's two fp32 fragments, 192 of its 232 registers; 128x256 spills).
  // Not yet timed on a GPU: tandem.ops.gemm_plan takes them only from a measured table, never from its wave model.
  kCoop128x192C2 = 6,     // cooperative 128x192, 2x1 clusters
  kCoop128x192C1 = 7,     // cooperative 128x192, no cluster
  kPingpong64x192C1 = 8,  // ping-pong 64x192
};
constexpr int kScaledConfigs = 9;

struct ScaledGemmArgs {
  int m = 0, n = 0, k = 0;
  const void* a = nullptr;        // e4m3, M x K row-major, leading dimension lda (elements = bytes)
  int64_t lda = 0;
  const void* b = nullptr;        // e4m3, K x N column-major, leading dimension ldb (elements = bytes)
  int64_t ldb = 0;
  void* d = nullptr;              // bf16, M x N row-major, leading dimension ldd (elements)
  int64_t ldd = 0;
  Scaling scaling = Scaling::kTensor;
  const float* scale_a = nullptr;  // device memory: 1 float (tensor) or M floats (row)
  const float* scale_b = nullptr;  // device memory: 1 float (tensor) or N floats (row)
  int sm_count = 0;                // SMs the persistent grid may use; 0 = the device's
  ScaledConfig config = ScaledConfig::kCoop128C2;
  // The persistent scheduler's walk over the output tiles, as GemmArgs' (1, 2, 4 or 8; heuristic, along M or N):
  // which A and B tiles share the L2, never the result's bits.
  int max_swizzle = 1;
  GemmArgs::Raster raster = GemmArgs::Raster::kHeuristic;
};

// kOk, or kInvalidArgument with the reason: positive shape; non-null, 16-byte aligned operands and scales;
// K and the leading dimensions of A and B multiples of 16 (16-byte TMA rows of 1-byte elements), N and ldd
// multiples of 8; a known config.
Status can_implement(const ScaledGemmArgs& args, std::string* why = nullptr);
// Device memory run() needs for these arguments (its configuration's; the split ones hold their partial tiles).
size_t workspace_size(const ScaledGemmArgs& args);
Status run(const ScaledGemmArgs& args, void* workspace, cudaStream_t stream, std::string* why = nullptr);
cudaError_t preload_scaled_kernels();

}  // namespace tandem::kernels::gemm
