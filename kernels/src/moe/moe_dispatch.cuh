// MoE dispatch + grouped GEMM (sm90a), device side: the receive layout and the grouped GEMM's arrays, the
// dispatch role (rows to their experts' ranks, ordered by the flags of moe_sm90.cu's protocol), the fused
// dispatch + GEMM kernel, and the experts' GEMM alone (the unfused path).
#pragma once

#include <cooperative_groups.h>

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

// The dispatch, entered by every block of the launch. No block waits for a block that may not have an SM (MPS
// places a rank's grid partly: docs/fused-kernels.md, "Residency"): the first block to raise layout_claim to the
// epoch (it is running) waits for the peers, exchanges the counts and writes the layout; the others wait only for
// that (shapes_ready, local); the first `senders` blocks to join (whichever run first) claim chunks of sorted
// pairs until all are sent, the rest go on to the GEMM at once (fused). Returns whether this epoch's shapes and
// pointers are written and seen by this block (false after a failed wait: the block must not run the GEMM).
// arrivals_and_row_sources() finishes every block (after its GEMM, fused).
template <class Element>
__device__ bool dispatch_role(const DispatchParams<Element>& p, uint64_t e, int32_t* smem_i, int senders) {
  using namespace tandem::device;
  const Common& c = p.c;
  const DeviceComm& comm = c.comm;
  const int world = comm.world, rank = comm.rank, E = c.experts;
  Status st = Status::kOk;
  // two block-wide flags after base[] and seg[] in the dynamic shared memory (static __shared__ would add to the
  // fused kernel's, which the GEMM's stages fill up to the limit)
  int32_t* const flags = smem_i + 2 * (E + 1);
  if (threadIdx.x == 0)
    flags[0] = atomicMax(reinterpret_cast<unsigned long long*>(&c.ctl->layout_claim),
                         static_cast<unsigned long long>(e)) < e;
  __syncthreads();
  const bool elected = flags[0] != 0;
  if (elected) {
    // Every destination must be done with its buffers of e - 1 (counts, rows, row sources) before any of ours land.
    if (threadIdx.x == 0) {
      for (int q = 0; q < world && st == Status::kOk; ++q)
        st = wait_until_backoff(comm, &c.ctl->ready[q], Cmp::kGe, e - 1, c.wait_sleep_ns, q);
    }
    if (!block_ok(st)) return false;
    for (int q = 0; q < world && block_ok(st); ++q) {
      // dedup: this rank's unique-row counts too, before the count row's signal (which releases both)
      if (p.dedup)
        st = put<Group::kBlock>(comm, p.uniq_all + rank * world, p.uniq_count, sizeof(int32_t) * world, q);
      if (block_ok(st))
        st = put_signal<Group::kBlock>(comm, p.counts_all + rank * E, p.local_counts, sizeof(int32_t) * E,
                                       &c.ctl->counts_flag[rank], e, SignalOp::kSet, q);
    }
    if (threadIdx.x == 0) {
      for (int s = 0; s < world && st == Status::kOk; ++s)
        st = wait_until_backoff(comm, &c.ctl->counts_flag[s], Cmp::kGe, e, c.wait_sleep_ns, s);
    }
    if (!block_ok(st)) return false;
  }
  // Receive capacity guard (elected: from the count rows it acquired; the others read them after shapes_ready,
  // which the elected block publishes after acquiring them): more rows for some destination than its capacity
  // (moe.h: distinct experts per token; the same expert twice in a token's top-k, or max_tokens that differ
  // between ranks, can exceed it) would write past y, the layout and the heap buffers: then no rank sends
  // anything, every layout is empty, and the launch reports kInvalidArgument (peer: the destination, expected: its
  // capacity, observed: the rows) and completes.
  if (elected) {
    write_layout(p, e, capacity_overrun(c, p.counts_all, true));
  } else {
    if (threadIdx.x == 0) st = wait_until_backoff(comm, &c.ctl->shapes_ready, Cmp::kGe, e, 1000, rank);
    if (!block_ok(st)) return false;
  }
  p.timeline.stamp(1);  // (slot 2 is the scheduler's: a block's first GEMM tile)
  const bool overrun = capacity_overrun(c, p.counts_all, false);
  if (overrun) return true;  // the layout is empty, the GEMM has no tiles
  if (threadIdx.x == 0) flags[1] = static_cast<int32_t>(atomicAdd(&c.ctl->claims.join, 1u)) < senders;
  __syncthreads();
  if (!flags[1]) return true;  // enough senders joined before this block: straight to the GEMM
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
  const int lane = threadIdx.x % 32;
  const size_t row_bytes = static_cast<size_t>(c.hidden) * sizeof(Element);
  if (p.dedup) {
    // Each token once per destination: warps claim chunks of kSendChunk of this rank's unique (token, destination)
    // rows, destinations in the order r+1, r+2, ..., each destination's rows in its unique-index order, and put the
    // token's row into the destination's token buffer at r x max_tokens + u. The warp that completes a
    // destination's rows tells it (tok_arrive[r] = e); the pairs below then carry only their metadata.
    int32_t total_uniq = 0;
    for (int d = 0; d < world; ++d) total_uniq += p.uniq_count[d];
    int run_q = -1;
    int32_t run_n = 0;
    const auto flush_uniq = [&]() {
      if (run_n == 0) return;
      __syncwarp();  // every lane's row stores precede lane 0's release below
      if (lane == 0) {
        tandem::device::fence_system();
        atomicAdd(&c.ctl->claims.uniq_sent, static_cast<uint32_t>(run_n));
        const uint32_t done = atomicAdd(&p.tok_rows_done[run_q], static_cast<uint32_t>(run_n)) + run_n;
        if (done == static_cast<uint32_t>(p.uniq_count[run_q])) {  // this rank's last unique row for run_q
          tandem::device::fence_system();
          const Status s2 = signal(comm, &p.tok_arrive[rank], e, SignalOp::kSet, run_q);
          if (st == Status::kOk) st = s2;
        }
      }
      st = static_cast<Status>(__shfl_sync(0xffffffffu, static_cast<int>(st), 0));
      run_n = 0;
    };
    while (st == Status::kOk) {
      int32_t c0 = 0;
      if (lane == 0) c0 = static_cast<int32_t>(atomicAdd(&c.ctl->claims.uniq_claim, 1u)) * kSendChunk;
      c0 = __shfl_sync(0xffffffffu, c0, 0);
      if (c0 >= total_uniq) break;
      const int32_t c1 = min(total_uniq, c0 + kSendChunk);
      // (destination, index) of the chunk's first row: walk the rotated destinations
      int d = 0;
      int32_t before = 0;
      while (before + p.uniq_count[(rank + 1 + d) % world] <= c0) before += p.uniq_count[(rank + 1 + d++) % world];
      for (int32_t g = c0; g < c1 && st == Status::kOk; ++g) {
        while (g - before >= p.uniq_count[(rank + 1 + d) % world]) before += p.uniq_count[(rank + 1 + d++) % world];
        const int q = (rank + 1 + d) % world;
        const int32_t u = g - before;
        if (q != run_q) {
          flush_uniq();
          run_q = q;
        }
        const int t = p.uniq_token[static_cast<int64_t>(q) * p.max_tokens + u];
        const Status s2 = put<Group::kWarp>(
            comm, p.tok_buf + (static_cast<size_t>(rank) * p.max_tokens + u) * row_bytes,
            p.x + static_cast<size_t>(t) * row_bytes, row_bytes, q);
        st = static_cast<Status>(__shfl_sync(0xffffffffu, static_cast<int>(st == Status::kOk ? s2 : st), 0));
        ++run_n;
      }
      flush_uniq();
    }
    flush_uniq();
  }
  // Warps claim chunks of kSendChunk consecutive (rotated) sorted pairs, in order, so the pairs leave in expert
  // order across the whole dispatch and each expert's rows complete early, one after another, for the GEMM to start
  // on. Consecutive pairs of one expert in a chunk land in consecutive rows of one destination: their row sources
  // leave as one put, counted with one fence and one atomic per run (not per row).
  int run_x = -1;
  int32_t run_idx = 0, run_pos = 0, run_n = 0;
  const auto flush = [&]() {
    if (run_n == 0) return;
    __syncwarp();  // every lane's row stores precede lane 0's release below
    if (lane == 0) {
      const int q = run_x / c.el, j = run_x % c.el;
      Status s2 = put<Group::kThread>(comm, p.recv_src + run_pos, p.vals_sorted + run_idx, sizeof(int32_t) * run_n, q);
      if (st == Status::kOk) st = s2;
      if (p.dedup) {  // each row's place in the destination's token buffer (the row itself went once, above)
        s2 = put<Group::kThread>(comm, p.recv_fan + run_pos, p.fan_abs + run_idx, sizeof(int32_t) * run_n, q);
        if (st == Status::kOk) st = s2;
      }
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
  while (st == Status::kOk) {  // st is the warp's (broadcast after every put and flush): the loop exits together
    int32_t c0 = 0;
    if (lane == 0) c0 = static_cast<int32_t>(atomicAdd(&c.ctl->claims.send_claim, 1u)) * kSendChunk;
    c0 = __shfl_sync(0xffffffffu, c0, 0);
    if (c0 >= valid) break;
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
      if (!p.dedup) {  // (dedup: the token's row went once to the destination, above; only the metadata here)
        const int t = p.vals_sorted[idx] / c.topk;
        const Status s2 = put<Group::kWarp>(comm, p.recv_x + static_cast<size_t>(pos) * row_bytes,
                                            p.x + static_cast<size_t>(t) * row_bytes, row_bytes, x / c.el);
        // the warp's status (a group put may report on lane 0 only): every lane takes the same branch next
        st = static_cast<Status>(__shfl_sync(0xffffffffu, static_cast<int>(st == Status::kOk ? s2 : st), 0));
      }
      ++run_n;
    }
    flush();  // the chunk's last run: its expert may be complete now
  }
  flush();
  __syncthreads();
  p.timeline.stamp(3);  // senders only (tools/diag/moe_fused.py tells the roles apart by it)
  return true;  // a failed send left the abort flag up (the launch reports it); the GEMM still runs its tiles
}

// Every block at the end of the dispatch launch (fused: after its GEMM, which does not read them): wait until every
// row addressed to this rank has landed -- in the dispatch-alone launches the GEMM kernel (unfused) or the copy
// (dispatch only) after this kernel reads them all -- and copy this block's grid-stride share of the row sources out
// before ready[r] = e (the launch's end) lets the next epoch's senders overwrite them. The waits are on the peers'
// (and this rank's senders') flags only: no block of this grid is waited for. Nothing with an overrun (no rows).
// With dedup also every source's unique rows (tok_arrive), and this block's share of the fan-out: each received
// row copied from its token's row in the token buffer into its expert row.
template <class Element>
__device__ void arrivals_and_row_sources(const DispatchParams<Element>& p, uint64_t e, uint32_t block,
                                         uint32_t blocks) {
  using namespace tandem::device;
  const Common& c = p.c;
  const DeviceComm& comm = c.comm;
  const int world = comm.world, rank = comm.rank, E = c.experts;
  if (capacity_overrun(c, p.counts_all, false)) return;
  Status st = Status::kOk;
  if (threadIdx.x == 0) {
    for (int j = 0; j < c.el && st == Status::kOk; ++j) {
      for (int s = 0; s < world && st == Status::kOk; ++s) {
        if (p.counts_all[s * E + rank * c.el + j] == 0) continue;
        st = wait_until_backoff(comm, &p.arrive[j * world + s], Cmp::kGe, e, kArrivalPollNs, s);
      }
    }
  }
  // dedup: every source's unique rows too (the sources with none send no flag)
  if (p.dedup && threadIdx.x == 0) {
    for (int s = 0; s < world && st == Status::kOk; ++s) {
      if (p.uniq_all[s * world + rank] == 0) continue;
      st = wait_until_backoff(comm, &p.tok_arrive[s], Cmp::kGe, e, kArrivalPollNs, s);
    }
  }
  if (!block_ok(st)) return;
  p.timeline.stamp(4);
  int32_t received = 0;  // (from the counts: the elected block's layout writes are not ordered before this block)
  for (int j = 0; j < c.el; ++j)
    for (int s = 0; s < world; ++s) received += p.counts_all[s * E + rank * c.el + j];
  for (int32_t r = block * blockDim.x + threadIdx.x; r < received; r += blocks * blockDim.x)
    p.row_source[r] = p.recv_src[r];
  if (!p.dedup) return;
  // dedup: each received row from its token's copy in the token buffer (a warp a row, 16-byte vectors; the peers
  // wrote both this launch: L1-bypassing loads). The GEMM (unfused) or the copy (dispatch only) reads recv_x after
  // this kernel.
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int64_t vecs = static_cast<int64_t>(c.hidden) * sizeof(Element) / 16;
  for (int64_t r = static_cast<int64_t>(block) * warps + threadIdx.x / 32; r < received;
       r += static_cast<int64_t>(blocks) * warps) {
    const int32_t from = __ldcg(p.recv_fan + r);
    const uint4* src = reinterpret_cast<const uint4*>(p.tok_buf) + static_cast<int64_t>(from) * vecs;
    uint4* dst = reinterpret_cast<uint4*>(p.recv_x) + r * vecs;
    for (int64_t v = lane; v < vecs; v += 32) dst[v] = __ldcg(src + v);
  }
}

template <class Element>
__global__ void __launch_bounds__(Gg<Element>::Kernel::MaxThreadsPerBlock, 1)
    moe_dispatch_kernel(const __grid_constant__ DispatchParams<Element> p) {
  extern __shared__ __align__(128) char smem[];
  using namespace tandem::device;
  MoeControl* ctl = p.c.ctl;
  const uint64_t e = runtime::current_epoch(ctl);
  // Every block enters the dispatch (dispatch_role: the first p.senders blocks to join send, whichever run), then,
  // fused, the grouped GEMM over the whole grid, whose scheduler waits for each expert's rows from every source
  // before handing out its tiles; then every block waits for this rank's arrivals and copies its share of the row
  // sources. No block waits for a block that may not have an SM.
  const uint32_t total_blocks = gridDim.x * gridDim.y;
  if (p.late_us != 0 && runtime::grid_block_index() >= p.late_block) runtime::hold_block_us(p.late_us);  // tests
  p.timeline.stamp(0);
  bool shapes = dispatch_role(p, e, reinterpret_cast<int32_t*>(smem), p.senders);
  __syncthreads();  // the dispatch's shared memory is the GEMM's next
  if (p.gemm_role) {
    // Both blocks of a GEMM cluster run the GEMM or neither: one that ran it alone would wait forever for the
    // multicast half of B that its partner never loads (a failed wait returns false in one block of a pair, not
    // necessarily the other: the elected block never waits for shapes_ready). The partner is co-scheduled.
    int32_t* const mine = reinterpret_cast<int32_t*>(smem);
    if (threadIdx.x == 0) *mine = shapes ? 1 : 0;
    cute::cluster_sync();
    const int32_t other = *cooperative_groups::this_cluster().map_shared_rank(
        mine, static_cast<unsigned>(cute::block_rank_in_cluster() ^ 1u));
    cute::cluster_sync();  // both read before the GEMM overwrites the word
    shapes = shapes && other != 0;
  }
  if (p.gemm_role && shapes) {
    // the shapes and pointers of this epoch are written (dispatch_role waited for shapes_ready or wrote them)
    typename Gg<Element>::Kernel op;
    op(p.gemm, smem);
    __syncthreads();
  }
  arrivals_and_row_sources(p, e, runtime::grid_block_index(), total_blocks);
  p.timeline.stamp(5);
  moe_finish(p.c, total_blocks, e, p.gemm_role);
}

// The experts' GEMM alone (unfused: after the dispatch kernel, which waited for every row), in 2x1 clusters (G =
// Gg) or 1x1 (G = Gg1).
template <class Element, class G = Gg<Element>>
__global__ void __launch_bounds__(G::Kernel::MaxThreadsPerBlock, 1)
    moe_gemm_kernel(const __grid_constant__ typename G::Kernel::Params p) {
  extern __shared__ __align__(128) char smem[];
  typename G::Kernel op;
  op(p, smem);
}

}  // namespace

}  // namespace tandem::kernels::moe
