// MoE dispatch + grouped GEMM (sm90a), device side: the receive layout and the grouped GEMM's arrays, the
// dispatch role (rows to their experts' ranks, ordered by the flags of moe_sm90.cu's protocol), the fused
// dispatch + GEMM kernel, and the experts' GEMM alone (the unfused path).
#pragma once

#include "moe_common.cuh"

namespace tandem::kernels::moe {

namespace {

// Receive layout of this rank and the grouped GEMM's arrays (one block; E_l entries).
// empty: the launch overruns a receive capacity (capacity_overrun): every expert gets no rows (the GEMM has no
// tiles, the combine sends nothing).
template <class Element>
__device__ void write_layout(const DispatchParams<Element>& p, uint64_t e, bool empty) {
  const Common& c = p.c;
  const int world = c.comm.world, rank = c.comm.rank;
  if (threadIdx.x == 0) {
    int32_t off = 0;
    for (int j = 0; j < c.el; ++j) {
      const int x = rank * c.el + j;
      int32_t m = 0;
      p.expert_offset[j] = off;
      for (int s = 0; s < world; ++s) {
        p.source_offset[j * (world + 1) + s] = m;
        if (!empty) m += p.counts_all[s * c.experts + x];
      }
      p.source_offset[j * (world + 1) + world] = m;
      p.expert_rows[j] = m;
      off += m;
    }
    p.expert_offset[c.el] = off;
    *p.received = off;
  }
  __syncthreads();
  using G = Gg<Element>;
  for (int j = threadIdx.x; j < c.el; j += blockDim.x) {
    const int32_t off = p.expert_offset[j];
    p.arrays.shapes[j] = typename G::Shape3{p.expert_rows[j], c.inter, c.hidden};
    p.arrays.a[j] = reinterpret_cast<const Element*>(p.recv_x) + static_cast<size_t>(off) * c.hidden;
    p.arrays.b[j] = p.w + static_cast<size_t>(j) * c.hidden * c.inter;
    p.arrays.d[j] = reinterpret_cast<Element*>(p.y) + static_cast<size_t>(off) * c.inter;
    p.arrays.da[j] = cute::make_stride(int64_t(c.hidden), cute::Int<1>{}, cute::Int<0>{});
    p.arrays.db[j] = cute::make_stride(cute::Int<1>{}, int64_t(c.inter), cute::Int<0>{});
    p.arrays.dd[j] = cute::make_stride(int64_t(c.inter), cute::Int<1>{}, cute::Int<0>{});
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    tandem::device::local_publish(&c.ctl->shapes_ready, e);
  }
}

template <class Element>
__device__ void dispatch_role(const DispatchParams<Element>& p, int db, uint64_t e, int32_t* smem_i) {
  using namespace tandem::device;
  const Common& c = p.c;
  const DeviceComm& comm = c.comm;
  const int world = comm.world, rank = comm.rank, E = c.experts;
  Status st = Status::kOk;
  // Every destination must be done with its buffers of e - 1 (counts, rows, row sources) before any of ours land.
  if (threadIdx.x == 0) {
    for (int q = 0; q < world && st == Status::kOk; ++q) st = wait_until_backoff(comm, &c.ctl->ready[q], Cmp::kGe, e - 1, c.wait_sleep_ns, q);
  }
  if (!block_ok(st)) return;
  p.timeline.stamp(1);
  if (db == 0) {
    __syncthreads();
    for (int q = 0; q < world && block_ok(st); ++q)
      st = put_signal<Group::kBlock>(comm, p.counts_all + rank * E, p.local_counts, sizeof(int32_t) * E,
                                     &c.ctl->counts_flag[rank], e, SignalOp::kSet, q);
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < world && st == Status::kOk; ++s)
      st = wait_until_backoff(comm, &c.ctl->counts_flag[s], Cmp::kGe, e, c.wait_sleep_ns, s);
  }
  if (!block_ok(st)) return;
  p.timeline.stamp(2);
  // Receive capacity guard: rows that every destination would receive, from the count rows every rank now holds
  // (the same on every rank). More than the capacity (moe.h: distinct experts per token; the same expert twice in
  // a token's top-k, or max_tokens that differ between ranks, can exceed it) would write past y, the layout and
  // the heap buffers: then no rank sends anything, every layout is empty, and the launch reports
  // kInvalidArgument (peer: the destination, expected: its capacity, observed: the rows) and completes.
  const bool overrun = capacity_overrun(c, p.counts_all, db == 0);
  if (db == 0) write_layout(p, e, overrun);
  if (overrun) return;
  // Where this rank's rows of every expert go: base[x] = x's offset on its rank + the rows of sources before us;
  // seg[x] = where x's pairs start in the sorted list.
  int32_t* base = smem_i;
  int32_t* seg = smem_i + E + 1;
  for (int x = threadIdx.x; x < E; x += blockDim.x) {
    int32_t before = 0;
    for (int s = 0; s < rank; ++s) before += p.counts_all[s * E + x];
    base[x] = before;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t pos = 0;
    for (int x = 0; x < E; ++x) {
      seg[x] = pos;
      pos += p.local_counts[x];
    }
    seg[E] = pos;
  }
  // Expert offsets on each destination: one thread per destination rank.
  for (int q = threadIdx.x; q < world; q += blockDim.x) {
    int32_t off = 0;
    for (int j = 0; j < c.el; ++j) {
      const int x = q * c.el + j;
      base[x] += off;
      int32_t m = 0;
      for (int s = 0; s < world; ++s) m += p.counts_all[s * E + x];
      off += m;
    }
  }
  __syncthreads();
  const int32_t valid = seg[E];
  const int32_t rot = seg[((rank + 1) % world) * c.el];  // start with the next rank's experts
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t row_bytes = static_cast<size_t>(c.hidden) * sizeof(Element);
  // Warps take chunks of kSendChunk consecutive (rotated) sorted pairs round-robin, so the pairs leave in
  // expert order across the whole dispatch and each expert's rows complete early, one after another, for the
  // GEMM to start on (a contiguous share per warp would complete every expert only near the end). Consecutive
  // pairs of one expert in a chunk land in consecutive rows of one destination: their row sources leave as one
  // put, counted with one fence and one atomic per run (not per row).
  const int total_warps = p.dispatch_blocks * warps;
  const int global_warp = db * warps + warp;
  int run_x = -1;
  int32_t run_idx = 0, run_pos = 0, run_n = 0;
  const auto flush = [&]() {
    if (run_n == 0) return;
    __syncwarp();  // every lane's row stores precede lane 0's release below
    if (lane == 0) {
      const int q = run_x / c.el, j = run_x % c.el;
      Status s2 = put<Group::kThread>(comm, p.recv_src + run_pos, p.vals_sorted + run_idx, sizeof(int32_t) * run_n, q);
      if (st == Status::kOk) st = s2;
      tandem::device::fence_system();
      const uint32_t done = atomicAdd(&p.rows_done[run_x], static_cast<uint32_t>(run_n)) + run_n;
      if (done == static_cast<uint32_t>(p.local_counts[run_x])) {  // the last rows of expert x from this rank
        tandem::device::fence_system();
        s2 = signal(comm, &p.arrive[j * world + rank], e, SignalOp::kSet, q);
        if (st == Status::kOk) st = s2;
      }
    }
    st = static_cast<Status>(__shfl_sync(0xffffffffu, static_cast<int>(st), 0));
    run_n = 0;
  };
  for (int32_t c0 = global_warp * kSendChunk; c0 < valid && st == Status::kOk;
       c0 += static_cast<int32_t>(total_warps) * kSendChunk) {
    const int32_t c1 = min(valid, c0 + kSendChunk);
    for (int32_t i = c0; i < c1 && st == Status::kOk; ++i) {
      int32_t idx = i + rot;
      if (idx >= valid) idx -= valid;
      const int x = p.keys_sorted[idx];
      const int32_t pos = base[x] + (idx - seg[x]);
      if (x != run_x || idx != run_idx + run_n) {
        flush();
        run_x = x, run_idx = idx, run_pos = pos;
      }
      const int t = p.vals_sorted[idx] / c.topk;
      const Status s2 = put<Group::kWarp>(comm, p.recv_x + static_cast<size_t>(pos) * row_bytes,
                                          p.x + static_cast<size_t>(t) * row_bytes, row_bytes, x / c.el);
      if (st == Status::kOk) st = s2;
      ++run_n;
    }
    flush();  // the chunk's last run: its expert may be complete now
  }
  flush();
  __syncthreads();
  p.timeline.stamp(3);
  // Every row addressed to this rank has landed: the GEMM (unfused: launched next) may read them all, and the
  // row sources are copied out before ready[r] = e lets the next epoch's senders overwrite them.
  if (threadIdx.x == 0) {
    for (int j = 0; j < c.el && st == Status::kOk; ++j) {
      for (int s = 0; s < world && st == Status::kOk; ++s) {
        if (p.counts_all[s * E + rank * c.el + j] == 0) continue;
        st = wait_until_backoff(comm, &p.arrive[j * world + s], Cmp::kGe, e, kArrivalPollNs, s);
      }
    }
  }
  if (!block_ok(st)) return;
  p.timeline.stamp(4);
  int32_t received = 0;  // (from the counts: block 0's layout writes are not ordered before this block)
  for (int j = 0; j < c.el; ++j)
    for (int s = 0; s < world; ++s) received += p.counts_all[s * E + rank * c.el + j];
  for (int32_t r = db * blockDim.x + threadIdx.x; r < received; r += p.dispatch_blocks * blockDim.x)
    p.row_source[r] = p.recv_src[r];
}

template <class Element>
__global__ void __launch_bounds__(Gg<Element>::Kernel::MaxThreadsPerBlock, 1)
    moe_dispatch_kernel(const __grid_constant__ DispatchParams<Element> p) {
  extern __shared__ __align__(128) char smem[];
  using namespace tandem::device;
  MoeControl* ctl = p.c.ctl;
  const uint64_t e = runtime::current_epoch(ctl);
  // the runtime's roles over the grid (inline, as GEMM+RS: persistent.cuh): blocks [0, dispatch_blocks) in grid
  // order dispatch -- the first rows of the kClusterX-wide grid -- as dispatch block grid_block_index(); the rest
  // (fused) run the GEMM
  const bool gemm_block = runtime::is_compute_block(p.dispatch_blocks, p.gemm_role);
  p.timeline.stamp(0);
  if (gemm_block) {
    Status st = Status::kOk;
    // shapes and pointers of this epoch (written by dispatch block 0)
    if (threadIdx.x == 0) st = wait_until_backoff(p.c.comm, &ctl->shapes_ready, Cmp::kGe, e, 1000, p.c.comm.rank);
    if (block_ok(st)) {
      p.timeline.stamp(1);
      typename Gg<Element>::Kernel op;
      op(p.gemm, smem);
    }
    __syncthreads();
    p.timeline.stamp(4);
  } else {
    dispatch_role(p, runtime::grid_block_index(), e, reinterpret_cast<int32_t*>(smem));
    __syncthreads();
  }
  p.timeline.stamp(5);
  moe_finish(p.c, static_cast<uint64_t>(gridDim.x) * gridDim.y, e, p.gemm_role);
}

// The experts' GEMM alone (unfused: after the dispatch kernel, which waited for every row).
template <class Element>
__global__ void __launch_bounds__(Gg<Element>::Kernel::MaxThreadsPerBlock, 1)
    moe_gemm_kernel(const __grid_constant__ typename Gg<Element>::Kernel::Params p) {
  extern __shared__ __align__(128) char smem[];
  typename Gg<Element>::Kernel op;
  op(p, smem);
}

}  // namespace

}  // namespace tandem::kernels::moe
