// Ring attention (sm90a), flow control: releasing a K/V slot to the predecessor, the producer (every TMA load of
// a block: claims work items, waits for a step's arrival), and the comm role (forwards K/V to the successor).
// The protocol is the one at the top of ring_attention_sm90.cu.
#pragma once

#include "ring_common.cuh"

namespace tandem::kernels::attention {

namespace {

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
  if (runtime::atom_add_acq_rel_gpu(&p.parties[step], 1) + 1 != parties) return;
  (void)tandem::device::signal(p.comm, &p.ctl->released[slot_of(pr, step)],
                               schedule::global_step(epoch, pr.world, step),
                               tandem::device::SignalOp::kSet, (pr.rank - 1 + pr.world) % pr.world);
}

// ---------------------------------------------------------------------------------------------------------------
// A work item between steps. Items are claimed anew every step, so step i of an item may run on another block than
// step i - 1, whose merge of (O, lse) it builds on.

// Before merging step `step` (> 0) of item t: wait until step - 1's merge is stored. That block is running (it
// claimed the item), so the wait ends; a timeout leaves the abort flag up. All consumer threads leave together.
template <class T>
__device__ __forceinline__ void wait_for_previous_merge(const Params<T>& p, int t, int step, uint64_t epoch, int tid) {
  using cutlass::arch::NamedBarrier;
  const Problem& pr = p.pr;
  if (tid == 0)
    (void)tandem::device::wait_until_backoff(p.comm, &p.merged[t], tandem::device::Cmp::kGe,
                                             schedule::global_step(epoch, pr.world, step - 1), kMergePollNs, pr.rank);
  NamedBarrier::sync(kConsumerThreads, kItemBarrier);
}

// After the item's step: every consumer is done with it (its K/V reads completed before they released the stages,
// its merge is stored). Publish the merge (for the block that takes the item's next step) and count the item among
// the step's parties; the last party releases the slot (release_if_last). World 1 publishes nothing (one step, no
// slot), so its warpgroups do not meet here: a barrier at every item's end would realign the two ping-pong
// warpgroups item by item (one waits out the other's last PV GEMM), which short causal items pay on every item.
template <class T>
__device__ __forceinline__ void finish_item(const Params<T>& p, int t, int step, uint64_t epoch, int tid) {
  using cutlass::arch::NamedBarrier;
  const Problem& pr = p.pr;
  if (pr.world == 1) return;
  NamedBarrier::sync(kConsumerThreads, kItemBarrier);
  if (tid == 0) {
    __threadfence();
    tandem::device::local_publish(&p.merged[t], schedule::global_step(epoch, pr.world, step));
    release_if_last(p, step, epoch);
  }
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
// Comm role.

template <class T>
__device__ void comm_role(const Params<T>& p, uint64_t epoch) {
  using namespace tandem::device;
  const Problem& pr = p.pr;
  const int c = static_cast<int>(blockIdx.x);
  const int succ = (pr.rank + 1) % pr.world, pred = (pr.rank - 1 + pr.world) % pr.world;
  size_t lo, hi;
  runtime::split16(p.block_bytes, pr.comm_blocks, c, &lo, &hi);
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
    if (!runtime::block_ok(st)) break;
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
    if (!runtime::block_ok(st)) break;
  }
}

}  // namespace

}  // namespace tandem::kernels::attention
