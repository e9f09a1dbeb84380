// GEMM+ReduceScatter as one persistent kernel (sm90a): GEMM blocks compute the partial product chunk by chunk in
// the order the owners need them, reduce blocks beside them add up this rank's rows from every rank in a fixed
// order. tp_gemm.h has the contract, tp_common.cuh the epoch protocol; gemm_rs_common.cuh the parameters and the
// completion flags, gemm_rs_reduce.cuh the reduce roles; this file the kernel and the host adapter.
//
// Per launch (epoch e), on rank r with W ranks; chunk o = rows [o M/W, (o+1) M/W), owned by rank o:
//   GEMM     for s = 0 .. W-1, o = r+1+s: wait ready[o] >= e - 1 (o no longer reads r's partial of e - 1),
//            compute partial[chunk o] = A[chunk o] @ B into r's own heap, wait for the TMA stores, and the
//            last GEMM block to finish chunk o sets arrive[r] = e on o
//   reduce   for s = 0 .. W-1, source q = r-1-s (the order the chunks are produced): wait arrive[q] >= e on
//            this rank, read q's partial of chunk r through its peer mapping, add in fp32
//            (acc = p[r-1]; acc += p[r-2]; ...; out = acc + p[r]): deterministic, the same order every launch
//   end      the last block sets ready[r] = e on every rank (r finished reading their partials)
//
// Ring (TANDEM_RS_RING=1, off by default; RS and two-shot AR, one node, whole chunks, tile claims only; tested on an
// H100 2026-12-07, faster than the default fused kernel at worlds 3-4, not than unfused: docs/fused-kernels.md):
// no reduce role, every SM computes.
// At step s = 0 .. W-1 rank r computes chunk o = r+1+s (mod W) and its GEMM epilogue adds the running sum of the
// same chunk that its right neighbour r+1 stored at step s-1 (CUTLASS's source C, TMA-loaded from r+1's heap;
// beta = 1, none at s = 0): D_s = A[o] @ B + D_{s-1}(r+1), rounded to the element type, stored into r's slot s of
// its partial buffer, or at s = W-1 (o = r) into out. Flags: the block whose stores complete step s < W-1 (the
// block whose claimed tiles bring the step's count to its total) sets ring_step[s] = e on the left neighbour
// (r-1), whose step s+1 waits for it; before step 0 every
// block waits ready[q] >= e - 1 from every q (r-1 finished reading r's slots of e - 1, and so did the owners if
// the previous launch was the default kernel), and the launch's last block waits ready[q] >= e from every q (a
// default launch next waits only for each chunk's owner, not for r-1). The reduction's adds sit in the
// epilogues, spread over every SM, where the reduce role had a few blocks (2026-12-06: 15-37 GB/s a reduce block
// under the GEMM's traffic). Sum order for chunk o: p[o-1], + p[o-2], ..., + p[o], rounded after every add (the
// pipelined mode's order and rounding: cuBLAS with beta = 1; a ring reduce-scatter that sums in the element type,
// as NCCL's does for bf16), so deterministic and the pipelined mode's bits, not the fp32-sum path's.
// AR: the last step stores into slot W-1 (no ring slot) and the block completing it sets reduced[r] = e on every rank; then
// every block copies its slice of each rank's slot W-1 (own first) into out rows of that chunk.
// Tile claims only (TANDEM_TP_CLAIM=0 falls back to the default kernel): with the static persistent stride a step
// completes only when every block of the grid has run it, and blocks that finished wait (for the neighbour's next
// step, for reduced[]) on their SMs; under MPS a rank's grid is often not resident at once, its late blocks would
// need those SMs, and the ring would stall until the timeout. With claims the resident clusters take every tile.
//
// Tickets (TANDEM_RS_TICKET=1, off by default until measured; RS and two-shot AR, one node, 2-8 ranks, 128x256
// tiles with tile claims): no reduce role and no wait inside the GEMM. Every SM computes; rank r computes the chunks
// o = r+1, r+2, ..., r (one call each) and, per output tile, the scheduler's fixup (ticket_scheduler.hpp) stores
// the tile's partial into r's slot, draws a ticket at o, and the rank drawing the W-th ticket adds all W partials
// (rank order, fp32, each partial rounded to the element type first, one final rounding: deterministic whoever
// reduces) into o's output rows when it is o itself (o computes its own chunk last, so it is nearly always the last
// arriver; AR: into o's staging too), else into o's staging rows, flagging the tile there; the thread completing
// o's count of reduced tiles signals reduced[o] = e (RS: to o; AR: to every rank). So a tile is reduced where its
// last partial lands, and a rank that MPS started late or that runs slow only makes the others do more of the
// reducing. Per launch (epoch e) on rank r:
//   start    wait ready[q] >= e - 1 from every q (q's last arrivers finished reading r's slots of e - 1, and q's
//            end finished reading the staging this launch overwrites)
//   GEMM     W calls, tickets in the fixups (no waits); in P rounds (TANDEM_RS_TICKET_ROUNDS) W x P calls, round j
//            the pieces j of the chunks in the same order, so the owner reduces its own pieces in every round
//   end      wait reduced[r] >= e, copy the flagged tiles of r's staging (those another rank reduced) into out;
//            AR: then for every other q wait reduced[q] >= e and copy q's staging (peer mapping) into out rows of
//            chunk q. Only the last blocks to get here wait; the others copy what is ready and leave.
//   finish   the last block sets ready[r] = e on every rank
// Its workspace is its own (tp.py keys it apart): the tickets and the count are zero between its launches only.
//
// The unfused path: wait kernel (ready[o] >= e - 1 from every o), the plain GEMM into the partial buffer, then
// this kernel without the GEMM role, whose first block announces arrive[r] = e to every owner and whose last
// block waits until every owner has read r's partial.
//
// GEMM+AllReduce (two-shot: the reduce-scatter above, then an all-gather of the reduced rows) is the same kernel
// with an all-gather phase: the last reduce step writes the reduced rows into the partial buffer's own chunk r
// (symmetric: nobody else reads that chunk) and into out rows r; the last reduce block sets reduced[r] = e on
// every rank; then every reduce block copies its slice of each peer's reduced chunk q (after reduced[q] >= e)
// into out rows q. Every rank's out holds the owners' bytes: bit-identical across ranks. Before a launch
// overwrites chunk r of its partial (computed last), its GEMM waits ready[q] >= e - 1 from every q (everyone
// finished reading r's reduced rows of e - 1).
//
// Across nodes (N nodes of L consecutive ranks, rank r = (n, l); N = 1 is all of the above). Chunk o = (n_o, l_o)
// is reduced in two levels, each chunk crossing the network once per node:
//   order    the GEMM computes the chunks of the other nodes first (node n+1, n+2, ...; local index 0 .. L-1, so
//            the ranks of a node finish the same chunk together), then its own node's (l+1, l+2, ..., l)
//   node     chunk o of a node other than n_o is reduced on node n by its representative (n, l_o): the GEMM
//            tells it node_arrive[n_o L + l_q] = e; it adds the L local partials (j = 0 .. L-1, fp32), rounds,
//            writes the node partial over its own partial of chunk o and puts slice rb to the owner's recv slot
//            n through the proxy, signalling partial_in[n][rb] = e there
//   owner    acc = node partials of nodes n-1, n-2, ... (each rounded once), then its own node's partials
//            (l-1, l-2, ..., l) as in the one-node order; fp32, one final rounding
//   AR       the owner writes its reduced rows into its own partial chunk (as above) and puts slice rb to the
//            representative of every other node (its own partial chunk o, free by then; reduced_in[n_o][rb]);
//            that rank copies it out and tells its node (forwarded[o][rb] = e), whose ranks read it there
// Flow control is the one-node rule carried through the chain: a buffer of epoch e - 1 is overwritten only
// after ready[] of the ranks that read it, directly or through the owner (who reads the node partial only after
// its representative read the local partials). The one-shot all-reduce is one node only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gemm_rs_common.cuh"
#include "gemm_rs_reduce.cuh"
#include "tandem/kernels/gemm/ticket_scheduler.hpp"
#include "tp_gemm_configs.hpp"

namespace tandem::kernels::tp {

namespace {

using namespace detail;

// The ring's steps (protocol at the top of this file): every block of the grid is a GEMM block.
template <class Element, class GemmKernel>
__device__ __forceinline__ void run_ring_steps(const RsParams<GemmKernel>& p, char* smem, uint64_t e) {
  using namespace tandem::device;
  Control* ctl = p.ctl;
  const DeviceComm& comm = p.comm;
  const int rank = comm.rank, world = comm.world;
  const int left = (rank + world - 1) % world, right = (rank + 1) % world;
  Status st = Status::kOk;
  // r-1 reads r's slots during its steps: they are free once r-1 finished the previous launch. Every rank, not only
  // r-1: the previous launch on this workspace may have been the default kernel, whose owners read r's chunks
  // (slot s is chunk s's bytes).
  for (int q = 0; q < world && threadIdx.x == 0 && st == Status::kOk; ++q)
    st = wait_until_backoff(comm, &ctl->ready[q], Cmp::kGe, e - 1, kRolePollNs, q);
  // (tests, TANDEM_TP_LATE: clusters from grid row late_cluster start late_us late, as clusters MPS made resident late)
  if (p.late_us != 0 && static_cast<int>(blockIdx.y) >= p.late_cluster) runtime::hold_block_us(p.late_us);
  for (int s = 0; s < world; ++s) {
    // the right neighbour's sum of step s - 1 is stored (its stores completed before its release)
    if (s > 0 && threadIdx.x == 0 && st == Status::kOk)
      st = wait_until_backoff(comm, &ctl->ring_step[s - 1], Cmp::kGe, e, kRolePollNs, right);
    // A failed wait leaves the abort flag up; the step is still computed so that every block stays in step.
    __syncthreads();
    // the epilogue's TMA loads of that sum go through the async proxy (whichever warp issues them)
    asm volatile("fence.proxy.async.global;" ::: "memory");
    p.timeline.stamp(1 + 3 * s);
    GemmKernel op;
    op(p.gemm[s], smem);
    p.timeline.stamp(2 + 3 * s);
    complete_bulk_stores();
    __syncthreads();
    p.timeline.stamp(3 + 3 * s);
    const bool all_reduce = p.gather_out != nullptr;
    // whose stores complete the step: the block whose claimed tiles bring the step's count to its total (a block
    // that got none takes no part; the ring runs with tile claims only: the top of this file)
    static_assert(GemmKernel::TileScheduler::kTileClaims, "the ring takes its tiles by claims");
    const auto completes = [&] {
      const uint32_t mine = p.claims->tiles_of_block[blockIdx.x + blockIdx.y * gridDim.x];
      return last_of_units(&ctl->local_count[s], mine, static_cast<uint64_t>(p.chunk_tiles));
    };
    if ((s + 1 < world || all_reduce) && threadIdx.x == 0 && completes()) {
      if (s + 1 < world) {
        (void)signal(comm, &ctl->ring_step[s], e, SignalOp::kSet, left);
      } else {  // AR: this rank's reduced rows (slot W-1 of its partial buffer) are complete, for every rank
        for (int q = 0; q < world; ++q) (void)signal(comm, &ctl->reduced[rank], e, SignalOp::kSet, q);
      }
    }
  }
  if (p.gather_out == nullptr) return;
  // AR: every block copies its slice of every rank's reduced rows (slot W-1 of rank q's partial buffer, through
  // the peer mapping; this rank's own first) into out rows of chunk q. The stores that made them were TMA stores
  // completed and proxy-fenced before their release; these are plain loads after the acquire.
  const size_t chunk_bytes = static_cast<size_t>(p.chunk_elems) * sizeof(Element);
  const int64_t nvec = static_cast<int64_t>(chunk_bytes / 16);
  const int64_t b = blockIdx.x + static_cast<int64_t>(blockIdx.y) * gridDim.x, nb = gridDim.x * gridDim.y;
  const int64_t lo = nvec * b / nb, hi = nvec * (b + 1) / nb;
  p.timeline.stamp(kSlotGatherStart);
  for (int d = 0; d < world; ++d) {
    const int q = (rank + d) % world;
    if (threadIdx.x == 0 && st == Status::kOk)
      st = wait_until_backoff(comm, &ctl->reduced[q], Cmp::kGe, e, kRolePollNs, q);
    if (!block_ok(st)) return;
    const uint4* src = reinterpret_cast<const uint4*>(
        peer_ptr(comm, p.partial + static_cast<size_t>(world - 1) * chunk_bytes, q));
    if (src == nullptr) return;
    copy_slice(reinterpret_cast<uint4*>(p.gather_out + static_cast<size_t>(q) * chunk_bytes), src, lo, hi);
  }
  __syncthreads();
  p.timeline.stamp(kSlotGatherEnd);
}

// The ticket mode's tiles (the core's CooperativeConfig: run_ticket checks) and their layout in the workspace.
constexpr int kTicketTileM = 128, kTicketTileN = 256;

// The ticket mode's kernel (protocol at the top of this file): every block computes; p.partial is this rank's
// staging (the sums of its chunk, symmetric: AR ranks read each other's).
template <class Element, class GemmKernel>
__global__ void __launch_bounds__(GemmKernel::MaxThreadsPerBlock, 1)
    gemm_rs_ticket_kernel(const __grid_constant__ RsParams<GemmKernel> p) {
  extern __shared__ __align__(128) char smem[];
  using namespace tandem::device;
  Control* ctl = p.ctl;
  const DeviceComm& comm = p.comm;
  const int rank = comm.rank, world = comm.world;
  const uint64_t e = current_epoch(ctl);
  Status st = Status::kOk;
  p.timeline.stamp(0);
  for (int q = 0; q < world && threadIdx.x == 0 && st == Status::kOk; ++q)
    st = wait_until_backoff(comm, &ctl->ready[q], Cmp::kGe, e - 1, kRolePollNs, q);
  // (tests, TANDEM_TP_LATE: clusters from grid row late_cluster start late_us late, as clusters MPS made resident late)
  if (p.late_us != 0 && static_cast<int>(blockIdx.y) >= p.late_cluster) runtime::hold_block_us(p.late_us);
  // A failed wait leaves the abort flag up; the GEMM still runs so that every block stays in step.
  __syncthreads();
  // Rounds (p.pieces > 1, TANDEM_RS_TICKET_ROUNDS): round j computes piece j of every chunk in the same chunk order,
  // so the owner's fixups (it reduces its own piece last in each round) happen in every round, beside the next
  // round's GEMM on the SMs that finished first, instead of all at the end with no GEMM left to hide them. Trace
  // stamps: whole chunks as the other kernels' steps (1 + 3s start, 2 + 3s end); rounds as pieces (call c = jW + s
  // ends at slot 1 + c, the last slots shared past 39: tools/diag/tp_trace.py reads them so).
  constexpr bool kRounds = GemmKernel::TileScheduler::kPieceCalls;
  const int rounds = kRounds ? p.pieces : 1;
  for (int j = 0; j < rounds; ++j) {
    for (int s = 0; s < world; ++s) {
      // The scheduler reads this call's piece (after the barrier below).
      if (kRounds && threadIdx.x == 0) p.piece_of_block[runtime::grid_block_index()] = j;
      __syncthreads();
      if (!kRounds) p.timeline.stamp(1 + 3 * s);
      GemmKernel op;
      op(p.gemm[s], smem);
      const int call = j * world + s;
      p.timeline.stamp(!kRounds ? 2 + 3 * s : (1 + call < kSlotGatherStart ? 1 + call : kSlotGatherStart - 1));
      __syncthreads();  // the next call's pipelines start over in the same shared memory
    }
  }
  even_out_registers<GemmKernel>();  // every warp runs the end phase: one register count again
  // The end: this rank's own chunk holds its sums already (the fixup stored them into the output) but for the tiles
  // another rank reduced, which are in the staging and flagged; those are copied. AR: every other chunk q is
  // copied whole from q's staging (peer mapping) into out rows of that chunk. The staging and the flags were
  // written by other ranks' last arrivers, published by the completer's signal.
  const size_t chunk_bytes = static_cast<size_t>(p.chunk_elems) * sizeof(Element);
  const int64_t nvec = static_cast<int64_t>(chunk_bytes / 16);
  const int64_t b = runtime::grid_block_index(), nb = static_cast<int64_t>(gridDim.x) * gridDim.y;
  p.timeline.stamp(kSlotGatherStart);
  const int chunks = p.gather_out != nullptr ? world : 1;
  const auto chunk_dst = [&](int q) {
    return reinterpret_cast<uint4*>(p.gather_out != nullptr ? p.gather_out + static_cast<size_t>(q) * chunk_bytes
                                                            : p.out);
  };
  // The units of chunk d's copy (d = 0: this rank's own): groups of `group` tiles of the own chunk (a warp reads
  // their flags at once; at most 32, and small enough for 4 groups a block, so that a late rank's chunk-wide
  // flagged copy still spreads over the grid), 4 slices a block of a peer's.
  const int64_t own_tiles = static_cast<int64_t>(p.ticket_tiles_m) * p.ticket_tiles_n;
  const int64_t peer_slices = 4 * nb;
  const int group = static_cast<int>(max(int64_t{1}, min(int64_t{32}, own_tiles / (4 * nb))));
  const auto units = [&](int d) { return d == 0 ? (own_tiles + group - 1) / group : peer_slices; };
  // where chunk d's copy reads (a peer without a mapping is refused on the host: null skips the chunk)
  const auto chunk_src = [&](int d) {
    const int q = (rank + d) % world;
    return reinterpret_cast<const uint4*>(d == 0 ? p.partial : peer_ptr(comm, p.partial, q));
  };
  // copies unit u of chunk d (block-uniform: every thread calls it with the same arguments)
  const auto copy_unit = [&](int d, const uint4* src, int64_t u) {
    if (d != 0) {
      copy_slice(chunk_dst((rank + d) % world), src, nvec * u / peer_slices, nvec * (u + 1) / peer_slices);
      return;
    }
    // Every warp reads the group's flags (lane l: tile group * u + l); the barrier keeps warp 0's clearing after
    // every warp's read.
    volatile uint32_t* flags = p.ticket_staged;
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int64_t my_tile = u * group + lane;
    const bool flagged = lane < group && my_tile < own_tiles && flags[my_tile] != 0u;
    const uint32_t flagged_lanes = __ballot_sync(0xffffffffu, flagged);
    __syncthreads();
    const int64_t cols = p.chunk_elems / p.chunk_rows;
    uint4* dst = chunk_dst(rank);
    for (uint32_t rest = flagged_lanes; rest != 0u; rest &= rest - 1u) {
      const int64_t tile = u * group + (__ffs(rest) - 1);
      const int64_t m0 = (tile / p.ticket_tiles_n) * kTicketTileM, n0 = (tile % p.ticket_tiles_n) * kTicketTileN;
      const int rows = static_cast<int>(min(static_cast<int64_t>(kTicketTileM), p.chunk_rows - m0));
      const int per_row = static_cast<int>(min(static_cast<int64_t>(kTicketTileN), cols - n0) / 8);  // 16 B vectors
      const int n_vec = rows * per_row;
      const uint4* from = src + (m0 * cols + n0) / 8;
      uint4* to = dst + (m0 * cols + n0) / 8;
      const int64_t row_vec = cols / 8;
      // 4 loads in flight a thread before their stores (L1-bypassing: another rank wrote them this launch)
      for (int v0 = static_cast<int>(threadIdx.x); v0 < n_vec; v0 += 4 * static_cast<int>(blockDim.x)) {
        uint4 x[4];
        int64_t at[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int v = v0 + j * static_cast<int>(blockDim.x);
          at[j] = (v / per_row) * row_vec + v % per_row;
          if (v < n_vec) x[j] = __ldcg(from + at[j]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (v0 + j * static_cast<int>(blockDim.x) < n_vec) to[at[j]] = x[j];
      }
    }
    // (zero between launches: the next launch's flags come after this rank's ready[], which follows this)
    if (threadIdx.x < 32 && flagged) flags[my_tile] = 0u;
  };
  if (p.end_waiters > 0) {
    // Claimed end. Under MPS a rank's clusters are not all resident at once: the late ones start when blocks of
    // any rank on the GPU exit, so a block that waits here holds an SM that the slowest rank's late clusters may
    // need, and every rank then waits for that rank (2026-12-07, H100: at world 4 the late blocks of one rank
    // started when another rank's grid ended; at world 2 the ticket kernel took 9.3 ms against 2.5 unfused, and
    // 34 ms for AR with every block waiting). So only the last end_waiters blocks to get here wait; the others
    // copy what is already reduced (skipping chunks that are not) and leave. Whoever is here claims the copy's
    // units, so the waiters (the last to arrive: none arrives after them) complete whatever the others left. The
    // block's broadcast word is its ticket word (the fixup's, free after the GEMM calls; global memory, ordered
    // for the block by __syncthreads), not shared memory, whose first bytes are the GEMM pipeline's barriers.
    volatile uint32_t* word = p.gemm[0].scheduler.ticket.scratch + b;
    bool waiter = false;  // (thread 0's)
    if (threadIdx.x == 0) {
      const uint64_t a = atomicAdd(reinterpret_cast<unsigned long long*>(&ctl->ticket_end_arrivals), 1ull);
      waiter = a + static_cast<uint64_t>(p.end_waiters) >= static_cast<uint64_t>(nb);
    }
    for (int d = 0; d < chunks; ++d) {
      const int q = (rank + d) % world;
      if (threadIdx.x == 0) {
        bool ready = false;
        if (st == Status::kOk) {
          if (waiter) {  // several writers (whichever ranks completed q's count): no single peer
            st = wait_until_backoff(comm, &ctl->reduced[q], Cmp::kGe, e, kRolePollNs, -1);
            ready = st == Status::kOk;
          } else {
            ready = test(comm, &ctl->reduced[q], Cmp::kGe, e);
          }
        }
        word[0] = ready ? 1u : 0u;
      }
      __syncthreads();
      const bool ready = word[0] != 0u;
      __syncthreads();  // (every thread read word[0] before thread 0 writes a claim into it)
      const uint4* src = chunk_src(d);
      if (!ready || src == nullptr) continue;  // not reduced yet: the waiters copy it; a later chunk may be
      for (;;) {
        if (threadIdx.x == 0)
          word[0] = static_cast<uint32_t>(
              atomicAdd(reinterpret_cast<unsigned long long*>(&ctl->ticket_copy_claim[d]), 1ull));
        __syncthreads();
        const int64_t u = word[0];
        __syncthreads();
        if (u >= units(d)) break;
        copy_unit(d, src, u);
      }
    }
  } else {
    for (int d = 0; d < chunks; ++d) {
      const int q = (rank + d) % world;
      // several writers (whichever ranks completed q's count): no single peer, .sys scope
      if (threadIdx.x == 0 && st == Status::kOk)
        st = wait_until_backoff(comm, &ctl->reduced[q], Cmp::kGe, e, kRolePollNs, -1);
      if (!block_ok(st)) break;
      const uint4* src = chunk_src(d);
      if (src == nullptr) break;
      for (int64_t u = b; u < units(d); u += nb) copy_unit(d, src, u);
    }
  }
  __syncthreads();
  p.timeline.stamp(kSlotEnd);
  finish_block(ctl, static_cast<uint64_t>(nb), e, [&] {
    if (p.claims != nullptr) gemm::tile_claims_reset(p.claims, gemm::kClaimCalls);
    ctl->ticket_end_arrivals = 0;  // (every block is past the end phase; the next launch is stream-ordered)
    for (int d = 0; d < chunks; ++d) ctl->ticket_copy_claim[d] = 0;
    for (int q = 0; q < world; ++q) (void)signal(comm, &ctl->ready[rank], e, SignalOp::kSet, q);
  });
}

// kPieces: the fused kernel in pieces (p.pieces > 1; one node, two-shot); its own instantiation, so that the
// whole-chunk kernel's registers stay as they were.
template <class Element, class GemmKernel, bool kPieces, bool kRing = false>
__global__ void __launch_bounds__(GemmKernel::MaxThreadsPerBlock, 1)
    gemm_rs_kernel(const __grid_constant__ RsParams<GemmKernel> p) {
  extern __shared__ __align__(128) char smem[];
  using namespace tandem::device;
  constexpr bool kClaims = GemmKernel::TileScheduler::kTileClaims;
  Control* ctl = p.ctl;
  const DeviceComm& comm = p.comm;
  const int rank = comm.rank, world = comm.world;
  const uint64_t e = current_epoch(ctl);
  p.timeline.stamp(0);
  if (p.mode == RsMode::kWaitReady) {  // before the unfused GEMM overwrites the partial buffer
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
      Status st = Status::kOk;
      for (int o = 0; o < world && st == Status::kOk; ++o) st = wait_until(comm, &ctl->ready[o], Cmp::kGe, e - 1, o);
    }
    return;
  }
  if constexpr (kRing) {
    run_ring_steps<Element>(p, smem, e);
    p.timeline.stamp(kSlotEnd);
    finish_block(ctl, static_cast<uint64_t>(gridDim.x) * gridDim.y, e, [&] {
      if (p.claims != nullptr) gemm::tile_claims_reset(p.claims, gemm::kClaimCalls);
      for (int q = 0; q < world; ++q) (void)signal(comm, &ctl->ready[rank], e, SignalOp::kSet, q);
      // the next launch on this workspace may be the default kernel, which waits only for the owner of each chunk
      // it overwrites, while r-1 read r's slots here: the launch ends when every rank is done (as kReduceOnly's)
      Status st = Status::kOk;
      for (int q = 0; q < world && st == Status::kOk; ++q) st = wait_until(comm, &ctl->ready[q], Cmp::kGe, e, q);
    });
    return;
  }
  const Topology t = Topology::of(rank, world, p.ranks_per_node);
  if (p.mode == RsMode::kReduceOnly && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    for (int o = 0; o < world; ++o) announce_chunk(p, t, o, e);
  }
  // the runtime's roles over the grid (reduce rows first, then the GEMM's), with both bodies inline here
  if (runtime::is_compute_block(p.reduce_rows_y * static_cast<int>(gridDim.x), p.mode == RsMode::kFused)) {
    Status st = Status::kOk;
    if (p.late_us != 0 && static_cast<int>(blockIdx.y) - p.reduce_rows_y >= p.late_cluster)
      runtime::hold_block_us(p.late_us);
    // Pieces: steps (o, j) = piece j of chunk o in the order j-major, o = 0, 1, ... (the same on every rank);
    // else chunk by chunk, owner r+1 first.
    for (int s = 0; s < world * (kPieces ? p.pieces : 1); ++s) {
      const int j = kPieces ? s / world : 0;
      const int o = kPieces ? s % world : rs_chunk_at(t, s, p.common_order);
      if (j == 0) {
        if (threadIdx.x == 0 && st == Status::kOk)
          st = wait_until_backoff(comm, &ctl->ready[o], Cmp::kGe, e - 1, kRolePollNs, o);
        // AR two-shot: chunk r holds the reduced rows too (and across nodes so do the chunks this rank
        // represents, which come first); one-shot: every rank reads every chunk. Either way every rank must be
        // done with this rank's partial of e - 1.
        const bool wait_all = p.gather_out != nullptr && (p.one_shot || t.N > 1 ? s == 0 : o == rank);
        if (wait_all && threadIdx.x == 0) {
          for (int q = 0; q < world && st == Status::kOk; ++q)
            st = wait_until_backoff(comm, &ctl->ready[q], Cmp::kGe, e - 1, kRolePollNs, q);
        }
      }
      // The scheduler reads this call's piece (after the barrier below).
      if (kPieces && threadIdx.x == 0) p.piece_of_block[blockIdx.x + (blockIdx.y - p.reduce_rows_y) * gridDim.x] = j;
      // A failed wait leaves the abort flag up; the chunk is still computed so every block stays in step.
      __syncthreads();
      if (!kPieces) p.timeline.stamp(1 + 3 * s);
      GemmKernel op;
      op(p.gemm[o], smem);
      if (!kPieces) p.timeline.stamp(2 + 3 * s);
      complete_bulk_stores();
      __syncthreads();
      p.timeline.stamp(!kPieces ? 3 + 3 * s : (1 + s < kSlotGatherStart ? 1 + s : kSlotGatherStart - 1));
      // Whose stores complete the chunk (piece): the last GEMM block past it, or with claims the block whose
      // tiles bring its count to the total (a block that got none of its tiles takes no part).
      const auto completes = [&](uint64_t* counter, int64_t tiles) {
        if constexpr (!kClaims) {
          return last_of(counter, p.gemm_blocks);
        } else {
          const uint32_t mine = p.claims->tiles_of_block[blockIdx.x + (blockIdx.y - p.reduce_rows_y) * gridDim.x];
          return last_of_units(counter, mine, static_cast<uint64_t>(tiles));
        }
      };
      if constexpr (kPieces) {
        const int64_t left = p.chunk_tiles - j * p.piece_tiles;
        if (threadIdx.x == 0 &&
            completes(&ctl->local_count[o * p.pieces + j], left < p.piece_tiles ? left : p.piece_tiles)) {
          if constexpr (kClaims) {
            publish_piece_prefix(p, t, o, j, e);
          } else {
            const int64_t rows = (j + 1) * static_cast<int64_t>(p.piece_rows);
            const bool last = rows >= p.chunk_rows;
            (void)signal(comm, &ctl->piece_arrive[rank], rows_flag(e, last ? p.chunk_rows : rows), SignalOp::kSet, o);
            if (last) announce_chunk(p, t, o, e);  // an owner reducing whole chunks waits for this
          }
        }
      } else if (kClaims && p.one_shot) {
        // one-shot with claims: the chunks complete in any order, so the whole partial is complete when every
        // chunk's tiles are (one count over the launch), not when the last step's are
        if (threadIdx.x == 0 && completes(&ctl->one_shot_tiles, world * p.chunk_tiles))
          for (int q = 0; q < world; ++q) (void)signal(comm, &ctl->arrive[rank], e, SignalOp::kSet, q);
      } else if (threadIdx.x == 0 && completes(&ctl->local_count[o], p.chunk_tiles)) {
        if (!p.one_shot) {
          // an owner reducing in pieces waits for the rows (one node)
          if (t.N == 1) (void)signal(comm, &ctl->piece_arrive[rank], rows_flag(e, p.chunk_rows), SignalOp::kSet, o);
          announce_chunk(p, t, o, e);
        } else if (s + 1 == world) {  // one-shot: the whole partial is complete (every block's every chunk)
          for (int q = 0; q < world; ++q) (void)signal(comm, &ctl->arrive[rank], e, SignalOp::kSet, q);
        }
      }
    }
    if constexpr (kPieces && kClaims) {
      if (p.join) {  // done with the GEMM: join the reduction (its items whose inputs are there)
        even_out_registers<GemmKernel>();
        run_joined<Element>(p, e, /*reduce_block=*/false, -1, reinterpret_cast<volatile int64_t*>(smem));
      }
    }
  } else {
    const int rb = runtime::grid_block_index();
    // (the kernels in pieces keep their loads in flight to what fits beside their GEMM role: stream.cuh)
    if (p.one_shot)
      ar_one_shot_role<Element, kPieces ? roles::kReduceInFlightBytesBesideGemm : roles::kReduceInFlightBytes>(p, rb, e);
    else if constexpr (kPieces && kClaims) {
      // (a single call site after both roles spilled 2.6-3.4 KB against 1.4 KB for these two: ptxas, nvcc 13.0)
      if (p.join) run_joined<Element>(p, e, /*reduce_block=*/true, rb, reinterpret_cast<volatile int64_t*>(smem));
      else rs_reduce_role<Element, kPieces>(p, rb, e);
    } else {
      rs_reduce_role<Element, kPieces>(p, rb, e);
    }
  }
  p.timeline.stamp(kSlotEnd);
  finish_block(ctl, static_cast<uint64_t>(gridDim.x) * gridDim.y, e, [&] {
    if (p.claims != nullptr) gemm::tile_claims_reset(p.claims, gemm::kClaimCalls);
    if (p.join) {  // every block is done: no claim is pending (and a lost item leaves no count behind)
      local_store(&ctl->reduce_claim, 0);
      local_store(&ctl->reduce_items_done, 0);
    }
    for (int q = 0; q < world; ++q) (void)signal(comm, &ctl->ready[rank], e, SignalOp::kSet, q);
    if (p.mode == RsMode::kReduceOnly) {  // the next (plain) GEMM may overwrite the partial buffer
      Status st = Status::kOk;
      for (int o = 0; o < world && st == Status::kOk; ++o) st = wait_until(comm, &ctl->ready[o], Cmp::kGe, e, o);
    }
  });
}

// Workspace: control block | node flags | piece table | tile claims | partial (M x N) | recv (N > 1: N x chunk) |
// acc (fp32 chunk).
constexpr size_t round256(size_t b) { return (b + 255) & ~size_t(255); }
constexpr size_t kPieceTableOffset = kControlBytes + round256(kNodeFlagBytes);
constexpr size_t kClaimOffset = kPieceTableOffset + round256(sizeof(int32_t) * kMaxGemmBlocks);
constexpr size_t kPartialOffset = kClaimOffset + kClaimBytes;
Topology topology_of(const GemmRsArgs& a) { return Topology::of(a.comm.rank, a.comm.world, a.ranks_per_node); }
size_t recv_offset(const GemmRsArgs& a) { return kPartialOffset + round256(static_cast<size_t>(a.m) * a.n * 2); }
size_t acc_offset(const GemmRsArgs& a) {
  const Topology t = topology_of(a);
  const size_t chunk = static_cast<size_t>(a.m / (a.comm.world > 0 ? a.comm.world : 1)) * a.n * 2;
  return recv_offset(a) + (t.N > 1 ? round256(t.N * chunk) : 0);
}

// The ticket mode's layout (the same workspace size as the others' and more where its tiles pad, so one
// workspace_size serves every mode; tp.py gives the ticket mode a workspace of its own): the partial slots of every
// chunk from kPartialOffset (W x tiles x 128x256 elements, fragment order), the staging (this rank's chunk's sums,
// (M / W) x N), then past every other mode's bytes the tickets (one word a tile of a chunk: only the ticket mode
// ever writes them, so they stay zero between its launches), the staged flags (one word a tile, likewise) and the
// blocks' broadcast words.
size_t default_workspace_size(const GemmRsArgs& a) {  // every mode's bytes but the ticket mode's
  return acc_offset(a) + static_cast<size_t>(a.m / (a.comm.world > 0 ? a.comm.world : 1)) * a.n * sizeof(float);
}
struct TicketLayout {
  int tiles_m = 0, tiles_n = 0;
  size_t chunk_slot_bytes = 0;
  size_t slots = 0, staging = 0, tickets = 0, staged = 0, scratch = 0, end = 0;
};
TicketLayout ticket_layout(const GemmRsArgs& a) {
  TicketLayout l;
  const int world = a.comm.world > 0 ? a.comm.world : 1;
  const int mr = a.m / world;
  l.tiles_m = (mr + kTicketTileM - 1) / kTicketTileM;
  l.tiles_n = (a.n + kTicketTileN - 1) / kTicketTileN;
  l.chunk_slot_bytes = static_cast<size_t>(l.tiles_m) * l.tiles_n * kTicketTileM * kTicketTileN * 2;
  l.slots = kPartialOffset;
  l.staging = l.slots + round256(static_cast<size_t>(world) * l.chunk_slot_bytes);
  const size_t others_end = default_workspace_size(a);
  const size_t staging_end = l.staging + round256(static_cast<size_t>(mr) * a.n * 2);
  l.tickets = round256(others_end > staging_end ? others_end : staging_end);
  l.staged = l.tickets + round256(sizeof(uint64_t) * l.tiles_m * l.tiles_n);
  l.scratch = l.staged + round256(sizeof(uint32_t) * l.tiles_m * l.tiles_n);
  l.end = l.scratch + round256(sizeof(uint32_t) * kMaxGemmBlocks);
  return l;
}

// Stages of the unfused path that run: all three, the reduction alone, or the wait alone (the caller's GEMM
// goes between the wait and the reduction).
enum class Stages { kAll, kReduceOnly, kWaitOnly };

// The fused GEMM+RS/AR in pieces (TANDEM_RS_PIECES; one node, two-shot, raster along N): pieces of whole groups
// of the scheduler's swizzle (S cluster rows of 2x1 clusters: 256 x S rows); "auto": at least about four waves of
// the GEMM's grid each, at most kMaxPieces a chunk; a number P: P pieces (or fewer, of whole groups). 1 = whole
// chunks.
//
// Why whole swizzle groups: along N with swizzle S the scheduler walks S cluster rows for each N tile, then the
// next S rows (CUTLASS's get_work_idx_m_and_n), so a piece is one contiguous range of its linear indices exactly
// when it holds whole groups of S rows. A swizzle lets a piece read each B tile once per S cluster rows instead of
// once per row: with four ranks sharing one GPU's L2, B (16 MB a rank at 16384x8192x4096) does not stay resident
// between rows.
struct PiecePlan {
  int pieces = 1;
  int rows = 0;  // rows of a piece (the last may be shorter)
  int len = 0;   // the scheduler's linear indices of a piece
};
// The swizzle CUTLASS's scheduler takes for a chunk (it lowers the asked-for size on small problems), and the N
// tiles it pads to (it rounds N up to whole swizzle groups too).
// tile_m x tile_n: the GEMM role's tile (128x256, the core's; or 256x128, TANDEM_TP_GEMM_TILE), 2x1 clusters.
int effective_swizzle(const GemmRsArgs& a, int asked, int tile_m, int tile_n) {
  const int mr = a.m / a.comm.world;
  const int ctas_m = ((mr + tile_m - 1) / tile_m + 1) & ~1, ctas_n = (a.n + tile_n - 1) / tile_n;
  return 1 << cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Params::get_log_swizzle_size(ctas_m, ctas_n,
                                                                                                     asked);
}
PiecePlan piece_plan(const GemmRsArgs& a, const SmPlan& plan, bool one_shot, const FusedKnobs& knobs, int tile_m,
                     int tile_n) {
  PiecePlan pp;
  if (knobs.pieces == 0 || topology_of(a).N != 1 || one_shot || knobs.raster_m) return pp;
  const int swz = effective_swizzle(a, knobs.swizzle, tile_m, tile_n);
  const int mr = a.m / a.comm.world;
  const int tiles_n = ((a.n + tile_n - 1) / tile_n + swz - 1) / swz * swz;
  const int m_clusters = ((mr + tile_m - 1) / tile_m + 1) / 2;
  const int gemm_sms = plan.sm_count - plan.comm_blocks;
  // auto: at least ~4 waves a piece, at most kMaxPieces; P: as close to P pieces as whole groups allow
  const int want = knobs.pieces > 0 && knobs.pieces < kMaxPieces ? knobs.pieces : kMaxPieces;
  int per = knobs.pieces < 0 ? (4 * gemm_sms + 2 * tiles_n - 1) / (2 * tiles_n) : 1;
  per = per < 1 ? 1 : per;
  per = per < (m_clusters + want - 1) / want ? (m_clusters + want - 1) / want : per;
  per = (per + swz - 1) / swz * swz;  // whole swizzle groups
  const int pieces = (m_clusters + per - 1) / per;
  if (pieces > 1) {
    pp.pieces = pieces;
    pp.rows = per * 2 * tile_m;
    pp.len = per * 2 * tiles_n;
  }
  return pp;
}

template <bool kPieces, bool kClaims>
using RsSchedulerTag = std::conditional_t<
    kPieces, std::conditional_t<kClaims, gemm::ArrivalPiecesClaimsSchedulerTag, gemm::ArrivalPiecesSchedulerTag>,
    std::conditional_t<kClaims, gemm::ArrivalClaimsSchedulerTag, gemm::ArrivalSchedulerTag>>;

template <class Element, bool kPieces = false, bool kClaims = false, class Config = gemm::detail::CooperativeConfig>
Status run_typed(const GemmRsArgs& a, cudaStream_t stream, bool fused, bool all_reduce, bool one_shot,
                 std::string* why, Stages stages = Stages::kAll) {
  using G = gemm::detail::Sm90Gemm<Element, RsSchedulerTag<kPieces, kClaims>, Config>;
  using Kernel = typename G::Kernel;
  constexpr int kTileM = kConfigTileM<Config>, kTileN = kConfigTileN<Config>;
  static_assert(cute::size<0>(typename Config::ClusterShape{}) == kClusterX, "the fused RS runs 2x1 clusters");
  const int world = a.comm.world;
  const SmPlan plan = a.plan.comm_blocks > 0 ? a.plan : default_plan(a.plan.sm_count);
  const int mr = a.m / world;
  char* ws = static_cast<char*>(a.workspace);
  RsParams<Kernel> p{};
  p.comm = a.comm;
  p.ctl = reinterpret_cast<Control*>(ws);
  p.partial = ws + kPartialOffset;
  p.acc = reinterpret_cast<float*>(ws + acc_offset(a));
  p.out = static_cast<char*>(a.out);
  p.ranks_per_node = topology_of(a).L;
  p.recv = ws + recv_offset(a);
  p.node_flags = reinterpret_cast<NodeFlags*>(ws + kControlBytes);
  const FusedKnobs knobs = FusedKnobs::from_env();
  p.common_order = knobs.common_order;
  p.late_cluster = knobs.late_cluster;
  p.late_us = fused ? knobs.late_us : 0u;
  // the joined reduction: pieces with claims (one node, two-shot: the pieces' conditions); items of about
  // kJoinItemVectors 16-byte vectors (at least that many unless there would be fewer items than reduce blocks)
  p.join = kPieces && kClaims && fused && knobs.join;
  p.fused_one_pass = knobs.one_pass;
  p.timeline.stamps = timeline_for_launch(stream);
  if (all_reduce) {
    p.gather_out = static_cast<char*>(a.out);
    p.out = ws + kPartialOffset + static_cast<size_t>(a.comm.rank) * mr * a.n * sizeof(Element);
    p.one_shot = one_shot;
  }
  p.chunk_elems = static_cast<int64_t>(mr) * a.n;
  p.chunk_rows = mr;
  p.reduce_blocks = plan.comm_blocks;
  p.pieces = 1;
  p.piece_of_block = reinterpret_cast<int32_t*>(ws + kPieceTableOffset);
  const PiecePlan pieces = kPieces ? piece_plan(a, plan, one_shot, knobs, kTileM, kTileN) : PiecePlan{};
  if (kPieces && (!fused || pieces.pieces <= 1)) return fail(why, "no pieces for this launch", Status::kInternal);
  p.pieces = pieces.pieces;
  p.piece_rows = pieces.rows;
  p.piece_tiles = pieces.len;
  if (p.join) {
    const int64_t piece_vectors = static_cast<int64_t>(pieces.rows) * (a.n / 8);
    const int64_t items = piece_vectors / kJoinItemVectors;
    p.join_items = static_cast<int>(items > plan.comm_blocks ? items : plan.comm_blocks);
  }
  if (fused) detail::g_last_fused_joined = p.join;
  p.claims = kClaims && fused ? reinterpret_cast<gemm::TileClaims*>(ws + kClaimOffset) : nullptr;
  auto chunk_args = [&](int o, int sm_count) {
    gemm::GemmArgs g;
    g.m = mr;
    g.n = a.n;
    g.k = a.k;
    g.dtype = a.dtype;
    g.a = static_cast<const char*>(a.a) + static_cast<size_t>(o) * mr * a.lda * sizeof(Element);
    g.lda = a.lda;
    g.b = a.b;
    g.ldb = a.ldb;
    g.d = const_cast<char*>(p.partial) + static_cast<size_t>(o) * mr * a.n * sizeof(Element);
    g.ldd = a.n;
    g.sm_count = sm_count;
    return g;
  };
  const auto launch = [&](dim3 grid, int smem) {
    const cudaError_t err = launch_clustered(gemm_rs_kernel<Element, Kernel, kPieces>, grid,
                                             Kernel::MaxThreadsPerBlock, smem, stream, p);
    return err == cudaSuccess ? Status::kOk
                              : fail(why, std::string("launch failed: ") + cudaGetErrorString(err), Status::kCudaError);
  };
  if (!fused) {
    if (stages != Stages::kReduceOnly) {
      p.mode = RsMode::kWaitReady;
      if (Status s = launch(dim3(kClusterX, 1, 1), 0); s != Status::kOk) return s;
      if (stages == Stages::kWaitOnly) return Status::kOk;
      gemm::GemmArgs g = chunk_args(0, plan.sm_count);
      g.m = a.m;
      if (Status s = gemm::run(g, nullptr, stream, why); s != Status::kOk) return s;
    }
    // The reduction runs alone here: on one node it takes up to kMaxCollectiveBlocks SMs of the rank (bench
    // roles, H200, world 4: 731 GB/s a rank on 16 SMs, 596 on 32); across nodes the plan's comm blocks.
    p.mode = RsMode::kReduceOnly;
    int blocks = topology_of(a).N == 1 ? plan.sm_count & ~1 : plan.comm_blocks;
    blocks = blocks < 2 ? 2 : (blocks > kMaxCollectiveBlocks ? kMaxCollectiveBlocks : blocks);
    p.reduce_blocks = blocks;
    return launch(dim3(kClusterX, blocks / kClusterX, 1), 0);
  }
  p.mode = RsMode::kFused;
  dim3 gg{};
  for (int o = 0; o < world; ++o) {
    auto args = G::arguments(chunk_args(o, plan.sm_count - plan.comm_blocks));
    using Raster = decltype(args.scheduler.raster_order);
    args.scheduler.raster_order = knobs.raster_m ? Raster::AlongM : Raster::AlongN;
    args.scheduler.max_swizzle_size = knobs.swizzle;
    args.scheduler.arrival.chunks = 1;  // no waits: flags stay null; only the grid is pinned below
    args.scheduler.arrival.chunk_rows = mr;
    args.scheduler.arrival.piece_len = pieces.len;
    args.scheduler.arrival.piece_of_block = kPieces ? p.piece_of_block : nullptr;
    // Claims: one counter a call, numbered by the step that makes it, so that later calls have larger numbers
    // (the ring tags' order): pieces, step j * W + o; whole chunks, the step at which this rank computes chunk o.
    // The scheduler reads the epoch for its ring tags from the control block.
    args.scheduler.arrival.claims = p.claims;
    args.scheduler.arrival.comm = a.comm;  // names the rank of an error the claims record
    if (kPieces) {
      args.scheduler.arrival.claim_call = o;
      args.scheduler.arrival.claim_stride = world;
    } else {
      const Topology t = topology_of(a);
      for (int s = 0; s < world; ++s)
        if (rs_chunk_at(t, s, knobs.common_order) == o) args.scheduler.arrival.claim_call = s;
    }
    args.scheduler.arrival.epoch_counter = kClaims ? &p.ctl->epoch : nullptr;
    if (!Kernel::can_implement(args)) return fail(why, "CUTLASS cannot implement this GEMM+RS chunk");
    if (Kernel::get_workspace_size(args) != 0) return fail(why, "unexpected CUTLASS workspace", Status::kInternal);
    if (o == 0) {
      // The scheduler's persistent grid: (2, clusters) along N, (2 x clusters, 1) along M. Either way it is
      // launched as (2, clusters) below the role rows; the scheduler numbers the blocks cluster-minor first.
      gg = Kernel::get_grid_shape(Kernel::to_underlying_arguments(args, nullptr));
      if (gg.z != 1 || (gg.x != kClusterX && gg.y != 1) || (gg.x * gg.y) % kClusterX)
        return fail(why, "unexpected GEMM grid shape", Status::kInternal);
      gg = dim3(kClusterX, gg.x * gg.y / kClusterX, 1);
    }
    args.scheduler.arrival.gemm_grid_x = static_cast<int32_t>(gg.x);
    args.scheduler.arrival.gemm_grid_y = static_cast<int32_t>(gg.y);
    args.scheduler.arrival.gemm_block_y0 = plan.comm_blocks / kClusterX;
    p.gemm[o] = Kernel::to_underlying_arguments(args, nullptr);
    p.chunk_tiles = static_cast<int64_t>(p.gemm[o].scheduler.blocks_per_problem_);
    if constexpr (kPieces) {
      // piece_plan's assumptions about CUTLASS's order, checked against the scheduler it made: along N, the N
      // tiles padded as assumed, and pieces of whole swizzle groups (each piece one contiguous index range)
      const auto& sp = p.gemm[o].scheduler;
      const int64_t tiles_n = static_cast<int64_t>(sp.divmod_cluster_blk_major_.divisor);
      if (sp.raster_order_ != decltype(sp.raster_order_)::AlongN || pieces.len != (pieces.rows / kTileM) * tiles_n ||
          (pieces.rows / (2 * kTileM)) % (1 << sp.log_swizzle_size_) != 0)
        return fail(why, "the pieces do not match the GEMM scheduler's order", Status::kInternal);
    }
  }
  if (kClaims && gg.y > static_cast<unsigned>(gemm::kClaimClusters))
    return fail(why, "too many GEMM clusters for the tile claims", Status::kInternal);
  p.reduce_rows_y = plan.comm_blocks / kClusterX;
  p.gemm_blocks = static_cast<int>(gg.x * gg.y);
  if (p.pieces > 1 && p.gemm_blocks > kMaxGemmBlocks) return fail(why, "too many GEMM blocks for the piece table", Status::kInternal);
  return launch(dim3(kClusterX, gg.y + plan.comm_blocks / kClusterX, 1), Kernel::SharedStorageSize);
}

// Rank q's heap as this process maps it (one node: DeviceComm's inline entries), 0 where it is not mapped; bit 0
// of an entry marks a peer on this GPU and is not part of the address.
uint64_t mapped_heap(const tandem::DeviceComm& comm, int q) {
  return q < tandem::kInlinePeerHeaps ? comm.peer_heap_inline[q] & ~tandem::kPeerSameDeviceBit : 0;
}
// This rank's symmetric address `local` in rank q's heap, as mapped here (the same heap offset on every rank).
char* on_rank(const tandem::DeviceComm& comm, int q, const void* local) {
  if (q == comm.rank) return static_cast<char*>(const_cast<void*>(local));
  return reinterpret_cast<char*>(mapped_heap(comm, q)) + (static_cast<const char*>(local) - comm.heap_base);
}

// The ring (protocol at the top of this file): W steps of the core's GEMM over every SM of the plan, step s's
// epilogue adding the right neighbour's step s-1 sum as CUTLASS's source C (read from its heap through the peer
// mapping: TMA descriptors on peer memory, one node only).
// The calls of the kernels whose every block computes (the ring's steps, the ticket kernel's calls): one chunk of
// `rows` rows a call, no arrival waits (the ring waits before the call; the tickets never wait), raster along N,
// tile claims numbered by the call (later calls larger: the ring tags' order).
template <class Args>
void set_step_scheduler(Args& args, int rows, const tandem::DeviceComm& comm, gemm::TileClaims* claims, int call,
                        const uint64_t* epoch_counter) {
  using Raster = decltype(args.scheduler.raster_order);
  args.scheduler.raster_order = Raster::AlongN;
  args.scheduler.arrival.chunks = 1;
  args.scheduler.arrival.chunk_rows = rows;
  args.scheduler.arrival.comm = comm;
  args.scheduler.arrival.claims = claims;
  args.scheduler.arrival.claim_call = call;
  args.scheduler.arrival.epoch_counter = epoch_counter;
}

// Call s's kernel parameters into p.gemm[s], after CUTLASS's checks; the first call fixes the grid (gg: the
// persistent grid as (2, clusters), no role rows) that every call is numbered over. `what` names the call.
template <class Kernel, class Args, class P>
Status set_step_params(Args& args, int s, const char* what, dim3& gg, P& p, std::string* why) {
  if (!Kernel::can_implement(args)) return fail(why, std::string("CUTLASS cannot implement this ") + what);
  if (Kernel::get_workspace_size(args) != 0) return fail(why, "unexpected CUTLASS workspace", Status::kInternal);
  if (s == 0) {
    gg = Kernel::get_grid_shape(Kernel::to_underlying_arguments(args, nullptr));
    if (gg.z != 1 || (gg.x != kClusterX && gg.y != 1) || (gg.x * gg.y) % kClusterX)
      return fail(why, "unexpected GEMM grid shape", Status::kInternal);
    gg = dim3(kClusterX, gg.x * gg.y / kClusterX, 1);
  }
  args.scheduler.arrival.gemm_grid_x = static_cast<int32_t>(gg.x);
  args.scheduler.arrival.gemm_grid_y = static_cast<int32_t>(gg.y);
  args.scheduler.arrival.gemm_block_y0 = 0;
  p.gemm[s] = Kernel::to_underlying_arguments(args, nullptr);
  p.chunk_tiles = static_cast<int64_t>(p.gemm[s].scheduler.blocks_per_problem_);
  return Status::kOk;
}

template <class Element, bool kClaims>
Status run_ring(const GemmRsArgs& a, bool all_reduce, cudaStream_t stream, std::string* why) {
  using G = gemm::detail::Sm90Gemm<Element, RsSchedulerTag<false, kClaims>>;
  using Kernel = typename G::Kernel;
  const int world = a.comm.world, rank = a.comm.rank;
  const int right = (rank + 1) % world;
  const int mr = a.m / world;
  const size_t chunk_bytes = static_cast<size_t>(mr) * a.n * sizeof(Element);
  char* ws = static_cast<char*>(a.workspace);
  // the right neighbour's partial buffer in this process's address space
  if (mapped_heap(a.comm, right) == 0) return fail(why, "the ring needs the right neighbour's heap mapped (one node)");
  for (int q = 0; all_reduce && q < world && q < tandem::kInlinePeerHeaps; ++q)  // AR gathers from every rank
    if (q != rank && mapped_heap(a.comm, q) == 0)
      return fail(why, "the ring's all-gather needs every rank's heap mapped (one node)");
  const char* right_partial = on_rank(a.comm, right, ws + kPartialOffset);
  RsParams<Kernel> p{};
  p.comm = a.comm;
  p.ctl = reinterpret_cast<Control*>(ws);
  p.partial = ws + kPartialOffset;
  p.out = static_cast<char*>(a.out);
  p.ranks_per_node = world;
  p.chunk_elems = static_cast<int64_t>(mr) * a.n;
  p.chunk_rows = mr;
  p.pieces = 1;
  p.mode = RsMode::kFused;
  p.timeline.stamps = timeline_for_launch(stream);
  // Tile claims (TANDEM_TP_CLAIM, on by default, as in the default kernel): the clusters claim each step's tiles,
  // so clusters that MPS made resident late leave their tiles to the others instead of delaying every step
  p.claims = kClaims ? reinterpret_cast<gemm::TileClaims*>(ws + kClaimOffset) : nullptr;
  const FusedKnobs knobs = FusedKnobs::from_env();
  p.late_cluster = knobs.late_cluster;
  p.late_us = knobs.late_us;
  // AR: the last step stores this rank's reduced rows into slot W-1 (never a ring slot), where every rank reads
  // them for its all-gather into out (M x N)
  if (all_reduce) p.gather_out = static_cast<char*>(a.out);
  char* last = all_reduce ? const_cast<char*>(p.partial) + static_cast<size_t>(world - 1) * chunk_bytes : p.out;
  dim3 gg{};
  for (int s = 0; s < world; ++s) {
    const int o = (rank + 1 + s) % world;  // step W-1: o = rank
    gemm::GemmArgs g;
    g.m = mr;
    g.n = a.n;
    g.k = a.k;
    g.dtype = a.dtype;
    g.a = static_cast<const char*>(a.a) + static_cast<size_t>(o) * mr * a.lda * sizeof(Element);
    g.lda = a.lda;
    g.b = a.b;
    g.ldb = a.ldb;
    g.d = s + 1 < world ? const_cast<char*>(p.partial) + static_cast<size_t>(s) * chunk_bytes : last;
    g.ldd = a.n;
    g.sm_count = a.plan.sm_count;  // 0: every SM of the device
    if (s > 0) {  // D_s = A[o] @ B + D_{s-1} of the right neighbour (slot s - 1 of its partial buffer)
      g.c = right_partial + static_cast<size_t>(s - 1) * chunk_bytes;
      g.ldc = a.n;
      g.beta = 1.0f;
    }
    auto args = G::arguments(g);
    // (the step's wait is before the GEMM: run_ring_steps)
    set_step_scheduler(args, mr, a.comm, p.claims, s, kClaims ? &p.ctl->epoch : nullptr);
    if (const Status st = set_step_params<Kernel>(args, s, "GEMM+RS ring step", gg, p, why); st != Status::kOk)
      return st;
  }
  if (kClaims && gg.y > static_cast<unsigned>(gemm::kClaimClusters))
    return fail(why, "too many GEMM clusters for the tile claims", Status::kInternal);
  p.reduce_rows_y = 0;
  p.reduce_blocks = 0;
  p.gemm_blocks = static_cast<int>(gg.x * gg.y);
  detail::g_last_fused_ring = true;
  detail::g_last_fused_claims = kClaims;
  const cudaError_t err = launch_clustered(gemm_rs_kernel<Element, Kernel, false, true>, gg, Kernel::MaxThreadsPerBlock,
                                           Kernel::SharedStorageSize, stream, p);
  return err == cudaSuccess ? Status::kOk
                            : fail(why, std::string("launch failed: ") + cudaGetErrorString(err), Status::kCudaError);
}

// The ticket mode (protocol at the top of this file): W calls of the core's GEMM (128x256 tiles, tile claims) over
// every SM of the plan, rank r's calls in the chunk order r+1, r+2, ..., r, each with the ticket fixup of its chunk.
template <class Element>
using TicketTiledMma = typename gemm::detail::Sm90Gemm<Element, gemm::ArrivalClaimsSchedulerTag>::Mainloop::TiledMma;

template <class Element, bool kRounds = false>
using TicketGemm =
    gemm::detail::Sm90Gemm<Element, gemm::TicketClaimsSchedulerTag<Element, TicketTiledMma<Element>, kRounds>>;
template <class Element, bool kRounds = false>
using TicketKernel = typename TicketGemm<Element, kRounds>::Kernel;

// The ticket kernel's rounds (TANDEM_RS_TICKET_ROUNDS=P > 1): P pieces of each chunk, of whole cluster rows (the
// pieces' plan with swizzle 1, the ticket calls' walk); fewer where the chunk has fewer cluster rows; 1 = none.
PiecePlan ticket_rounds(const GemmRsArgs& a, const FusedKnobs& knobs) {
  if (knobs.ticket_rounds <= 1) return PiecePlan{};
  FusedKnobs k{};
  k.pieces = std::min(knobs.ticket_rounds, kMaxPieces);
  k.swizzle = 1;
  SmPlan plan = a.plan;
  plan.comm_blocks = 0;
  return piece_plan(a, plan, /*one_shot=*/false, k, kTicketTileM, kTicketTileN);
}

template <class Element, bool kRounds>
Status run_ticket(const GemmRsArgs& a, const FusedKnobs& knobs, bool all_reduce, cudaStream_t stream,
                  std::string* why) {
  using G = TicketGemm<Element, kRounds>;
  using Kernel = typename G::Kernel;
  static_assert(kConfigTileM<gemm::detail::CooperativeConfig> == kTicketTileM &&
                    kConfigTileN<gemm::detail::CooperativeConfig> == kTicketTileN,
                "the ticket layout's tiles are the core's");
  const int world = a.comm.world, rank = a.comm.rank;
  const int mr = a.m / world;
  const TicketLayout l = ticket_layout(a);
  char* ws = static_cast<char*>(a.workspace);
  // Every rank's heap is mapped here (one node); the fences and atomics cover another GPU only if a rank is on one.
  bool sys = false;
  for (int q = 0; q < world; ++q) {
    if (q == rank) continue;
    if (mapped_heap(a.comm, q) == 0) return fail(why, "the ticket reduction needs every rank's heap mapped (one node)");
    if ((a.comm.peer_heap_inline[q] & tandem::kPeerSameDeviceBit) == 0) sys = true;
  }
  RsParams<Kernel> p{};
  p.comm = a.comm;
  p.ctl = reinterpret_cast<Control*>(ws);
  p.partial = ws + l.staging;  // the kernel's end reads the staging (this rank's, or a peer's for AR)
  p.out = static_cast<char*>(a.out);
  p.ranks_per_node = world;
  p.chunk_elems = static_cast<int64_t>(mr) * a.n;
  p.chunk_rows = mr;
  const PiecePlan rounds = kRounds ? ticket_rounds(a, knobs) : PiecePlan{};
  if (kRounds && rounds.pieces <= 1) return fail(why, "the ticket kernel in rounds without rounds", Status::kInternal);
  p.pieces = rounds.pieces;
  p.piece_rows = rounds.rows;
  p.piece_of_block = reinterpret_cast<int32_t*>(ws + kPieceTableOffset);
  p.mode = RsMode::kFused;
  p.timeline.stamps = timeline_for_launch(stream);
  p.claims = reinterpret_cast<gemm::TileClaims*>(ws + kClaimOffset);
  p.late_cluster = knobs.late_cluster;
  p.late_us = knobs.late_us;
  if (all_reduce) p.gather_out = static_cast<char*>(a.out);
  dim3 gg{};
  for (int s = 0; s < world; ++s) {
    // the last call: o = rank; TANDEM_RS_ORDER=common: chunk s on every rank, so that the ranks finish a tile at
    // about the same time and its last arriver finds the other partials in L2 (one GPU)
    const int o = knobs.common_order ? s : (rank + 1 + s) % world;
    gemm::GemmArgs g;
    g.m = mr;
    g.n = a.n;
    g.k = a.k;
    g.dtype = a.dtype;
    g.a = static_cast<const char*>(a.a) + static_cast<size_t>(o) * mr * a.lda * sizeof(Element);
    g.lda = a.lda;
    g.b = a.b;
    g.ldb = a.ldb;
    g.d = ws + l.staging;  // never stored by CUTLASS's epilogue (the fixup stores the sums); a valid (M/W) x N
    g.ldd = a.n;
    g.sm_count = a.plan.sm_count;  // 0: every SM of the device
    auto args = G::arguments(g);
    set_step_scheduler(args, mr, a.comm, p.claims, s, &p.ctl->epoch);
    if constexpr (kRounds) {  // round j's call s: piece j of chunk o, claim counter j * W + s
      args.scheduler.arrival.piece_len = rounds.len;
      args.scheduler.arrival.piece_of_block = p.piece_of_block;
      args.scheduler.arrival.claim_stride = world;
    }
    gemm::TicketReduce& t = args.scheduler.ticket;
    t.slots = ws + l.slots + static_cast<size_t>(o) * l.chunk_slot_bytes;
    t.tickets = reinterpret_cast<uint64_t*>(on_rank(a.comm, o, ws + l.tickets));
    t.reduced_count = reinterpret_cast<uint64_t*>(on_rank(a.comm, o, &p.ctl->ticket_reduced));
    t.staging = on_rank(a.comm, o, ws + l.staging);
    // this rank's own chunk: its sums go to its output rows (AR: rows o of the M x N output)
    if (o == rank && knobs.ticket_direct)
      t.direct = static_cast<char*>(a.out) + (all_reduce ? static_cast<size_t>(rank) * mr * a.n * sizeof(Element) : 0);
    t.staged = reinterpret_cast<uint32_t*>(on_rank(a.comm, o, ws + l.staged));
    t.reduced_flag = &p.ctl->reduced[o];
    t.scratch = reinterpret_cast<uint32_t*>(ws + l.scratch);
    t.rows = mr;
    t.cols = a.n;
    t.tiles_m = l.tiles_m;
    t.tiles_n = l.tiles_n;
    t.owner = o;
    t.notify_all = all_reduce ? 1 : 0;
    t.sys_scope = sys ? 1 : 0;
    if (const Status st = set_step_params<Kernel>(args, s, "GEMM+RS ticket call", gg, p, why); st != Status::kOk)
      return st;
    if constexpr (kRounds) {
      // the pieces' assumptions about CUTLASS's walk, checked against the scheduler it made (as run_typed does)
      const auto& sp = p.gemm[s].scheduler;
      const int64_t tiles_n = static_cast<int64_t>(sp.divmod_cluster_blk_major_.divisor);
      if (sp.raster_order_ != decltype(sp.raster_order_)::AlongN ||
          rounds.len != (rounds.rows / kTicketTileM) * tiles_n ||
          (rounds.rows / (2 * kTicketTileM)) % (1 << sp.log_swizzle_size_) != 0)
        return fail(why, "the ticket rounds do not match the GEMM scheduler's order", Status::kInternal);
    }
  }
  if (gg.y > static_cast<unsigned>(gemm::kClaimClusters))
    return fail(why, "too many GEMM clusters for the tile claims", Status::kInternal);
  if (gg.x * gg.y > static_cast<unsigned>(kMaxGemmBlocks))
    return fail(why, "too many GEMM blocks for the ticket broadcast words", Status::kInternal);
  if (world * (kRounds ? rounds.pieces : 1) > gemm::kClaimCalls)
    return fail(why, "too many ticket calls for the tile claims", Status::kInternal);
  p.reduce_rows_y = 0;
  p.reduce_blocks = 0;
  p.gemm_blocks = static_cast<int>(gg.x * gg.y);
  p.ticket_staged = reinterpret_cast<uint32_t*>(ws + l.staged);
  p.ticket_tiles_m = l.tiles_m;
  p.ticket_tiles_n = l.tiles_n;
  p.end_waiters = knobs.ticket_end_waiters < 0 ? (p.gemm_blocks + 7) / 8
                                                : std::min(knobs.ticket_end_waiters, p.gemm_blocks);
  detail::g_last_fused_ticket = true;
  detail::g_last_fused_claims = true;
  detail::g_last_fused_pieces = kRounds ? rounds.pieces : 1;  // (the rounds, as pieces: tests and traces read it)
  const cudaError_t err = launch_clustered(gemm_rs_ticket_kernel<Element, Kernel>, gg, Kernel::MaxThreadsPerBlock,
                                           Kernel::SharedStorageSize, stream, p);
  return err == cudaSuccess ? Status::kOk
                            : fail(why, std::string("launch failed: ") + cudaGetErrorString(err), Status::kCudaError);
}

}  // namespace


template <class Element, bool kPieces, bool kClaims, class Config = gemm::detail::CooperativeConfig>
cudaError_t preload_rs_kernel() {
  using K = typename gemm::detail::Sm90Gemm<Element, RsSchedulerTag<kPieces, kClaims>, Config>::Kernel;
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, gemm_rs_kernel<Element, K, kPieces>);
}

template <class Element, bool kRounds>
cudaError_t preload_rs_ticket_kernel() {
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, gemm_rs_ticket_kernel<Element, TicketKernel<Element, kRounds>>);
}

template <class Element, bool kClaims>
cudaError_t preload_rs_ring_kernel() {
  using K = typename gemm::detail::Sm90Gemm<Element, RsSchedulerTag<false, kClaims>>::Kernel;
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, gemm_rs_kernel<Element, K, false, true>);
}

cudaError_t preload_rs_kernels() {
  // Every variant, whatever TANDEM_TP_CLAIM / TANDEM_TP_GEMM_TILE say now (read at every launch; preloaded once
  // a process: as preload_ag_kernels).
  const cudaError_t e[] = {preload_rs_kernel<cutlass::bfloat16_t, false, true, Tile256x128Config>(),
                           preload_rs_kernel<cutlass::half_t, false, true, Tile256x128Config>(),
                           preload_rs_kernel<cutlass::bfloat16_t, true, true, Tile256x128Config>(),
                           preload_rs_kernel<cutlass::half_t, true, true, Tile256x128Config>(),
                           preload_rs_kernel<cutlass::bfloat16_t, false, false>(),
                           preload_rs_kernel<cutlass::half_t, false, false>(),
                           preload_rs_kernel<cutlass::bfloat16_t, false, true>(),
                           preload_rs_kernel<cutlass::half_t, false, true>(),
                           preload_rs_kernel<cutlass::bfloat16_t, true, true>(),
                           preload_rs_kernel<cutlass::half_t, true, true>(),
                           preload_rs_kernel<cutlass::bfloat16_t, true, false>(),
                           preload_rs_kernel<cutlass::half_t, true, false>(),
                           preload_rs_ring_kernel<cutlass::bfloat16_t, true>(),
                           preload_rs_ring_kernel<cutlass::half_t, true>(),
                           preload_rs_ticket_kernel<cutlass::bfloat16_t, false>(),
                           preload_rs_ticket_kernel<cutlass::half_t, false>(),
                           preload_rs_ticket_kernel<cutlass::bfloat16_t, true>(),
                           preload_rs_ticket_kernel<cutlass::half_t, true>()};
  for (cudaError_t x : e)
    if (x != cudaSuccess) return x;
  return cudaSuccess;
}

cudaError_t preload_kernels() {
  const cudaError_t e[] = {gemm::preload_kernels(), preload_ag_kernels(), preload_rs_kernels()};
  for (cudaError_t x : e)
    if (x != cudaSuccess) return x;
  return cudaSuccess;
}

// The default layout's bytes; with tickets (TANDEM_RS_TICKET=1 or GemmRsArgs::ticket = 1, which the ranks agree
// on; tp.py keys that workspace apart)
// the ticket layout's, which holds every mode's (a workspace made without the knob stays valid for the modes that
// are not the ticket's: check_rs asks for the ticket's bytes only for a fused launch with the knob).
size_t workspace_bytes(const GemmRsArgs& a, bool ticket) {
  return ticket ? ticket_layout(a).end : default_workspace_size(a);
}
// The environment's knobs with the call's own choices over them (GemmRsArgs::ticket, ticket_rounds: auto's plan).
static FusedKnobs knobs_of(const GemmRsArgs& a) {
  FusedKnobs k = FusedKnobs::from_env();
  if (a.ticket >= 0) k.ticket = a.ticket == 1;
  if (a.ticket_rounds >= 0) k.ticket_rounds = a.ticket_rounds;
  return k;
}
size_t workspace_size(const GemmRsArgs& a) { return workspace_bytes(a, knobs_of(a).ticket); }

// `knobs`: the launch's (dispatch reads them once), or this moment's for can_implement.
static Status check_rs(const GemmRsArgs& a, bool fused, const FusedKnobs& knobs, std::string* why) {
  const int world = a.comm.world;
  if (Status s = check_world(a.comm, why); s != Status::kOk) return s;
  if (fused && world > kMaxFusedRsWorld) return fail(why, "the fused GEMM+RS takes at most 8 ranks (use the unfused path)");
  if (a.m <= 0 || a.n <= 0 || a.k <= 0) return fail(why, "M, N and K must be positive");
  if (a.m % world) return fail(why, "M must be a multiple of the world size");
  if (a.k % 8 || a.n % 8 || a.lda % 8 || a.ldb % 8) return fail(why, "K, N and leading dimensions must be multiples of 8");
  if (a.lda < a.k || a.ldb < a.n) return fail(why, "leading dimensions too small");
  const SmPlan plan = a.plan.comm_blocks > 0 ? a.plan : default_plan(a.plan.sm_count);
  if (a.ranks_per_node < 0 || a.ranks_per_node > world || (a.ranks_per_node > 0 && world % a.ranks_per_node))
    return fail(why, "ranks_per_node must divide the world size");
  if (topology_of(a).N > 1) {
    if (!tandem::device::has_proxy(a.comm)) return fail(why, "ranks on other nodes need the communicator's proxy path");
    if (plan.comm_blocks > kMaxNodeReduceBlocks)
      return fail(why, "across nodes the reduction takes at most 64 reduce blocks (comm_blocks)");
  }
  return check_common(a.comm, a.dtype, {a.a, a.b, a.out}, "A, B, out", a.workspace,
                      workspace_bytes(a, fused && knobs.ticket), plan, why);
}

Status can_implement(const GemmRsArgs& a, std::string* why) { return check_rs(a, true, knobs_of(a), why); }

template <bool kAllReduce>
static Status dispatch(const GemmRsArgs& a, bool fused, bool one_shot, cudaStream_t stream, std::string* why,
                       Stages stages = Stages::kAll) {
  const FusedKnobs knobs = knobs_of(a);  // read once a launch: the checks and the dispatch agree
  if (const Status s = check_rs(a, fused, knobs, why); s != Status::kOk) return s;
  if (one_shot && a.comm.world > kMaxFusedRsWorld) return fail(why, "the one-shot all-reduce takes at most 8 ranks");
  if (one_shot && topology_of(a).N > 1)
    return fail(why, "the one-shot all-reduce reads every partial by load/store: one node only (use two_shot)");
  // The fused kernel in pieces is its own instantiation (TANDEM_RS_PIECES; see piece_plan).
  const SmPlan plan = a.plan.comm_blocks > 0 ? a.plan : default_plan(a.plan.sm_count);
  // 256x128 tiles (TANDEM_TP_GEMM_TILE=256x128) in the fused kernel with tile claims only
  const bool tile256 = fused && tile_claims_enabled() && knobs.gemm_tile_m == 256;
  const int piece_count =
      fused ? piece_plan(a, plan, one_shot, knobs, tile256 ? 256 : 128, tile256 ? 128 : 256).pieces : 0;
  const bool pieces = piece_count > 1;
  // Tile claims (default; TANDEM_TP_CLAIM=0 off) in the fused kernel only: the unfused GEMM is a kernel of its
  // own. Across nodes too: a chunk's claims are numbered by the step at which this rank computes it
  // (rs_chunk_at of the node topology), so the ring tags still grow call by call.
  const bool claims = fused && tile_claims_enabled();
  // The ring (TANDEM_RS_RING=1): GEMM+RS and two-shot GEMM+AR, one node, 2-8 ranks (the peers' heaps in
  // DeviceComm), the whole launch, tile claims only (the top of this file: without claims, the default kernel);
  // its steps are the core's 128x256 GEMM over every SM of the plan.
  // Tickets (TANDEM_RS_TICKET=1; before the ring if both are set): the same conditions but the knob, and tile claims
  // always (the scheduler is built on them).
  const bool one_node_whole = fused && !one_shot && topology_of(a).N == 1 && a.comm.world >= 2 &&
                              a.comm.world <= tandem::kInlinePeerHeaps && a.comm.world <= kMaxFusedRsWorld &&
                              stages == Stages::kAll;
  const bool ticket = one_node_whole && knobs.ticket;
  const bool ring = one_node_whole && claims && knobs.ring && !ticket;
  if (fused) {
    detail::g_last_fused_ticket = false;  // (run_ticket and run_ring record themselves once they launch)
    detail::g_last_fused_ring = false;
    detail::g_last_fused_pieces = ring || ticket ? 1 : piece_count;
    detail::g_last_fused_claims = claims;
    detail::g_last_fused_gemm_tile_m = ring || ticket || !tile256 ? 128 : 256;
    detail::g_last_fused_joined = false;
  }
  if (ticket) {
    if (ticket_rounds(a, knobs).pieces > 1)
      return a.dtype == DType::kFP16 ? run_ticket<cutlass::half_t, true>(a, knobs, kAllReduce, stream, why)
                                     : run_ticket<cutlass::bfloat16_t, true>(a, knobs, kAllReduce, stream, why);
    return a.dtype == DType::kFP16 ? run_ticket<cutlass::half_t, false>(a, knobs, kAllReduce, stream, why)
                                   : run_ticket<cutlass::bfloat16_t, false>(a, knobs, kAllReduce, stream, why);
  }
  if (ring)
    return a.dtype == DType::kFP16 ? run_ring<cutlass::half_t, true>(a, kAllReduce, stream, why)
                                   : run_ring<cutlass::bfloat16_t, true>(a, kAllReduce, stream, why);
  const auto typed = [&](auto element) {
    using Element = decltype(element);
    if (tile256)
      return pieces ? run_typed<Element, true, true, Tile256x128Config>(a, stream, fused, kAllReduce, one_shot, why,
                                                                        stages)
                    : run_typed<Element, false, true, Tile256x128Config>(a, stream, fused, kAllReduce, one_shot, why,
                                                                         stages);
    if (claims)
      return pieces ? run_typed<Element, true, true>(a, stream, fused, kAllReduce, one_shot, why, stages)
                    : run_typed<Element, false, true>(a, stream, fused, kAllReduce, one_shot, why, stages);
    return pieces ? run_typed<Element, true>(a, stream, fused, kAllReduce, one_shot, why, stages)
                  : run_typed<Element>(a, stream, fused, kAllReduce, one_shot, why, stages);
  };
  return a.dtype == DType::kFP16 ? typed(cutlass::half_t{}) : typed(cutlass::bfloat16_t{});
}

Status run(const GemmRsArgs& a, cudaStream_t stream, std::string* why) {
  return dispatch<false>(a, true, false, stream, why);
}

Status run_unfused(const GemmRsArgs& a, cudaStream_t stream, std::string* why) {
  return dispatch<false>(a, false, false, stream, why);
}

// GEMM+AllReduce: the same checks (out is M x N instead of M/W x N; the workspace is the same).
Status can_implement(const GemmArArgs& a, std::string* why) {
  if (const Status s = check_rs(a, true, knobs_of(a), why); s != Status::kOk) return s;
  if (a.algo == ArAlgo::kOneShot && topology_of(a).N > 1)
    return fail(why, "the one-shot all-reduce reads every partial by load/store: one node only (use two_shot)");
  return Status::kOk;
}
size_t workspace_size(const GemmArArgs& a) { return workspace_size(static_cast<const GemmRsArgs&>(a)); }

bool use_one_shot(const GemmArArgs& a) {
  if (a.algo != ArAlgo::kAuto) return a.algo == ArAlgo::kOneShot;
  return a.comm.world <= kMaxFusedRsWorld && topology_of(a).N == 1 &&
         static_cast<size_t>(a.m) * a.n * 2 <= kArOneShotMaxBytes;
}

Status run(const GemmArArgs& a, cudaStream_t stream, std::string* why) {
  return dispatch<true>(a, true, use_one_shot(a), stream, why);
}
Status run_unfused(const GemmArArgs& a, cudaStream_t stream, std::string* why) {
  return dispatch<true>(a, false, use_one_shot(a), stream, why);
}

Status run_reduce_only(const GemmRsArgs& a, cudaStream_t stream, std::string* why) {
  return dispatch<false>(a, false, false, stream, why, Stages::kReduceOnly);
}
Status run_reduce_only(const GemmArArgs& a, cudaStream_t stream, std::string* why) {
  return dispatch<true>(a, false, use_one_shot(a), stream, why, Stages::kReduceOnly);
}
size_t partial_offset(const GemmRsArgs&) { return kPartialOffset; }
Status run_wait_partial(const GemmRsArgs& a, cudaStream_t stream, std::string* why) {
  return dispatch<false>(a, false, false, stream, why, Stages::kWaitOnly);
}

}  // namespace tandem::kernels::tp
