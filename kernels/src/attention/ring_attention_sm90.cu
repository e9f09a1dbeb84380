// Ring attention as one persistent kernel (sm90a). ring_attention.h has the contract; docs/ring-attention.md the
// design. Layout of this file: flow-control state -> the attention core (CuTe: TMA, wgmma, online softmax) ->
// the comm role -> the kernel -> host adapter.
//
// Launch (epoch e, W ranks, rank r, N = kv_slots, G(i) = e W + i the global step number of step i):
//   host      (stream-ordered) zero this launch's step counters; with proxy peers, copy K/V into slot 0 (the
//             proxy reads by heap offset)
//   comm      blocks [0, nb). For step i < W - 1, comm block c owns the same byte range of the K and V blocks on
//             every rank:
//               i > 0: wait arrived[i mod N][c] >= G(i)   (the predecessor's range landed here)
//               wait released[(i+1) mod N] >= G(prev)     (the successor is done with what its slot held before)
//               put K, V range into the successor's slot (i+1) mod N, signal arrived[(i+1) mod N][c] = G(i+1)
//               (quiet with proxy peers: the proxy reads the slot), then count itself a party of step i
//             the last party of step i (every work item of step i computed or skipped, every comm block done
//             forwarding it) signals released[i mod N] = G(i) on the predecessor; nobody waits for that
//   attention blocks [nb, grid): the producer thread waits arrived[i mod N][*] >= G(i) once per step (i > 0), then
//             claims the step's (batch, head, 128-row Q tile) work items from claimed[i] one at a time (work_item:
//             (batch, head) groups, last Q tiles first), hands each to the consumers through a shared-memory queue
//             and TMA-loads Q and the visible K, V tiles (pipelines of their own); two consumer warpgroups compute
//             S = Q K^T, the online softmax, O += P V with FlashAttention-3's overlap (S_n and P_{n-1} V_{n-1}
//             in flight together, softmax of S_n under the PV GEMM; the warpgroups take turns issuing), wait
//             until the item's previous step is merged (merged[item] >= G(i-1): another block may have had it),
//             merge the step's (O_i, lse_i) into an fp32 accumulator (the last step writes O and LSE), publish
//             merged[item] = G(i) and count the item a party of step i. Blocks that never get an SM are not
//             needed: the running ones claim all the work (docs/ring-attention.md, "Blocks that are not resident").
//   end       the last block to finish completes the epoch (the next launch reads it)
// A slot written by the predecessor is read by this rank's TMA (async proxy): the producer fences the async
// proxy after its acquire of the arrival flag.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>

#include "../fused/tp_common.cuh"
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
using tp::detail::fail;
using tp::detail::last_of;

constexpr int kMaxWorldRing = 64;
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

struct alignas(128) RingControl {
  uint64_t epoch;
  uint64_t done_blocks;
  uint64_t pad0[14];
  uint64_t arrived[kMaxWorldRing][kMaxCommBlocks];  // [slot][c]: G of the step whose range c landed in the slot
  uint64_t released[kMaxWorldRing];                 // [slot]: G of the last step the successor finished with it
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
  tp::detail::WorkspaceCarver w{0};
  const auto take = [&](size_t bytes) { return w.take(bytes); };
  o.control = take(kRingControlBytes);
  o.counters = take(sizeof(uint64_t) * 2 * kMaxWorldRing);  // parties[W], claimed[W]: zeroed per launch
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

// ---------------------------------------------------------------------------------------------------------------
// Releasing a slot. Step i's slot may be rewritten by the predecessor once every attention block has computed on
// it and (i < W - 1) every comm block has forwarded it. Each of those parties counts itself once; the one that
// completes the count signals released[slot] = G(i) on the predecessor. Nobody waits for it: a comm block that
// waited for this rank's compute before forwarding the next step would delay the successor's next block by a
// whole step.
template <class T>
__device__ void release_if_last(const Params<T>& p, int step, uint64_t epoch) {
  const Problem& pr = p.pr;
  const uint64_t parties = static_cast<uint64_t>(pr.items) + (step < pr.world - 1 ? pr.comm_blocks : 0);
  if (tp::detail::atom_add_acq_rel_gpu(&p.parties[step], 1) + 1 != parties) return;
  (void)tandem::device::signal(p.comm, &p.ctl->released[slot_of(pr, step)],
                               schedule::global_step(epoch, pr.world, step),
                               tandem::device::SignalOp::kSet, (pr.rank - 1 + pr.world) % pr.world);
}

// ---------------------------------------------------------------------------------------------------------------
// Producer: one thread of warp 0 issues every TMA load of the block.

template <class T>
__device__ void produce(const Params<T>& p, typename T::SharedStorage& ss, typename T::PipelineQ& pipe_q,
                        typename T::PipelineKV& pipe_k, typename T::PipelineKV& pipe_v,
                        typename T::PipelineWork& pipe_work, uint64_t epoch) {
  using namespace tandem::device;
  const Problem& pr = p.pr;
  cutlass::PipelineState<kWorkStages> work_state = cutlass::make_producer_start_state<typename T::PipelineWork>();
  const auto hand_out = [&](int step, int item) {  // to the consumers, in claim order
    pipe_work.producer_acquire(work_state);
    ss.work[work_state.index()] = make_int2(step, item);
    pipe_work.producer_commit(work_state);
    ++work_state;
  };
  cutlass::PipelineState<kQStages> q_state = cutlass::make_producer_start_state<typename T::PipelineQ>();
  cutlass::PipelineState<kStages> k_state = cutlass::make_producer_start_state<typename T::PipelineKV>();
  cutlass::PipelineState<kStages> v_state = k_state;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutV{});
  const auto gshape = [&](int heads, int slots) {
    return make_shape(int32_t(pr.seq), int32_t(T::kHeadDim), int32_t(heads), int32_t(pr.batch), int32_t(slots));
  };
  Tensor mQ = p.tma_q.get_tma_tensor(gshape(pr.heads_q, 1));
  Tensor mKu = p.tma_k_user.get_tma_tensor(gshape(pr.heads_kv, 1));
  Tensor mVu = p.tma_v_user.get_tma_tensor(gshape(pr.heads_kv, 1));
  Tensor mKs = p.tma_k_slots.get_tma_tensor(gshape(pr.heads_kv, pr.slots > 0 ? pr.slots : 1));
  Tensor mVs = p.tma_v_slots.get_tma_tensor(gshape(pr.heads_kv, pr.slots > 0 ? pr.slots : 1));
  auto tma_q = p.tma_q.get_slice(0);
  auto tma_ku = p.tma_k_user.get_slice(0);
  auto tma_vu = p.tma_v_user.get_slice(0);
  auto tma_ks = p.tma_k_slots.get_slice(0);
  auto tma_vs = p.tma_v_slots.get_slice(0);

  for (int step = 0; step < pr.world; ++step) {
    const int src = source_of(pr, step);
    const bool from_user = step == 0 && pr.step0_slot < 0;
    const int slot = step == 0 ? (pr.step0_slot < 0 ? 0 : pr.step0_slot) : slot_of(pr, step);
    if (step > 0) {  // this step's block has landed (every comm block's range)
      Status st = Status::kOk;
      const uint64_t g = schedule::global_step(epoch, pr.world, step);
      for (int c = 0; c < pr.comm_blocks && st == Status::kOk; ++c)
        st = wait_until_backoff(p.comm, &p.ctl->arrived[slot][c], Cmp::kGe, g, kArrivalPollNs,
                                (pr.rank - 1 + pr.world) % pr.world);
      // A failed wait leaves the abort flag up; the loads still run (on stale data) so the block stays in step.
      asm volatile("fence.proxy.async.global;" ::: "memory");
    }
    // Claim the step's items one by one: the blocks that are running share the work, so the step completes (and
    // its slot is released) even when some blocks of the grid never got an SM (MPS ranks sharing one GPU, or any
    // other kernel holding SMs); a static share per block would wait for every block.
    for (;;) {
      const int t = static_cast<int>(atomicAdd(reinterpret_cast<unsigned long long*>(&p.claimed[step]), 1ull));
      if (t >= pr.items) break;
      const WorkItem w = work_item(pr, t);
      const int n_end = visible_tiles(pr, pr.rank, src, w.m);
      hand_out(step, t);
      if (n_end == 0) continue;
      const int hkv = w.h / pr.group;
      pipe_q.producer_acquire(q_state);
      Tensor gQ = local_tile(mQ(_, _, w.h, w.b, 0), Shape<Int<kBlockM>, Int<T::kHeadDim>>{}, make_coord(w.m, 0));
      copy(p.tma_q.with(*pipe_q.producer_get_barrier(q_state)), tma_q.partition_S(gQ),
           tma_q.partition_D(sQ(_, _, q_state.index())));
      ++q_state;
      // K_n then V_n: the consumers need K_n one GEMM before V_n
      for (int n = 0; n < n_end; ++n) {
        const auto tile = Shape<Int<kBlockN>, Int<T::kHeadDim>>{};
        pipe_k.producer_acquire(k_state);
        auto* k_bar = pipe_k.producer_get_barrier(k_state);
        if (from_user)
          copy(p.tma_k_user.with(*k_bar), tma_ku.partition_S(local_tile(mKu(_, _, hkv, w.b, 0), tile, make_coord(n, 0))),
               tma_ku.partition_D(sK(_, _, k_state.index())));
        else
          copy(p.tma_k_slots.with(*k_bar),
               tma_ks.partition_S(local_tile(mKs(_, _, hkv, w.b, slot), tile, make_coord(n, 0))),
               tma_ks.partition_D(sK(_, _, k_state.index())));
        ++k_state;
        pipe_v.producer_acquire(v_state);
        auto* v_bar = pipe_v.producer_get_barrier(v_state);
        if (from_user)
          copy(p.tma_v_user.with(*v_bar), tma_vu.partition_S(local_tile(mVu(_, _, hkv, w.b, 0), tile, make_coord(n, 0))),
               tma_vu.partition_D(sV(_, _, v_state.index())));
        else
          copy(p.tma_v_slots.with(*v_bar),
               tma_vs.partition_S(local_tile(mVs(_, _, hkv, w.b, slot), tile, make_coord(n, 0))),
               tma_vs.partition_D(sV(_, _, v_state.index())));
        ++v_state;
      }
    }
  }
  hand_out(-1, 0);
  pipe_q.producer_tail(q_state);
  pipe_k.producer_tail(k_state);
  pipe_v.producer_tail(v_state);
  pipe_work.producer_tail(work_state);
}

// ---------------------------------------------------------------------------------------------------------------
// Consumers: two warpgroups, 64 Q rows each.

template <class T>
__device__ void consume(const Params<T>& p, typename T::SharedStorage& ss, typename T::PipelineQ& pipe_q,
                        typename T::PipelineKV& pipe_k, typename T::PipelineKV& pipe_v,
                        typename T::PipelineWork& pipe_work, uint64_t epoch) {
  using Element = typename T::Element;
  using cutlass::arch::NamedBarrier;
  const Problem& pr = p.pr;
  const int tid = static_cast<int>(threadIdx.x) - 128;  // 0..255
  const int wg = tid / 128;                             // consumer warpgroup: rows [64 wg, 64 wg + 64) of a tile
  cutlass::PipelineState<kWorkStages> work_state;
  cutlass::PipelineState<kQStages> q_state;
  cutlass::PipelineState<kStages> k_state, v_state;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutVt{});
  typename T::MmaS mma_s;
  typename T::MmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_o = mma_o.get_thread_slice(tid);
  Tensor tSrQ = thr_s.partition_fragment_A(sQ);
  Tensor tSrK = thr_s.partition_fragment_B(sK);
  Tensor tOrV = thr_o.partition_fragment_B(sVt);
  // (row, col) of every accumulator element, for masks and the output
  Tensor cS = thr_s.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor cO = thr_o.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<T::kHeadDim>>{}));
  Tensor cS_rc = make_tensor(cS.data(), rowcol(cS.layout()));
  Tensor cO_rc = make_tensor(cO.data(), rowcol(cO.layout()));
  Tensor acc_o = partition_fragment_C(mma_o, Shape<Int<kBlockM>, Int<T::kHeadDim>>{});
  Tensor acc_s = partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor o_rc = make_tensor(acc_o.data(), rowcol(acc_o.layout()));
  Tensor s_rc = make_tensor(acc_s.data(), rowcol(acc_s.layout()));
  // P in the input precision, the A operand of O += P V. It has registers of its own: P_{n-1} is in flight in
  // the PV GEMM while S_n is computed and softmaxed in acc_s.
  Tensor p_reg = make_tensor<Element>(acc_s.layout());
  Tensor tOrP = make_tensor(p_reg.data(), as_a_operand(p_reg.layout()));
  constexpr int kRows = decltype(size<0>(o_rc))::value;  // rows a thread holds (2)
  static_assert(kRows == decltype(size<0>(s_rc))::value, "S and O rows must match");
  const float scale = pr.scale_log2;

  // Ping-pong: warpgroup g issues its GEMMs after the other one has issued its own (scheduler barrier g), then
  // lets the other go. Warpgroup 1 lets warpgroup 0 go first. Both issue the same number of rounds per item
  // (one per key tile: they share the item), so the turns never drift apart.
  const auto scheduler_wait = [&] {
    if constexpr (kPingPong) NamedBarrier::sync(kConsumerThreads, kSchedulerBarrier + wg);
  };
  const auto scheduler_pass = [&] {
    if constexpr (kPingPong) NamedBarrier::arrive(kConsumerThreads, kSchedulerBarrier + (1 - wg));
  };
  if constexpr (kPingPong) {
    if (wg == 1) NamedBarrier::arrive(kConsumerThreads, kSchedulerBarrier + 0);
  }

  for (;;) {
    pipe_work.consumer_wait(work_state);
    const int2 job = ss.work[work_state.index()];
    pipe_work.consumer_release(work_state);
    ++work_state;
    const int step = job.x, t = job.y;
    if (step < 0) break;
    const int src = source_of(pr, step);
    const bool first = step == 0, last = step == pr.world - 1;
    const WorkItem w = work_item(pr, t);
    const int n_end = visible_tiles(pr, pr.rank, src, w.m);
    const int64_t row0 = static_cast<int64_t>(w.m) * kBlockM;
    float row_max[kRows], row_sum[kRows], correction[kRows];
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.f, correction[r] = 1.f;
    // -inf where key tile n hides the key from the row (past S_l, or causal and later): the visible keys of a
    // row are a prefix, so one count per row and one compare per element.
    const auto mask = [&](int n) {
      if (!tile_needs_mask(pr, pr.rank, src, w.m, n)) return;
      const int64_t col0 = static_cast<int64_t>(n) * kBlockN;
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size<0>(s_rc); ++r) {
        const int64_t keys = visible_keys(pr, pr.rank, src, row0 + get<0>(cS_rc(r, 0))) - col0;
        const int limit = static_cast<int>(cute::max(int64_t(0), cute::min(int64_t(kBlockN), keys)));
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(s_rc); ++c)
          if (get<1>(cS_rc(r, c)) >= limit) s_rc(r, c) = -INFINITY;
      }
    };
    // Online softmax of S (base 2): p = 2^(s scale - max scale); correction[r] rescales what was accumulated
    // before this tile (applied to O later, when O is not in flight).
    const auto softmax = [&] {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size<0>(s_rc); ++r) {
        float mx = row_max[r];
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(s_rc); ++c) mx = fmaxf(mx, s_rc(r, c));
        mx = quad_max(mx);
        // a row that sees nothing yet keeps max -inf: use 0 so the exponentials are 0, not NaN
        const float base = mx == -INFINITY ? 0.f : mx * scale;
        correction[r] = fast_exp2(row_max[r] == -INFINITY ? -INFINITY : row_max[r] * scale - base);
        row_max[r] = mx;
        float sum = 0.f;
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(s_rc); ++c) {
          const float e = fast_exp2(s_rc(r, c) * scale - base);
          s_rc(r, c) = e;
          sum += e;
        }
        row_sum[r] = row_sum[r] * correction[r] + sum;  // quad-partial; reduced once at the end
      }
    };
    const auto rescale_o = [&] {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size<0>(o_rc); ++r) {
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(o_rc); ++c) o_rc(r, c) *= correction[r];
      }
    };
    const auto convert_p = [&] {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(acc_s); ++i) p_reg(i) = static_cast<Element>(acc_s(i));
    };
    if (n_end > 0) {
      // FlashAttention-3's intra-warpgroup overlap: iteration n issues S_n = Q K_n^T and O += P_{n-1} V_{n-1}
      // back to back, softmaxes S_n while the PV GEMM runs, then rescales O (once the GEMM is done with it).
      pipe_q.consumer_wait(q_state);
      const int qs = q_state.index();
      pipe_k.consumer_wait(k_state);
      scheduler_wait();
      mma_issue(mma_s, tSrQ(_, _, _, qs), tSrK(_, _, _, k_state.index()), acc_s, true);
      scheduler_pass();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s);
      pipe_k.consumer_release(k_state);
      ++k_state;
      mask(0);
      softmax();
      convert_p();
      for (int n = 1; n < n_end; ++n) {
        pipe_k.consumer_wait(k_state);
        scheduler_wait();
        mma_issue(mma_s, tSrQ(_, _, _, qs), tSrK(_, _, _, k_state.index()), acc_s, true);
        if (n > 1) rescale_o();  // O holds tiles < n - 1: bring it to tile n - 1's max before adding P_{n-1} V
        pipe_v.consumer_wait(v_state);
        warpgroup_fence_operand(p_reg);
        mma_issue(mma_o, tOrP, tOrV(_, _, _, v_state.index()), acc_o, n == 1);
        scheduler_pass();
        warpgroup_wait<1>();  // S_n
        warpgroup_fence_operand(acc_s);
        pipe_k.consumer_release(k_state);
        ++k_state;
        mask(n);
        softmax();
        warpgroup_wait<0>();  // O += P_{n-1} V_{n-1}
        warpgroup_fence_operand(acc_o);
        warpgroup_fence_operand(p_reg);
        pipe_v.consumer_release(v_state);
        ++v_state;
        convert_p();
      }
      pipe_q.consumer_release(q_state);
      ++q_state;
      if (n_end > 1) rescale_o();
      pipe_v.consumer_wait(v_state);
      warpgroup_fence_operand(p_reg);
      mma_issue(mma_o, tOrP, tOrV(_, _, _, v_state.index()), acc_o, n_end == 1);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
      warpgroup_fence_operand(p_reg);
      pipe_v.consumer_release(v_state);
      ++v_state;
    } else {  // nothing of the source's block is visible to the tile
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(acc_o); ++i) acc_o(i) = 0.f;
    }
    // The item's previous step may have been merged by another block (items are claimed anew every step): wait
    // for it. That block is running (it claimed the item), so the wait ends.
    if (!first) {
      if (tid == 0)
        (void)tandem::device::wait_until_backoff(p.comm, &p.merged[t], tandem::device::Cmp::kGe,
                                                 schedule::global_step(epoch, pr.world, step - 1), kMergePollNs,
                                                 pr.rank);  // a timeout leaves the abort flag up
      NamedBarrier::sync(kConsumerThreads, kItemBarrier);
    }
    // An invisible block changes nothing before the last step; the last step writes O and LSE in any case.
    if (n_end > 0 || last) {
      // This step's partial: O_i = acc / l, lse_i = max * scale + log2(l) (log2 units); -inf where nothing seen.
      float lse_step[kRows];
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const float l = quad_sum(row_sum[r]);
        lse_step[r] = l > 0.f ? row_max[r] * scale + log2f(l) : -INFINITY;
        const float inv = l > 0.f ? 1.f / l : 0.f;
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(o_rc); ++c) o_rc(r, c) *= inv;
      }
      // Merge with the running result and store (O_acc / lse_acc between steps; O / LSE at the last step). The
      // four threads holding a row all read its old lse before the one that writes it does (__syncwarp).
      float lse_old[kRows];
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int64_t row = row0 + get<0>(cO_rc(r, 0));
        lse_old[r] = -INFINITY;
        // L2 reads (ld.cg): another SM may have written the accumulators (its L1 is not coherent with ours)
        if (!first && row < pr.seq)
          lse_old[r] = __ldcg(p.lse_acc + (static_cast<size_t>(w.b) * pr.heads_q + w.h) * pr.seq + row);
      }
      __syncwarp();
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int64_t row = row0 + get<0>(cO_rc(r, 0));
        if (row >= pr.seq) continue;
        const size_t o_row = ((static_cast<size_t>(w.b) * pr.seq + row) * pr.heads_q + w.h) * T::kHeadDim;
        const size_t l_idx = (static_cast<size_t>(w.b) * pr.heads_q + w.h) * pr.seq + row;
        float w_old = 0.f, w_new = 1.f, lse_new = lse_step[r];
        if (!first) {
          const float mx = fmaxf(lse_old[r], lse_step[r]);
          if (mx == -INFINITY) {
            lse_new = -INFINITY, w_old = 0.f, w_new = 0.f;
          } else {
            lse_new = mx + log2f(exp2f(lse_old[r] - mx) + exp2f(lse_step[r] - mx));
            w_old = exp2f(lse_old[r] - lse_new);
            w_new = exp2f(lse_step[r] - lse_new);
          }
        }
        const bool writes_lse = get<1>(cO_rc(r, 0)) == 0;  // one of the four threads holding the row
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(o_rc); c += 2) {  // column pairs: 8-byte fp32 / 4-byte 16-bit accesses
          const int col = get<1>(cO_rc(r, c));
          float v0 = o_rc(r, c) * w_new, v1 = o_rc(r, c + 1) * w_new;
          if (!first) {
            const float2 old = __ldcg(reinterpret_cast<const float2*>(p.o_acc + o_row + col));
            v0 += old.x * w_old;
            v1 += old.y * w_old;
          }
          if (last) {
            Element out[2] = {static_cast<Element>(v0), static_cast<Element>(v1)};
            *reinterpret_cast<uint32_t*>(p.o + o_row + col) = *reinterpret_cast<const uint32_t*>(out);
          } else {
            *reinterpret_cast<float2*>(p.o_acc + o_row + col) = make_float2(v0, v1);
          }
        }
        if (writes_lse) {
          if (last) p.lse[l_idx] = lse_new * 0.69314718055994531f;  // log2 -> natural log
          else p.lse_acc[l_idx] = lse_new;
        }
      }
    }  // merge
    // Every consumer is done with the item: its K/V reads completed before they released the stages, its merge
    // is stored. Publish the merge (for the block that takes the item's next step) and count the item among the
    // step's parties; the last party releases the slot (release_if_last).
    NamedBarrier::sync(kConsumerThreads, kItemBarrier);
    if (tid == 0 && pr.world > 1) {
      __threadfence();
      tandem::device::local_publish(&p.merged[t], schedule::global_step(epoch, pr.world, step));
      release_if_last(p, step, epoch);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Comm role.

template <class T>
__device__ void comm_role(const Params<T>& p, uint64_t epoch) {
  using namespace tandem::device;
  const Problem& pr = p.pr;
  const int c = static_cast<int>(blockIdx.x);
  const int succ = (pr.rank + 1) % pr.world, pred = (pr.rank - 1 + pr.world) % pr.world;
  size_t lo, hi;
  tp::detail::split16(p.block_bytes, pr.comm_blocks, c, &lo, &hi);
  Status st = Status::kOk;
  for (int i = 0; i + 1 < pr.world; ++i) {  // the last step's block goes nowhere
    const uint64_t g = schedule::global_step(epoch, pr.world, i);
    const int slot = slot_of(pr, i), next = slot_of(pr, i + 1);
    if (threadIdx.x == 0) {
      if (i > 0) st = wait_until_backoff(p.comm, &p.ctl->arrived[slot][c], Cmp::kGe, g, kArrivalPollNs, pred);
      if (st == Status::kOk)
        st = wait_until_backoff(p.comm, &p.ctl->released[next], Cmp::kGe,
                                schedule::previous_use(epoch, pr.world, pr.slots, i + 1), kArrivalPollNs, succ);
    }
    if (!tp::detail::block_ok(st)) break;
    // step 0 without proxy peers forwards the user's K/V in place; otherwise the slot (slot 0: the staged copy)
    const bool user = i == 0 && pr.step0_slot < 0;
    const char* k_src = user ? p.k_user : p.k_slots + static_cast<size_t>(slot) * p.block_bytes;
    const char* v_src = user ? p.v_user : p.v_slots + static_cast<size_t>(slot) * p.block_bytes;
    char* k_dst = p.k_slots + static_cast<size_t>(next) * p.block_bytes;
    char* v_dst = p.v_slots + static_cast<size_t>(next) * p.block_bytes;
    st = put<Group::kBlock>(p.comm, k_dst + lo, k_src + lo, hi - lo, succ);
    if (st == Status::kOk)
      st = put_signal<Group::kBlock>(p.comm, v_dst + lo, v_src + lo, hi - lo, &p.ctl->arrived[next][c], g + 1,
                                     SignalOp::kSet, succ);
    __syncthreads();
    if (threadIdx.x == 0) {
      if (st == Status::kOk && tandem::device::has_proxy(p.comm)) st = quiet(p.comm);  // the proxy read our slot
      release_if_last(p, i, epoch);
    }
    if (!tp::detail::block_ok(st)) break;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The kernel.

template <class T>
__global__ void __launch_bounds__(kThreads, 1) ring_attention_kernel(const __grid_constant__ Params<T> p) {
  extern __shared__ __align__(1024) char smem_raw[];
  const uint64_t epoch = tandem::device::local_load(&p.ctl->epoch) + 1;
  const Problem& pr = p.pr;
  if (static_cast<int>(blockIdx.x) < pr.comm_blocks) {
    comm_role(p, epoch);
  } else {
    // 128-byte swizzled TMA tiles need 1024-byte aligned shared memory (the launch reserves the slack)
    const uintptr_t base = (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023);
    auto& ss = *reinterpret_cast<typename T::SharedStorage*>(base);
    const int warp = cutlass::canonical_warp_idx_sync();
    const int warp_group = warp / 4;
    const bool producer_thread = warp == 0 && cute::elect_one_sync();
    typename T::PipelineQ::Params pq;
    pq.transaction_bytes = T::kQBytes;
    pq.role = warp_group == 0 ? T::PipelineQ::ThreadCategory::Producer : T::PipelineQ::ThreadCategory::Consumer;
    pq.is_leader = producer_thread;
    pq.num_consumers = kConsumerThreads;
    typename T::PipelineKV::Params pkv;  // K and V alike
    pkv.transaction_bytes = T::kKVTileBytes;
    pkv.role = warp_group == 0 ? T::PipelineKV::ThreadCategory::Producer : T::PipelineKV::ThreadCategory::Consumer;
    pkv.is_leader = producer_thread;
    pkv.num_consumers = kConsumerThreads;
    typename T::PipelineWork::Params pw;
    pw.role = warp_group == 0 ? T::PipelineWork::ThreadCategory::Producer : T::PipelineWork::ThreadCategory::Consumer;
    pw.producer_arv_count = 1;
    pw.consumer_arv_count = kConsumerThreads;
    typename T::PipelineWork pipe_work(ss.pipe_work, pw);
    typename T::PipelineQ pipe_q(ss.pipe_q, pq, Shape<_1, _1, _1>{});
    typename T::PipelineKV pipe_k(ss.pipe_k, pkv, Shape<_1, _1, _1>{});
    typename T::PipelineKV pipe_v(ss.pipe_v, pkv, Shape<_1, _1, _1>{});
    if (warp == 0 && cute::elect_one_sync()) {
      cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.tma_k_user.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.tma_v_user.get_tma_descriptor());
      if (pr.slots > 0) {
        cute::prefetch_tma_descriptor(p.tma_k_slots.get_tma_descriptor());
        cute::prefetch_tma_descriptor(p.tma_v_slots.get_tma_descriptor());
      }
    }
    __syncthreads();  // barrier initialization visible to every thread
    if (warp_group == 0) {
      cutlass::arch::warpgroup_reg_dealloc<40>();
      if (warp == 0 && cute::elect_one_sync()) produce(p, ss, pipe_q, pipe_k, pipe_v, pipe_work, epoch);
    } else {
      cutlass::arch::warpgroup_reg_alloc<232>();
      consume(p, ss, pipe_q, pipe_k, pipe_v, pipe_work, epoch);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && last_of(&p.ctl->done_blocks, gridDim.x))
    tandem::device::local_store(&p.ctl->epoch, epoch);
}

// ---------------------------------------------------------------------------------------------------------------
// Host side.

template <class T>
typename T::GLayout global_layout(const RingShape& s, int heads, int slots) {
  const int64_t row = static_cast<int64_t>(heads) * s.head_dim;
  const int64_t batch = row * s.seq_local;
  return make_layout(make_shape(int32_t(s.seq_local), int32_t(s.head_dim), int32_t(heads), int32_t(s.batch),
                                int32_t(slots > 0 ? slots : 1)),
                     make_stride(row, _1{}, int64_t(s.head_dim), batch, batch * s.batch));
}

template <class T>
Status run_typed(const RingArgs& a, cudaStream_t stream, std::string* why) {
  using Element = typename T::Element;
  const RingShape& s = a.shape;
  const Offsets o = offsets_of(a);
  char* ws = static_cast<char*>(a.workspace);
  Params<T> p{};
  Problem& pr = p.pr;
  pr.batch = s.batch;
  pr.seq = s.seq_local;
  pr.heads_q = s.heads_q;
  pr.heads_kv = s.heads_kv;
  pr.group = s.heads_q / s.heads_kv;
  pr.world = a.comm.world;
  pr.rank = a.comm.rank;
  pr.slots = slots_of(a);
  pr.comm_blocks = comm_blocks_of(a);
  pr.causal = s.causal;
  const float scale = s.softmax_scale > 0.f ? s.softmax_scale : 1.f / std::sqrt(static_cast<float>(s.head_dim));
  pr.scale_log2 = scale * 1.4426950408889634f;
  pr.m_tiles = (s.seq_local + kBlockM - 1) / kBlockM;
  pr.items = static_cast<int>(items_of(s));
  pr.n_tiles = (s.seq_local + kBlockN - 1) / kBlockN;
  // Causal: enough (batch, head) pairs a group that a group's work is about 4 long items a block, so its LPT
  // order still balances the blocks; fewer pairs keep more of their K/V in L2 (work_item).
  const int pairs = s.batch * s.heads_q, attention_blocks = a.plan.sm_count - pr.comm_blocks;
  pr.order_group = s.causal ? std::min(pairs, std::max(1, (4 * attention_blocks + pr.m_tiles - 1) / pr.m_tiles)) : 1;
  const bool stage = pr.world > 1 && tandem::device::has_proxy(a.comm);
  pr.step0_slot = stage ? 0 : -1;
  p.comm = a.comm;
  p.ctl = reinterpret_cast<RingControl*>(ws + o.control);
  p.parties = reinterpret_cast<uint64_t*>(ws + o.counters);
  p.claimed = p.parties + kMaxWorldRing;
  p.merged = reinterpret_cast<uint64_t*>(ws + o.merged);
  p.k_user = static_cast<const char*>(a.k);
  p.v_user = static_cast<const char*>(a.v);
  p.k_slots = ws + o.k_slots;
  p.v_slots = ws + o.v_slots;
  p.block_bytes = o.block_bytes;
  p.o_acc = reinterpret_cast<float*>(ws + o.o_acc);
  p.lse_acc = reinterpret_cast<float*>(ws + o.lse_acc);
  p.o = static_cast<Element*>(a.o);
  p.lse = a.lse;

  const auto gtensor = [&](const void* ptr, int heads, int slots) {
    return make_tensor(make_gmem_ptr(static_cast<const Element*>(ptr)), global_layout<T>(s, heads, slots));
  };
  p.tma_q = make_tma_copy(SM90_TMA_LOAD{}, gtensor(a.q, s.heads_q, 1), take<0, 2>(typename T::SmemLayoutQ{}));
  const auto kv_tile = take<0, 2>(typename T::SmemLayoutK{});
  p.tma_k_user = make_tma_copy(SM90_TMA_LOAD{}, gtensor(a.k, s.heads_kv, 1), kv_tile);
  p.tma_v_user = make_tma_copy(SM90_TMA_LOAD{}, gtensor(a.v, s.heads_kv, 1), kv_tile);
  // without slots (world 1) the slot descriptors describe the user's K/V and are never used
  p.tma_k_slots = make_tma_copy(SM90_TMA_LOAD{}, gtensor(pr.slots > 0 ? p.k_slots : a.k, s.heads_kv, pr.slots),
                                kv_tile);
  p.tma_v_slots = make_tma_copy(SM90_TMA_LOAD{}, gtensor(pr.slots > 0 ? p.v_slots : a.v, s.heads_kv, pr.slots),
                                kv_tile);

  if (cudaMemsetAsync(p.parties, 0, sizeof(uint64_t) * 2 * kMaxWorldRing, stream) != cudaSuccess)
    return fail(why, "cudaMemsetAsync failed", Status::kCudaError);
  if (stage) {  // the proxy reads what it sends from the heap: this rank's block goes to slot 0 first
    if (cudaMemcpyAsync(p.k_slots, a.k, o.block_bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess ||
        cudaMemcpyAsync(p.v_slots, a.v, o.block_bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess)
      return fail(why, "staging K/V failed", Status::kCudaError);
  }
  const int smem = static_cast<int>(sizeof(typename T::SharedStorage)) + 1024;
  auto kernel = ring_attention_kernel<T>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
    return fail(why, "cannot reserve the kernel's shared memory", Status::kCudaError);
  kernel<<<a.plan.sm_count, kThreads, smem, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? Status::kOk
                            : fail(why, std::string("launch failed: ") + cudaGetErrorString(err), Status::kCudaError);
}

template <class Element>
Status dispatch_dim(const RingArgs& a, cudaStream_t stream, std::string* why) {
  if (a.shape.head_dim == 64) return run_typed<Traits<Element, 64>>(a, stream, why);
  return run_typed<Traits<Element, 128>>(a, stream, why);
}

}  // namespace

size_t workspace_size(const RingArgs& a) { return offsets_of(a).total; }

Status can_implement(const RingArgs& a, std::string* why) {
  const RingShape& s = a.shape;
  const int world = a.comm.world;
  if (world < 1 || world > kMaxWorldRing) return fail(why, "world size must be in [1, 64]");
  if (a.dtype != DType::kBF16 && a.dtype != DType::kFP16) return fail(why, "dtype must be bf16 or fp16");
  if (s.batch < 1 || s.seq_local < 1 || s.heads_q < 1 || s.heads_kv < 1)
    return fail(why, "batch, seq_local, heads_q and heads_kv must be positive");
  if (s.heads_q % s.heads_kv) return fail(why, "heads_kv must divide heads_q");
  if (s.head_dim != 64 && s.head_dim != 128) return fail(why, "head_dim must be 64 or 128");
  if (s.causal && s.seq_local % 2) return fail(why, "causal (zigzag) needs an even seq_local");
  if (s.softmax_scale < 0.f || !std::isfinite(s.softmax_scale))
    return fail(why, "softmax_scale must be >= 0 (0: 1/sqrt(d))");
  const int64_t rows = static_cast<int64_t>(s.batch) * s.seq_local;
  if (rows * s.heads_q > (int64_t(1) << 31) || static_cast<int64_t>(s.seq_local) > (int64_t(1) << 31) - kBlockM)
    return fail(why, "B * S_l * Hq must stay below 2^31");
  if (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.o == nullptr || a.lse == nullptr)
    return fail(why, "null pointer");
  const auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) != 0; };
  if (misaligned(a.q) || misaligned(a.k) || misaligned(a.v) || misaligned(a.o) || misaligned(a.lse))
    return fail(why, "q, k, v, o and lse must be 16-byte aligned");
  if (a.workspace == nullptr) return fail(why, "null workspace");
  if (reinterpret_cast<uintptr_t>(a.workspace) & 255u) return fail(why, "the workspace must be 256-byte aligned");
  const char* ws = static_cast<const char*>(a.workspace);
  if (ws < a.comm.heap_base || ws + workspace_size(a) > a.comm.heap_base + a.comm.heap_bytes)
    return fail(why, "the workspace must lie in the communicator's symmetric heap");
  const int nb = comm_blocks_of(a);
  if (nb > kMaxCommBlocks) return fail(why, "comm_blocks must be at most 8");
  if (world > 1 && (a.plan.kv_slots == 1 || a.plan.kv_slots < 0)) return fail(why, "kv_slots must be 0 or >= 2");
  if (a.plan.sm_count - nb < 1) return fail(why, "sm_count must leave at least one attention block");
  return Status::kOk;
}

Status run(const RingArgs& a, cudaStream_t stream, std::string* why) {
  if (Status st = can_implement(a, why); st != Status::kOk) return st;
  if (a.dtype == DType::kFP16) return dispatch_dim<cutlass::half_t>(a, stream, why);
  return dispatch_dim<cutlass::bfloat16_t>(a, stream, why);
}

cudaError_t preload_kernels() {
  cudaFuncAttributes attr{};
  const void* fs[] = {
      reinterpret_cast<const void*>(ring_attention_kernel<Traits<cutlass::bfloat16_t, 64>>),
      reinterpret_cast<const void*>(ring_attention_kernel<Traits<cutlass::bfloat16_t, 128>>),
      reinterpret_cast<const void*>(ring_attention_kernel<Traits<cutlass::half_t, 64>>),
      reinterpret_cast<const void*>(ring_attention_kernel<Traits<cutlass::half_t, 128>>),
  };
  for (const void* f : fs)
    if (const cudaError_t e = cudaFuncGetAttributes(&attr, f); e != cudaSuccess) return e;
  return cudaSuccess;
}

}  // namespace tandem::kernels::attention
