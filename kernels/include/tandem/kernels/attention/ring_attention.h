// tandem kernels — ring attention (sequence parallelism) as one role-specialized persistent kernel (Hopper).
//
// The global sequence (length S = W * S_l) is sharded over the W ranks. Each rank holds its S_l rows of Q, K and
// V and computes softmax(Q K^T * scale [+ causal mask]) V for its rows against the whole sequence:
//   step 0       its own K/V block;
//   step i > 0   the K/V block of rank (r - i) mod W, which arrived from the predecessor (r - 1) while step i - 1
//                ran, and which it forwards to the successor (r + 1) in turn (a ring).
// One launch; its blocks take roles:
//   * comm blocks (plan.comm_blocks, 0 at world 1) forward each step's K/V block into the successor's slot
//     through the transport's device API (NVLink load/store or the CPU proxy), double-buffered: two slots per
//     rank, each reused once the holder has both computed on it and forwarded it (flags, see .cu);
//   * attention blocks run a FlashAttention-3 style forward (TMA loads, wgmma, online softmax in base 2, a
//     producer warp and two consumer warpgroups) on every (batch, head, 128-row Q tile) of each step, and merge
//     the step's partial result into an fp32 accumulator with log-sum-exp weights; the last step writes O and
//     LSE.
//
// Causal masking is global: rank r's local rows are at global positions given by the layout.
//   * causal = false: contiguous shards, local row j is global row r * S_l + j (positions unused);
//   * causal = true:  zigzag (load balancing): the sequence is cut into 2W chunks of C = S_l / 2 rows and rank
//     r holds chunk r then chunk 2W - 1 - r, so local row j is global row r C + j (j < C) or (2W - 1 - r) C +
//     j - C. Every rank then does the same work. S_l must be even.
// Query row p sees key row p' when p' <= p (causal) — the same convention as torch SDPA's is_causal on the
// gathered, un-zigzagged sequence.
//
// Host adapter in the CUTLASS manner: can_implement -> workspace_size -> run. The workspace lives in the
// communicator's symmetric heap (same offset on every rank), zero-initialized once and reused by launches of the
// same shape; every rank calls run with the same shape, in the same order. Launches are ordered by an epoch kept
// in the workspace (CUDA-graph safe).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tandem/kernels/gemm/gemm.h"
#include "tandem/transport/device_comm.h"

namespace tandem::kernels::attention {

using gemm::DType;

struct RingShape {
  int batch = 0;          // B >= 1
  int seq_local = 0;      // S_l >= 1 rows of every sequence on each rank (the same on every rank); even if causal
  int heads_q = 0;        // Hq >= 1
  int heads_kv = 0;       // Hkv >= 1, divides Hq (GQA / MQA: query head h reads KV head h / (Hq / Hkv))
  int head_dim = 0;       // d: 64 or 128
  bool causal = false;
  float softmax_scale = 0.f;  // 0: 1 / sqrt(d)
};

struct RingPlan {
  int sm_count = 0;     // SMs this rank really has (its MPS share); every block must be resident at once
  int comm_blocks = 0;  // forwarding blocks (0: the heuristic: 2 at world > 1, none at world 1), at most 8
  // K/V slots per rank, in [2, world] (0: 2, double buffering). A slot is rewritten only after its holder has
  // computed on it and forwarded it, so with fewer slots than ranks a rank waits for its successor's compute;
  // with `world` slots nothing is ever rewritten within a launch and only arrivals are waited for.
  int kv_slots = 0;
};

struct RingArgs {
  DType dtype = DType::kBF16;
  RingShape shape{};
  // B x S_l x H x d, contiguous ("bshd", as flash-attn and torch's (B, S, H, d) before the transpose)
  const void* q = nullptr;
  const void* k = nullptr;  // B x S_l x Hkv x d, contiguous
  const void* v = nullptr;  // B x S_l x Hkv x d, contiguous
  void* o = nullptr;        // out: B x S_l x Hq x d, contiguous
  float* lse = nullptr;     // out: B x Hq x S_l, natural log of the softmax denominator (scaled logits)
  void* workspace = nullptr;  // symmetric: workspace_size bytes, zeroed before first use
  RingPlan plan{};
  tandem::DeviceComm comm{};
};

Status can_implement(const RingArgs& args, std::string* why = nullptr);
size_t workspace_size(const RingArgs& args);
Status run(const RingArgs& args, cudaStream_t stream, std::string* why = nullptr);
// Loads the kernels before the first launch (lazy module loading behind a kernel that waits for proxy traffic
// stalls the proxy; see tandem.ops.tp).
cudaError_t preload_kernels();

// Global position of local row j of rank r (the layout above); exposed for tests and the Python reference.
inline int64_t global_row(const RingShape& s, int world, int rank, int64_t j) {
  if (!s.causal) return static_cast<int64_t>(rank) * s.seq_local + j;
  const int64_t c = s.seq_local / 2;
  return j < c ? rank * c + j : (2 * static_cast<int64_t>(world) - 1 - rank) * c + (j - c);
}

}  // namespace tandem::kernels::attention
