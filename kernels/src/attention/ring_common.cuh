// Ring attention (sm90a), the kernel's shared definitions: flow-control state in the workspace, the work items,
// the attention core's types (Traits: tiles, TMA, wgmma, shared memory) and its host-callable layout helpers
// (positions, causal/ragged visibility, accumulator views). Included by ring_attention_sm90.cu and by the CPU
// layout test (tests/cpu/ring_layouts.cu), which checks these layouts on the host.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>

#include "tandem/device.cuh"
#include "tandem/kernels/runtime/persistent.cuh"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/builders/sm90_common.inl"
#include "cutlass/pipeline/sm90_pipeline.hpp"
#include "tandem/kernels/attention/ring_schedule.h"
#include "tandem/kernels/attention/ring_attention.h"

namespace tandem::kernels::attention {

namespace {

using namespace cute;
using runtime::fail;
using runtime::last_of;

using runtime::kMaxWorld;  // the runtime's world limit: RingControl's slots and the step counters below
constexpr int kMaxCommBlocks = 8;
constexpr int kBlockM = 128;           // Q rows per work item: two consumer warpgroups of 64 rows
constexpr int kBlockN = 128;           // K/V rows per tile
constexpr int kStages = 2;             // K and V smem pipeline depth (each)
constexpr int kQStages = 2;            // Q tiles: the next item's Q loads while the current one computes
constexpr int kWorkStages = 4;         // claimed work items the producer may run ahead of the consumers
constexpr int kThreads = 384;          // producer warpgroup + two consumer warpgroups
constexpr int kConsumerThreads = 256;
constexpr uint32_t kMergePollNs = 200;     // waiting for another block's merge of the item (rare, short)
constexpr uint32_t kArrivalPollNs = 2000;  // one poller per block; each poll costs the senders bandwidth (MoE)
// Named barriers of the two consumer warpgroups (cutlass::arch::NamedBarrier adds its reserved offset):
// kItemBarrier joins both at the end of a work item; kSchedulerBarrier + g is warpgroup g's turn to issue wgmma.
constexpr uint32_t kItemBarrier = 0;
constexpr uint32_t kSchedulerBarrier = 1;
// The two consumer warpgroups take turns issuing their GEMMs (FlashAttention-3's "ping-pong"), so that one's
// softmax runs while the other's GEMMs hold the tensor cores. A diagnostic build may turn it off to measure it.
#ifndef TANDEM_RING_ATTENTION_PINGPONG
#define TANDEM_RING_ATTENTION_PINGPONG 1
#endif
constexpr bool kPingPong = TANDEM_RING_ATTENTION_PINGPONG != 0;

// ---------------------------------------------------------------------------------------------------------------
// Flow-control state in the workspace.

struct alignas(128) RingControl : runtime::ControlHeader {  // epoch, done_blocks: the runtime's line
  uint64_t arrived[kMaxWorld][kMaxCommBlocks];  // [slot][c]: G of the step whose range c landed in the slot
  uint64_t released[kMaxWorld];                 // [slot]: G of the last step the successor finished with it
};
static_assert(sizeof(RingControl) <= 8 * 4096, "control block");
constexpr size_t kRingControlBytes = (sizeof(RingControl) + 4095) / 4096 * 4096;

struct Offsets {
  size_t control, counters, merged, o_acc, lse_acc, k_slots, v_slots, total;
  size_t block_bytes;  // one rank's K (or V) block
};

// Work items of one step: (batch, query head, 128-row Q tile).
int64_t items_of(const RingShape& s) {
  return static_cast<int64_t>(s.batch) * s.heads_q * ((s.seq_local + kBlockM - 1) / kBlockM);
}

int slots_of(const RingArgs& a) {
  const int w = a.comm.world;
  if (w <= 1) return 0;
  const int n = a.plan.kv_slots > 0 ? a.plan.kv_slots : 2;
  return n < w ? n : w;
}

int comm_blocks_of(const RingArgs& a) {
  if (a.comm.world <= 1) return 0;
  return a.plan.comm_blocks > 0 ? a.plan.comm_blocks : 2;
}

Offsets offsets_of(const RingArgs& a) {
  const RingShape& s = a.shape;
  const size_t rows = static_cast<size_t>(s.batch) * s.seq_local;
  Offsets o{};
  runtime::WorkspaceCarver w{0};
  const auto take = [&](size_t bytes) { return w.take(bytes); };
  o.control = take(kRingControlBytes);
  o.counters = take(sizeof(uint64_t) * 2 * kMaxWorld);  // parties[W], claimed[W]: zeroed per launch
  o.block_bytes = rows * s.heads_kv * s.head_dim * 2;
  const bool multi = a.comm.world > 1;
  o.merged = take(multi ? sizeof(uint64_t) * items_of(s) : 0);  // per work item: G of its last merged step
  o.o_acc = take(multi ? rows * s.heads_q * s.head_dim * sizeof(float) : 0);
  o.lse_acc = take(multi ? rows * s.heads_q * sizeof(float) : 0);
  o.k_slots = take(o.block_bytes * slots_of(a));
  o.v_slots = take(o.block_bytes * slots_of(a));
  o.total = w.at;
  return o;
}

// ---------------------------------------------------------------------------------------------------------------
// The attention core: types.

template <class Element_, int kHeadDim_>
struct Traits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  using TileShapeS = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;  // S = Q K^T: M, N, K
  using TileShapeO = Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>;  // O = P V:   M, N, K
  // Two consumer warpgroups, 64 rows each.
  using AtomLayout = Layout<Shape<_2, _1, _1>>;
  using MmaS = decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, TileShapeS>(), AtomLayout{}));
  using MmaO = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, TileShapeO, GMMA::Major::K, GMMA::Major::MN>(), AtomLayout{}));

  using SmemAtomQ = decltype(cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element,
                                                                                  Int<kBlockM>, Int<kHeadDim>>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtomQ{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kQStages>>{}));
  using SmemAtomKV = decltype(cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element,
                                                                                   Int<kBlockN>, Int<kHeadDim>>());
  using SmemLayoutK = decltype(tile_to_shape(SmemAtomKV{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = SmemLayoutK;
  // V as the second GEMM's B operand (N = head dim, K = key rows): the same bytes seen transposed, head dim
  // contiguous (MN-major). Vt(d, n, s) is V's element (n, d, s).
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));

  // Global tensors as TMA sees them: (rows, d, heads, batch, slot), d contiguous; the user's K/V is slot 0 of 1.
  using GShape = Shape<int32_t, int32_t, int32_t, int32_t, int32_t>;
  using GStride = Stride<int64_t, _1, int64_t, int64_t, int64_t>;
  using GLayout = Layout<GShape, GStride>;
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)),
                                                                   GLayout{}),
                                      take<0, 2>(SmemLayoutQ{})));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{},
                                       make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)), GLayout{}),
                                       take<0, 2>(SmemLayoutK{})));

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKVTileBytes = kBlockN * kHeadDim * sizeof(Element);  // one K (or V) tile

  // K and V have pipelines of their own: a consumer is done with K_n after S = Q K_n^T, but with V_n only after
  // the next iteration's O += P V_n (the GEMMs of consecutive tiles overlap), so one stage for both would hold K.
  using PipelineKV = cutlass::PipelineTmaAsync<kStages>;
  using PipelineQ = cutlass::PipelineTmaAsync<kQStages>;
  using PipelineWork = cutlass::PipelineAsync<kWorkStages>;

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    typename PipelineKV::SharedStorage pipe_k;
    typename PipelineKV::SharedStorage pipe_v;
    typename PipelineQ::SharedStorage pipe_q;
    typename PipelineWork::SharedStorage pipe_work;
    int2 work[kWorkStages];  // (step, item) the producer claimed, in order; step -1: no more work
  };
  static_assert(sizeof(SharedStorage) + 1024 <= 227 * 1024, "shared memory of one block (plus alignment slack)");
};

struct Problem {
  int batch, seq, heads_q, heads_kv, group;  // group = Hq / Hkv
  int world, rank, slots, comm_blocks, items;  // items: work items of one step
  bool causal;
  float scale_log2;        // softmax_scale * log2(e)
  int m_tiles, n_tiles;    // per (batch, head): ceil(S_l / kBlockM), ceil(S_l / kBlockN)
  int order_group;         // (batch, head) pairs claimed together (work_item)
  int step0_slot;          // -1: step 0 reads the user's K/V; 0: slot 0 (staged for the proxy)
};

template <class T>
struct Params {
  typename T::TmaQ tma_q;
  typename T::TmaKV tma_k_user, tma_v_user, tma_k_slots, tma_v_slots;
  Problem pr;
  tandem::DeviceComm comm;
  RingControl* ctl;
  uint64_t* parties;     // [W]: work items and comm blocks done with step i's slot (release_if_last)
  uint64_t* claimed;     // [W]: work items of step i handed out; both zeroed per launch
  uint64_t* merged;      // [items]: G of the last step merged into O_acc for the item (never reset)
  const char* k_user;    // forwarding sources (step 0 without staging)
  const char* v_user;
  char* k_slots;         // symmetric: slots x block_bytes
  char* v_slots;
  size_t block_bytes;
  float* o_acc;          // B x S_l x Hq x d (fp32), world > 1
  float* lse_acc;        // B x Hq x S_l, log2 units, world > 1
  typename T::Element* o;
  float* lse;
};

// Global position of local row j of rank `rank` (ring_attention.h).
CUTE_HOST_DEVICE int64_t position(const Problem& pr, int rank, int64_t j) {
  if (!pr.causal) return static_cast<int64_t>(rank) * pr.seq + j;
  const int64_t c = pr.seq / 2;
  return j < c ? rank * c + j : (2 * static_cast<int64_t>(pr.world) - 1 - rank) * c + (j - c);
}

// Key rows of source rank `src` that query row `qrow` of `rank` sees: a prefix [0, visible_keys), since positions
// grow with the local index on every rank (zigzag: chunk `src`, then the later chunk 2W - 1 - src). Rows past S_l
// (computed, never stored) are treated as the last row.
CUTE_HOST_DEVICE int64_t visible_keys(const Problem& pr, int rank, int src, int64_t qrow) {
  if (!pr.causal) return pr.seq;
  const int64_t q = position(pr, rank, cute::min(qrow, static_cast<int64_t>(pr.seq) - 1));
  const int64_t c = pr.seq / 2;
  const auto seen = [&](int64_t chunk) { return cute::max(int64_t(0), cute::min(c, q - chunk * c + 1)); };
  return seen(src) + seen(2 * static_cast<int64_t>(pr.world) - 1 - src);
}

// Key tiles of source rank `src` that some row of Q tile m (of rank `rank`) sees: a prefix [0, n_end).
CUTE_HOST_DEVICE int visible_tiles(const Problem& pr, int rank, int src, int m) {
  const int64_t keys = visible_keys(pr, rank, src, static_cast<int64_t>(m + 1) * kBlockM - 1);
  return static_cast<int>((keys + kBlockN - 1) / kBlockN);
}

// Whether query row `qrow` of `rank` does not see key row `kcol` of `src` (past S_l, or causal and later): the
// element form of visible_keys (the kernel masks whole rows with the count; tests/cpu/ring_layouts.cu checks both).
CUTE_HOST_DEVICE bool key_hidden(const Problem& pr, int rank, int src, int64_t qrow, int64_t kcol) {
  return kcol >= visible_keys(pr, rank, src, qrow);
}

// Whether some element of (Q tile m, key tile n of `src`) is hidden: key rows past S_l (the ragged last tile,
// zero-filled by TMA), or, causal, a key position after the tile's first query. Otherwise every element counts.
CUTE_HOST_DEVICE bool tile_needs_mask(const Problem& pr, int rank, int src, int m, int n) {
  const int64_t col0 = static_cast<int64_t>(n) * kBlockN;
  if (col0 + kBlockN > pr.seq) return true;
  const int64_t q_lo = position(pr, rank, static_cast<int64_t>(m) * kBlockM);
  return pr.causal && position(pr, src, col0 + kBlockN - 1) > q_lo;
}

__device__ __forceinline__ int source_of(const Problem& pr, int step) { return (pr.rank - step + pr.world) % pr.world; }
__device__ __forceinline__ int slot_of(const Problem& pr, int step) { return schedule::slot_of(step, pr.slots); }

struct WorkItem {
  int b, h, m;
};
// Item t of a step. Items are claimed in this order (a counter per step): (batch, head) pairs in groups of
// pr.order_group, and within a group Q tile by Q tile, the last tiles first. Small groups keep the K/V that the
// running blocks read at one time in L2 (with every head at once the H200 streamed 0.5-0.8 TB/s from DRAM at
// S_l = 32k, which costs clock under the power limit); under the causal mask the last Q tiles see the most keys,
// so within a group the longest items start first (LPT) and a group large enough ends the step on short items.
// Non-causal items are all alike: groups of one (head by head). run_typed picks the group.
CUTE_HOST_DEVICE WorkItem work_item(const Problem& pr, int t) {  // (host too: tests/cpu/ring_layouts.cu)
  const int bh_total = pr.batch * pr.heads_q;
  const int per_group = pr.order_group * pr.m_tiles;
  const int g0 = t / per_group * pr.order_group;           // first (batch, head) pair of the group
  const int size = cute::min(pr.order_group, bh_total - g0);  // the last group may be smaller
  t %= per_group;
  WorkItem w;
  w.m = pr.m_tiles - 1 - t / size;
  const int bh = g0 + t % size;
  w.h = bh % pr.heads_q;
  w.b = bh / pr.heads_q;
  return w;
}

// Accumulator (C) fragment of an SM90 wgmma, ((2, 2, N/8), M, N') per thread, seen as (rows, cols): the two
// rows a thread holds per 64-row atom are 8 apart; its columns come in pairs.
template <class Layout>
CUTE_HOST_DEVICE auto rowcol(Layout l) {  // (host too: tests/cpu/ring_layouts.cu checks it)
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
}

// The same fragment as the A operand of a 16-deep K step of the next wgmma (register-sourced): every two
// 8-column groups of the accumulator form one ((2, 2, 2)) A fragment.
template <class Layout>
CUTE_HOST_DEVICE auto as_a_operand(Layout l) {
  auto groups = logical_divide(get<0, 2>(l), Tile<_2>{});
  return make_layout(make_layout(get<0, 0>(l), get<0, 1>(l), get<0, 0>(groups)), get<1>(l),
                     coalesce(make_layout(get<0, 1>(groups), get<2>(l))));
}

// Issues C (+)= A B as one wgmma batch and commits it; the caller waits (warpgroup_wait<k>) and fences C (and a
// register-sourced A: the GEMM reads it until the wait).
template <class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void mma_issue(TiledMma& tiled_mma, const TA& a, const TB& b, TC& c, bool zero_init) {
  tiled_mma.accumulate_ = zero_init ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  CUTLASS_PRAGMA_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    cute::gemm(tiled_mma, a(_, _, kb), b(_, _, kb), c);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
}

// 2^x on the SFU (ex2.approx, flush-to-zero): exp2f without fast math adds range handling that the softmax does
// not need (its arguments are <= 0 or -inf, and 2^-inf = +0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

}  // namespace

}  // namespace tandem::kernels::attention
