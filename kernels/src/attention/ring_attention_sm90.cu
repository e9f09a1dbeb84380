// Ring attention as one persistent kernel (sm90a). ring_attention.h has the contract; docs/ring-attention.md the
// design. Files: ring_common.cuh (flow-control state, the core's types and layouts), ring_flow.cuh (slot release,
// producer, comm role), ring_consume.cuh (consumers: mainloop and merge), this file (the kernel, host adapter).
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
#include "ring_common.cuh"
#include "ring_consume.cuh"
#include "ring_flow.cuh"

namespace tandem::kernels::attention {

namespace {

using namespace cute;
using runtime::fail;

// ---------------------------------------------------------------------------------------------------------------
// The kernel.

template <class T>
__global__ void __launch_bounds__(kThreads, 1) ring_attention_kernel(const __grid_constant__ Params<T> p) {
  extern __shared__ __align__(1024) char smem_raw[];
  const uint64_t epoch = runtime::current_epoch(p.ctl);
  const Problem& pr = p.pr;
  // comm blocks first (1-D grid), then the attention blocks: the runtime's roles (runtime::dispatch_roles)
  runtime::dispatch_roles(
      pr.comm_blocks, true, [&](int) { comm_role(p, epoch); },
      [&] {
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
      });
  runtime::finish_block(p.ctl, gridDim.x, epoch, [] {});
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
  p.claimed = p.parties + kMaxWorld;
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

  if (cudaMemsetAsync(p.parties, 0, sizeof(uint64_t) * 2 * kMaxWorld, stream) != cudaSuccess)
    return fail(why, "cudaMemsetAsync failed", Status::kCudaError);
  if (stage) {  // the proxy reads what it sends from the heap: this rank's block goes to slot 0 first
    if (cudaMemcpyAsync(p.k_slots, a.k, o.block_bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess ||
        cudaMemcpyAsync(p.v_slots, a.v, o.block_bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess)
      return fail(why, "staging K/V failed", Status::kCudaError);
  }
  const int smem = static_cast<int>(sizeof(typename T::SharedStorage)) + 1024;
  auto kernel = ring_attention_kernel<T>;
  if (runtime::ensure_dynamic_smem(kernel, smem) != cudaSuccess)
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
  // the world first (the workspace layout depends on it); the dtype, pointers and workspace after the shape (the
  // workspace size needs a valid one): the runtime's common checks
  if (Status st = runtime::check_world(a.comm, why); st != Status::kOk) return st;
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
  if (Status st = runtime::check_launch_common(a.comm, a.dtype, {a.q, a.k, a.v, a.o, a.lse}, "q, k, v, o and lse",
                                                a.workspace, workspace_size(a), 256, why);
      st != Status::kOk)
    return st;
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
