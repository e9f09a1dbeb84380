// tandem kernels — MoE expert parallelism: token dispatch fused with the experts' grouped GEMM, and the combine.
//
//   dispatch+GEMM:  every (token t, slot s) of this rank goes to the rank owning expert topk_ids[t, s]; each local
//                   expert j computes y_j = x_j @ W_j (x_j: the rows it received, W_j: H x I) as soon as its rows
//                   are there.
//   combine:        out[t] = sum_s topk_weights[t, s] * z[row(t, s)], where z is any per-row result in the dispatch
//                   layout (typically the experts' second GEMM), sent back to the token's rank.
//
// E = world * experts_per_rank experts; expert e lives on rank e / experts_per_rank as local expert
// e % experts_per_rank. Every size is a runtime argument.
//
// The dispatch layout (computed on the GPU, no host sync) on the receiving rank: local expert j's rows are
//   rows [expert_offset[j], expert_offset[j] + expert_rows[j]) of y (and of the receive buffer), ordered by source
//   rank, then by (token, slot) within a source. source_offset[j * (world + 1) + s] is where source s's rows of
//   expert j begin (relative to expert_offset[j]), and row_source[r] the flat index t * k + s of row r at its source.
// Rows of a token that chose two experts of one rank are sent twice (once per expert), unless DispatchArgs::dedup:
// then the dispatch-alone launches (run_unfused, run_dispatch) send each token once per destination rank and the
// destination copies it into each of its experts' rows (DeepEP's scheme; the layout is the same either way).
//
// One launch per call; launches are ordered by epochs kept in the workspace (CUDA-graph safe, like the TP ops).
// Host adapters in the CUTLASS manner: can_implement -> workspace_size -> run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/kernels/fused/tp_gemm.h"
#include "tandem/kernels/gemm/gemm.h"
#include "tandem/transport/device_comm.h"

namespace tandem::kernels::moe {

using gemm::DType;
using tp::SmPlan;

struct MoeShape {
  int tokens = 0;            // T: this rank's tokens (may be 0, may differ between ranks)
  int max_tokens = 0;        // T_max >= T: the same on every rank (sizes the symmetric buffers)
  int hidden = 0;            // H: multiple of 8
  int inter = 0;             // I: the GEMM's N, multiple of 8
  int topk = 0;              // k in [1, E]
  int experts_per_rank = 0;  // E_local >= 1
};

// Rows a rank can receive: every token of every rank, once per local expert it chose (at most min(k, E_local)):
// a token's experts must be distinct, and max_tokens the same on every rank (the Python ops refuse both before
// launch). A dispatch whose rows would exceed a destination's capacity anyway sends nothing, leaves every layout
// empty and reports kInvalidArgument (peer: the destination, expected: the capacity, observed: the rows).
int64_t receive_capacity(const MoeShape& s, int world);

struct DispatchArgs {
  DType dtype = DType::kBF16;
  MoeShape shape{};
  const void* x = nullptr;            // T x H, contiguous rows
  const int32_t* topk_ids = nullptr;  // T x k; ids outside [0, E) are dropped and reported (kInvalidArgument)
  const void* w = nullptr;            // E_local x H x I, each H x I row-major
  void* y = nullptr;                  // out: receive_capacity x I (rows past `received` are left as they were)
  void* rows = nullptr;               // out (run_dispatch only): receive_capacity x H, the received token rows in
                                      // layout order (rows past `received` unspecified); null for run/run_unfused
  int32_t* layout = nullptr;          // out: layout_size int32 (LayoutIndex below)
  void* workspace = nullptr;          // symmetric, workspace_size bytes, zeroed before first use
  SmPlan plan{};                      // comm_blocks: the blocks that send rows (fused: the first this many to
                                      // start; the others compute once the layout is
                                      // written; 0 = heuristic)
  // 1: send a token once per destination rank (run_unfused and run_dispatch; the fused kernel, whose GEMM reads
  // the rows as they land, sends once per expert either way). The ranks must agree on it and on the launch kind
  // (run, run_unfused or run_dispatch): the workspace's layout and the protocol depend on both. The destination's
  // extra buffer is world x max_tokens rows.
  int dedup = 0;
  tandem::DeviceComm comm{};
};
// Diagnostic (tests): the token rows the last dispatch launch on `workspace` put with dedup, one a (token,
// destination rank) pair, this rank as a destination included (0 without dedup). The caller synchronizes its
// stream first; -1 on a CUDA error.
int64_t dispatch_rows_sent(const void* workspace);

// The layout array (int32), in this order:
//   [0]                              received: rows this rank received in all
//   [rows, rows + E_l)               expert_rows[j]
//   [offset, offset + E_l + 1)       expert_offset[j] (prefix sums of expert_rows)
//   [source, source + E_l (W + 1))   source_offset[j * (W + 1) + s]
//   [row_source, + capacity)         row_source[r] = t * k + slot at the row's source
struct LayoutIndex {
  int64_t rows, offset, source, row_source, size;
};
LayoutIndex layout_index(const MoeShape& s, int world);

// Args with `rows` set and w null are dispatch-only args (run_dispatch): w, y and shape.inter are not checked.
Status can_implement(const DispatchArgs& args, std::string* why = nullptr);
size_t workspace_size(const DispatchArgs& args);
// Fused: one persistent kernel; the first comm_blocks blocks to start send the rows (claimed work: no block waits
// for one that may lack an SM), then every block runs the grouped GEMM, whose expert tiles start when the expert's
// rows have arrived from every source that sends it rows.
Status run(const DispatchArgs& args, cudaStream_t stream, std::string* why = nullptr);
// Unfused: the dispatch kernel alone (it waits for every row), then the grouped GEMM kernel.
Status run_unfused(const DispatchArgs& args, cudaStream_t stream, std::string* why = nullptr);
// Dispatch only (no GEMM; w, y and shape.inter unused): the dispatch kernel, then a stream-ordered copy of the
// workspace's received rows (layout[0] of them, read on the device) into args.rows, then the release kernel (as the
// unfused path runs it after its GEMM): the next launch's senders overwrite the received rows only after the copy.
// The layout is written as by the other modes. moe_ffn's backward sends [x | dOut | weights] rows with it.
Status run_dispatch(const DispatchArgs& args, cudaStream_t stream, std::string* why = nullptr);

struct CombineArgs {
  DType dtype = DType::kBF16;
  MoeShape shape{};                   // as dispatched (inter unused)
  int dim = 0;                        // D: columns of z and out, multiple of 8
  const void* z = nullptr;            // receive_capacity x D (rows in the dispatch layout; unused rows ignored)
  const float* topk_weights = nullptr;  // T x k
  const int32_t* topk_ids = nullptr;  // T x k (ids outside [0, E) contribute nothing)
  void* out = nullptr;                // T x D
  const int32_t* layout = nullptr;    // the dispatch's layout array that z follows
  void* workspace = nullptr;          // symmetric, combine_workspace_size bytes, zeroed before first use
  SmPlan plan{};
  tandem::DeviceComm comm{};
};
Status can_implement(const CombineArgs& args, std::string* why = nullptr);
size_t workspace_size(const CombineArgs& args);
// out[t] = sum over slots s in order 0..k-1 of w[t, s] * z-row (fp32, one rounding): deterministic.
Status run(const CombineArgs& args, cudaStream_t stream, std::string* why = nullptr);

// SwiGLU of GEMM 1's rows in the dispatch layout, over the received rows only (their count read on the device,
// the layout's first element; no host sync): out[r, j] = silu(y[r, j]) * y[r, I + j] for r < min(received,
// capacity), j < I, in fp32 with one rounding: x / (1 + expf(-x)), times up, rounded to nearest (torch's
// silu(gate.float()) * up, the same bits). Rows past the received count are not written (nothing reads them: GEMM 2
// runs over the layout's expert offsets, the combine over the received rows). Why: torch's elementwise ops cannot
// stop at a count on the device, so they ran over every receive-capacity row (world x T_max x min(k, E_l), W times
// the rows an even routing sends), with an fp32 temporary of that size.
struct SwigluArgs {
  DType dtype = DType::kBF16;
  const void* y = nullptr;            // capacity x 2 I, rows [gate | up], 16-byte aligned
  const int32_t* received = nullptr;  // device memory: the received row count (layout[0])
  int64_t capacity = 0;               // rows of y and out
  int inter = 0;                      // I: a positive multiple of 8
  void* out = nullptr;                // capacity x I, 16-byte aligned
  int sm_count = 0;                   // the grid: up to 8 blocks of 256 threads an SM (0: the device's)
};
Status can_implement(const SwigluArgs& args, std::string* why = nullptr);
Status run(const SwigluArgs& args, cudaStream_t stream, std::string* why = nullptr);

// The local experts' grouped GEMM on rows already in the dispatch layout, as its own launch (moe_ffn's GEMM 2,
// z_j = a_j W2_j, with TANDEM_MOE_GEMM2=tandem; torch._grouped_mm otherwise, which takes bf16 only): for each local
// expert j, d rows [offset_j, offset_j + rows_j) = a rows [offset_j, offset_j + rows_j) @ w_j, with rows_j and
// offset_j read on the device (the dispatch layout's expert_rows and expert_offset: no host sync). Rows of d
// outside every expert's range are not written. The same CUTLASS kernel as the dispatch's GEMM (128x256x64 tiles,
// fp32 accumulation, one rounding), in 2x1 clusters or 1x1 (cluster_rows; moe_sm90.cu says when each fits).
struct GroupedGemmArgs {
  DType dtype = DType::kBF16;
  int experts = 0;                          // groups: 1 .. kMaxGroupedExperts
  int n = 0;                                // N: columns of w_j and d, a positive multiple of 8
  int k = 0;                                // K: columns of a, rows of w_j, a positive multiple of 8
  const void* a = nullptr;                  // rows x K, row-major, contiguous, 16-byte aligned
  const void* w = nullptr;                  // experts x K x N, contiguous, 16-byte aligned
  void* d = nullptr;                        // rows x N, contiguous, 16-byte aligned
  const int32_t* expert_rows = nullptr;     // device memory: rows_j, [experts]
  const int32_t* expert_offset = nullptr;   // device memory: offset_j (the first row), [experts]
  void* workspace = nullptr;                // workspace_size bytes of device memory (any; not shared with peers)
  int sm_count = 0;                         // the grid (0: the device's SMs); even
  int cluster_rows = 2;                     // 2: 2x1 clusters (multicast B); 1: 1x1 clusters, raster along M
};
constexpr int kMaxGroupedExperts = 4096;
size_t workspace_size(const GroupedGemmArgs& args);
Status can_implement(const GroupedGemmArgs& args, std::string* why = nullptr);
Status run(const GroupedGemmArgs& args, cudaStream_t stream, std::string* why = nullptr);

cudaError_t preload_kernels();

// Diagnostic (tests): the cluster rows of the last unfused grouped-GEMM launch in this process, 2 (2x1 clusters,
// the default) or 1 (TANDEM_MOE_GEMM_CLUSTER=1); 0 before any.
int last_gemm_cluster_rows();
// Diagnostic (tests): the cluster rows of the last GroupedGemmArgs launch, 2 or 1; 0 before any.
int last_grouped_gemm_cluster_rows();

// Diagnostic: the per-block timeline of the last dispatch launched with TANDEM_MOE_TRACE=1 (512 blocks x 8
// globaltimer slots; kernels/src/moe/moe_common.cuh says what each slot is). Zeros before the first traced launch
// on the current device.
cudaError_t trace_snapshot(std::vector<uint64_t>* out);

}  // namespace tandem::kernels::moe
