// GEMM+ReduceScatter as one persistent kernel (sm90a): GEMM blocks compute the partial product chunk by chunk in
// the order the owners need them, reduce blocks beside them add up this rank's rows from every rank in a fixed
// order. tp_gemm.h has the contract, tp_common.cuh the epoch protocol.
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

#include "../gemm/sm90_config.hpp"
#include "tandem/kernels/roles/stream.cuh"
#include "tp_common.cuh"

namespace tandem::kernels::tp {

namespace {

using namespace detail;

constexpr int kMaxFusedRsWorld = 8;  // chunk GEMM parameter sets travel in the kernel argument
// The joined reduction's items: about this many 16-byte vectors (128 KiB of output, W x that read), so that a
// claim and its barriers stay small against the item's memory time.
constexpr int64_t kJoinItemVectors = 8192;

enum class RsMode : int { kFused = 0, kReduceOnly = 1, kWaitReady = 2 };

template <class GemmKernel>
struct RsParams {
  typename GemmKernel::Params gemm[kMaxFusedRsWorld];
  tandem::DeviceComm comm;
  Control* ctl;
  const char* partial;  // symmetric: M x N, row-major
  float* acc;           // local: (M / W) x N fp32
  char* out;            // (M / W) x N: RS the user's output; AR this rank's chunk of the partial buffer
  char* gather_out;     // AR: the user's M x N output (rows of chunk c at c * chunk_elems); RS: null
  int64_t chunk_elems;  // (M / W) * N
  int64_t chunk_rows;   // M / W
  int reduce_rows_y;  // blocks with blockIdx.y below this reduce; the GEMM's follow (fused)
  int gemm_blocks;
  int reduce_blocks;
  RsMode mode;
  bool one_shot;        // AR one-shot: every rank reduces every row itself (in the owners' order)
  int ranks_per_node;   // L; world / L nodes
  char* recv;           // symmetric, N > 1: node partials of my rows, slot n = node n's (N x chunk)
  NodeFlags* node_flags;
  bool common_order;    // diagnostic (TANDEM_RS_ORDER=common): chunks 0, 1, ... on every rank
  bool fused_one_pass;  // diagnostic (TANDEM_RS_REDUCE=onepass): the fused reduction waits for all, one pass
  runtime::Timeline timeline;  // diagnostic (TANDEM_TP_TRACE=1); slots below
  // Pieces (one node, two-shot; 1 = whole chunks): every chunk's GEMM in `pieces` pieces of piece_rows rows (the
  // scheduler's piece_len), computed by every rank in the order piece 0 of chunks 0, 1, ..., then piece 1, ...;
  // piece j of chunk o is announced by piece_arrive[r] = rows_flag(e, its last row + 1) on o (the last piece also
  // by arrive[r] = e, as a whole chunk is), and o reduces it in one pass.
  int pieces;
  int piece_rows;
  int32_t* piece_of_block;  // workspace: kMaxGemmBlocks entries
  // Tile claims (default; TANDEM_TP_CLAIM=0 off): the GEMM's clusters claim tiles from shared counters, so a chunk
  // (piece) is complete when its tiles are (counted in units: tiles_of_block), not when every GEMM block has passed it.
  gemm::TileClaims* claims;  // null: the static persistent stride
  int64_t chunk_tiles;       // the scheduler's work tiles of a chunk (blocks_per_problem)
  int64_t piece_tiles;       // ... of a piece (pieces)
  int late_cluster;          // TANDEM_TP_LATE (tests): GEMM clusters from this row start late_us late
  uint32_t late_us;
  // Joined reduction (TANDEM_RS_JOIN=1; pieces with claims): this rank's rows in join_items items a piece, claimed
  // by the reduce blocks and by GEMM blocks done with their GEMM (run_joined).
  bool join;
  int join_items;
};

// Timeline slots (runtime::Timeline). GEMM blocks: 0 start; step s: 1+3s chunk free (waits done), 2+3s chunk
// computed, 3+3s its stores complete. Reduce blocks: 0 start; source s acquired 1+2s, added 2+2s (one pass:
// 1 all acquired, 2 reduced); AR gather 40 start, 41 end. Every block: 46 before the end-of-launch protocol.
constexpr int kSlotGatherStart = 40, kSlotGatherEnd = 41, kSlotEnd = 46;

// The chunk the GEMM computes at step s: other nodes first (node n+1, ...; local index 0 .. L-1), then this node's
// chunks l+1, l+2, ..., l (one node: r+1, r+2, ..., r).
__host__ __device__ __forceinline__ int rs_chunk_at(const Topology& t, int s, bool common_order) {
  if (common_order && t.N == 1) return s;
  const int remote = (t.N - 1) * t.L;
  if (s < remote) return t.rank_of(t.node_at(1 + s / t.L), s % t.L);
  return t.rank_of(t.node, t.local_at(1 + s - remote));
}

// Tell the reducer of chunk o that this rank's partial of it is complete: its owner on this node, else this
// node's representative of o.
template <class P>
__device__ __forceinline__ void announce_chunk(const P& p, const Topology& t, int o, uint64_t e) {
  using namespace tandem::device;
  if (t.node_of(o) == t.node) {
    (void)signal(p.comm, &p.ctl->arrive[p.comm.rank], e, SignalOp::kSet, o);
  } else {
    (void)signal(p.comm, &p.ctl->node_arrive[t.node_of(o) * t.L + t.local], e, SignalOp::kSet,
                 t.rank_of(t.node, t.local_of(o)));
  }
}

// Pieces with tile claims: clusters run ahead into later calls while a slow one still holds a tile of an earlier
// piece, so the pieces of a chunk can complete out of order. piece_arrive counts rows, a prefix of the chunk,
// so it may only grow over complete pieces: each completer (thread 0 of the block whose tiles completed piece j
// of chunk o) marks its piece, and the one whose mark extends the contiguous prefix signals it, under a local
// lock so that two such signals land in the order they were made (causality orders the two stores to the
// owner's flag: the later, larger value wins). The last prefix also announces the whole chunk and clears the
// chunk's marks for the next launch.
template <class P>
__device__ __forceinline__ void publish_piece_prefix(const P& p, const Topology& t, int o, int j, uint64_t e) {
  using namespace tandem::device;
  Control* ctl = p.ctl;
  const uint64_t bit = 1ull << j;
  const uint64_t mask = runtime::atom_or_acq_rel_gpu(&ctl->piece_done[o], bit) | bit;
  const int prefix = __ffsll(static_cast<long long>(~mask)) - 1;  // trailing ones (pieces <= kMaxPieces < 64)
  if (j >= prefix) return;  // an earlier piece is missing: its completer publishes this one too
  if (!runtime::lock_local(&ctl->piece_lock[o], p.comm)) return;
  if (static_cast<uint64_t>(prefix) > local_load(&ctl->piece_signaled[o])) {
    const int64_t rows = static_cast<int64_t>(prefix) * p.piece_rows;
    const bool last = prefix >= p.pieces;
    (void)signal(p.comm, &ctl->piece_arrive[p.comm.rank], rows_flag(e, last ? p.chunk_rows : rows), SignalOp::kSet, o);
    if (last) {
      announce_chunk(p, t, o, e);  // an owner reducing whole chunks waits for this
      local_store(&ctl->piece_done[o], 0);
      local_store(&ctl->piece_signaled[o], 0);
    } else {
      local_store(&ctl->piece_signaled[o], static_cast<uint64_t>(prefix));
    }
  }
  runtime::unlock_local(&ctl->piece_lock[o]);
}

// The CUDA type of a CUTLASS element (the role primitives of roles/stream.cuh take CUDA's).
template <class Element>
struct CudaType;
template <>
struct CudaType<cutlass::bfloat16_t> {
  using type = __nv_bfloat16;
};
template <>
struct CudaType<cutlass::half_t> {
  using type = __half;
};

// Stream `steps` sources into this block's slice [lo, hi) of the reduction (fp32 in acc; the last step rounds
// into out and out2). source(s) waits for source s (thread 0) and returns its slice base, or null to stop.
template <class Element, class Source>
__device__ __forceinline__ bool reduce_stream(int steps, int64_t lo, int64_t hi, float* acc, char* out, char* out2,
                                              const runtime::Timeline& tl, Source&& source) {
  using T = typename CudaType<Element>::type;
  for (int s = 0; s < steps; ++s) {
    const uint4* src = source(s);
    if (src == nullptr) return false;
    if (2 + 2 * s < kSlotGatherStart) tl.stamp(1 + 2 * s);  // (slots 40 and up are the gather's and the end's)
    roles::accumulate_vectors<T>(src, lo, hi, reinterpret_cast<float4*>(acc), s == 0, s + 1 == steps,
                                 reinterpret_cast<uint4*>(out), reinterpret_cast<uint4*>(out2));
    __syncthreads();
    if (2 + 2 * s < kSlotGatherStart) tl.stamp(2 + 2 * s);
  }
  return true;
}

// Copy this block's slice [lo, hi) (16-byte vectors) of src to dst.
__device__ __forceinline__ void copy_slice(uint4* dst, const uint4* src, int64_t lo, int64_t hi) {
  roles::copy_vectors<8>(dst, src, lo, hi);
}

template <class Element, class P>
__device__ void gather_reduced(const P& p, const Topology& t, int rb, int64_t lo, int64_t hi, uint64_t e,
                               bool published = false);

// The fixed summation order of owner c's rows: source s (0 .. W-1) is rank c-1-s, so c's own partial comes last.
__device__ __forceinline__ int reduce_source(int owner, int world, int s) {
  return ((owner - 1 - s) % world + world) % world;
}

// Every rank's partial of owner's rows (`rows`: their place in the symmetric partial buffer), in that order; false
// if a peer has no load/store mapping (refused on the host).
__device__ __forceinline__ bool partial_sources(const tandem::DeviceComm& comm, const char* rows, int owner,
                                                const uint4** src) {
  for (int s = 0; s < comm.world; ++s) {
    src[s] = reinterpret_cast<const uint4*>(tandem::device::peer_ptr(comm, rows, reduce_source(owner, comm.world, s)));
    if (src[s] == nullptr) return false;
  }
  return true;
}

// One node, one pass in registers over every rank's partial of this rank's rows, in the fixed order q = r-1,
// r-2, ..., r (the same fp32 adds as the step-by-step path: the same bits), W reads and one write per element
// instead of about 5 W through an fp32 accumulator in memory. The rows go in `pieces` pieces of piece_rows rows,
// split over the reduce blocks like the whole chunk would be: piece j once every rank announced it
// (piece_arrive[q] >= rows_flag(e, its end): the fused kernel in pieces), or with one piece once every partial is
// complete (arrive[q] >= e: the unfused path, whose GEMMs ran before this kernel, and the fused one-pass knob).
// One code path for all of them: a second copy of the unrolled reduction spills more of the fused kernel's
// registers.
template <class Element, bool kPieceFlags, class P>
__device__ bool reduce_pieces(const P& p, int rb, int pieces, int64_t piece_rows, char* out, char* out2, uint64_t e) {
  using namespace tandem::device;
  using T = typename CudaType<Element>::type;
  const DeviceComm& comm = p.comm;
  const int rank = comm.rank, world = comm.world;
  const size_t chunk_bytes = static_cast<size_t>(p.chunk_elems) * sizeof(Element);
  const char* my_rows = p.partial + static_cast<size_t>(rank) * chunk_bytes;
  const int64_t vec_per_row = p.chunk_elems / (p.chunk_rows * 8);
  // Every thread resolves the sources itself: a __shared__ table would add static shared memory to the fused
  // kernel, whose GEMM blocks already take the most dynamic shared memory a block may have (the launch fails).
  const uint4* src[kMaxFusedRsWorld];
  if (!partial_sources(comm, my_rows, rank, src)) return false;  // refused on the host (load/store peers only)
  for (int j = 0; j < pieces; ++j) {
    const int64_t r0 = static_cast<int64_t>(j) * piece_rows;
    const int64_t r1 = r0 + piece_rows < p.chunk_rows ? r0 + piece_rows : p.chunk_rows;
    if (r0 >= r1) break;
    Status st = Status::kOk;
    if (threadIdx.x == 0) {
      for (int s = 0; s < world && st == Status::kOk; ++s) {
        const int q = reduce_source(rank, world, s);
        if constexpr (kPieceFlags)
          st = wait_until_backoff(comm, &p.ctl->piece_arrive[q], Cmp::kGe, rows_flag(e, r1), kRolePollNs, q);
        else
          st = wait_until_backoff(comm, &p.ctl->arrive[q], Cmp::kGe, e, kRolePollNs, q);
      }
    }
    if (!block_ok(st)) return false;
    if (2 + 2 * j < kSlotGatherStart) p.timeline.stamp(1 + 2 * j);
    const int64_t v0 = r0 * vec_per_row, nv = (r1 - r0) * vec_per_row;
    const int64_t lo = v0 + nv * rb / p.reduce_blocks, hi = v0 + nv * (rb + 1) / p.reduce_blocks;
    const bool ok =
        roles::reduce_vectors_n<T>(world, src, lo, hi, reinterpret_cast<uint4*>(out), reinterpret_cast<uint4*>(out2));
    __syncthreads();
    if (!ok) return false;  // more sources than the one-pass reduction takes (refused by its callers)
    if (2 + 2 * j < kSlotGatherStart) p.timeline.stamp(2 + 2 * j);
  }
  return true;
}

// The joined reduction (one node, pieces, tile claims; TANDEM_RS_JOIN=1). This rank's rows are cut into items:
// p.join_items slices of each piece, in piece order. Reduce blocks and GEMM blocks that are done with their GEMM
// take items from one counter (ctl->reduce_claim) and reduce each in one pass in registers, in the fixed order:
// the same fp32 adds as reduce_pieces, so the same bits. A reduce block takes the next item and waits for its
// piece; a GEMM block takes an item only if every rank's piece is already there (device::test, one acquire load
// a rank) and leaves otherwise: it must not hold an SM waiting, since a peer's cluster may need one (MPS gives
// no co-residency). So the reduce blocks alone finish the reduction, and the GEMM blocks only speed it up. The
// block whose item completes the count (last_of_units) publishes AR's reduced rows; the reduce blocks gather.
// `bcast`: 8 bytes of the block's shared memory (GEMM blocks: after their GEMM, whose storage is free by then).
template <class Element, class P>
__device__ void run_joined(const P& p, uint64_t e, bool reduce_block, int rb, volatile int64_t* bcast) {
  using namespace tandem::device;
  using T = typename CudaType<Element>::type;
  const DeviceComm& comm = p.comm;
  const int rank = comm.rank, world = comm.world;
  Control* ctl = p.ctl;
  const size_t chunk_bytes = static_cast<size_t>(p.chunk_elems) * sizeof(Element);
  const char* my_rows = p.partial + static_cast<size_t>(rank) * chunk_bytes;
  char* own_out = p.gather_out != nullptr ? p.gather_out + static_cast<size_t>(rank) * chunk_bytes : nullptr;
  const int64_t vec_per_row = p.chunk_elems / (p.chunk_rows * 8);
  const int64_t total = static_cast<int64_t>(p.pieces) * p.join_items;
  const uint4* src[kMaxFusedRsWorld];
  if (!partial_sources(comm, my_rows, rank, src)) return;  // refused on the host (load/store peers only)
  const auto piece_end = [&](int64_t item) {
    const int64_t r1 = (item / p.join_items + 1) * static_cast<int64_t>(p.piece_rows);
    return r1 < p.chunk_rows ? r1 : p.chunk_rows;
  };
  p.timeline.stamp(42);
  uint64_t done = 0;
  Status st = Status::kOk;
  for (;;) {
    if (threadIdx.x == 0) {
      int64_t item = -1;
      for (;;) {
        const int64_t c = static_cast<int64_t>(local_load(&ctl->reduce_claim));
        if (c >= total) break;
        if (!reduce_block) {  // a GEMM block: only an item whose piece every rank has announced
          bool ready = true;
          for (int q = 0; q < world && ready; ++q) ready = test(comm, &ctl->piece_arrive[q], Cmp::kGe, rows_flag(e, piece_end(c)), q);
          if (!ready) break;
        }
        if (atomicCAS(reinterpret_cast<unsigned long long*>(&ctl->reduce_claim), static_cast<unsigned long long>(c),
                      static_cast<unsigned long long>(c + 1)) == static_cast<unsigned long long>(c)) {
          item = c;
          break;
        }
      }
      if (item >= 0 && reduce_block) {
        for (int s = 0; s < world && st == Status::kOk; ++s) {
          const int q = reduce_source(rank, world, s);
          st = wait_until_backoff(comm, &ctl->piece_arrive[q], Cmp::kGe, rows_flag(e, piece_end(item)), kRolePollNs, q);
        }
        if (st != Status::kOk) item = -1;
      }
      *bcast = item;
    }
    __syncthreads();
    const int64_t item = *bcast;
    __syncthreads();  // everyone has read bcast before thread 0 writes the next item
    if (item < 0) break;
    const int64_t r0 = (item / p.join_items) * static_cast<int64_t>(p.piece_rows), r1 = piece_end(item);
    const int64_t v0 = r0 * vec_per_row, nv = (r1 - r0) * vec_per_row, part = item % p.join_items;
    const int64_t lo = v0 + nv * part / p.join_items, hi = v0 + nv * (part + 1) / p.join_items;
    (void)roles::reduce_vectors_n<T>(world, src, lo, hi, reinterpret_cast<uint4*>(p.out),
                                     reinterpret_cast<uint4*>(own_out));
    __syncthreads();
    ++done;
  }
  p.timeline.stamp(43);
  // AR: the block whose items complete the count publishes this rank's reduced rows to the node (its stores
  // and, through the counter's acquire-release, every other block's are ordered before the signal).
  if (threadIdx.x == 0 && last_of_units(&ctl->reduce_items_done, done, static_cast<uint64_t>(total)) &&
      p.gather_out != nullptr) {
    for (int q = 0; q < world; ++q)
      if (q != rank) (void)signal(comm, &ctl->reduced[rank], e, SignalOp::kSet, q);
  }
  if (reduce_block && block_ok(st)) {
    const int64_t nvec = p.chunk_elems / 8;
    const Topology t = Topology::of(rank, world, p.ranks_per_node);
    gather_reduced<Element>(p, t, rb, nvec * rb / p.reduce_blocks, nvec * (rb + 1) / p.reduce_blocks, e,
                            /*published=*/true);
  }
}

// After CUTLASS's warp-specialized kernel a block's warpgroups keep its register split (the producer at
// LoadRegisterRequirement, the consumers at MmaRegisterRequirement); code that every warp then runs needs one
// count again: the kernel's own (an even share of the register file).
template <class GemmKernel>
__device__ __forceinline__ void even_out_registers() {
  constexpr uint32_t kEven = (65536u / GemmKernel::MaxThreadsPerBlock) & ~7u;
  // setmaxnreg.inc waits until the registers are free: the counts must add up (40 + 2 x 232 = 3 x 168)
  static_assert(GemmKernel::LoadRegisterRequirement <= kEven && GemmKernel::MmaRegisterRequirement >= kEven &&
                    GemmKernel::LoadRegisterRequirement + 2 * GemmKernel::MmaRegisterRequirement <= 3 * kEven,
                "the even register count must fit the warp-specialized split");
  if (threadIdx.x < 128) cutlass::arch::warpgroup_reg_alloc<kEven>();
  else cutlass::arch::warpgroup_reg_dealloc<kEven>();
}

template <class Element, bool kPieces, class P>
__device__ void rs_reduce_role(const P& p, int rb, uint64_t e) {
  using namespace tandem::device;
  const DeviceComm& comm = p.comm;
  const int rank = comm.rank, world = comm.world;
  const Topology t = Topology::of(rank, world, p.ranks_per_node);
  Control* ctl = p.ctl;
  const int64_t nvec = p.chunk_elems / 8;
  const int64_t lo = nvec * rb / p.reduce_blocks, hi = nvec * (rb + 1) / p.reduce_blocks;
  const size_t chunk_bytes = static_cast<size_t>(p.chunk_elems) * sizeof(Element);
  const char* my_rows = p.partial + static_cast<size_t>(rank) * chunk_bytes;
  char* own_out = p.gather_out != nullptr ? p.gather_out + static_cast<size_t>(rank) * chunk_bytes : nullptr;
  Status st = Status::kOk;
  // 1. Representative of the chunks (n_o, l) of the other nodes, in the GEMM's order: reduce the node's partials
  //    (j = 0 .. L-1) over this rank's own partial of o, then put the slice to the owner through the proxy.
  for (int d = 1; d < t.N; ++d) {
    const int n_o = t.node_at(d), o = t.rank_of(n_o, t.local);
    char* chunk = const_cast<char*>(p.partial) + static_cast<size_t>(o) * chunk_bytes;
    if (t.L > 1) {
      const bool ok = reduce_stream<Element>(t.L, lo, hi, p.acc, chunk, nullptr, runtime::Timeline{}, [&](int j) -> const uint4* {
        const int q = t.rank_of(t.node, j);
        if (threadIdx.x == 0) st = wait_until(comm, &ctl->node_arrive[n_o * t.L + j], Cmp::kGe, e, q);
        if (!block_ok(st)) return nullptr;
        return reinterpret_cast<const uint4*>(peer_ptr(comm, chunk, q));
      });
      if (!ok) return;
    } else {  // one rank per node: the node partial is this rank's own
      if (threadIdx.x == 0) st = wait_until(comm, &ctl->node_arrive[n_o], Cmp::kGe, e, rank);
      if (!block_ok(st)) return;
    }
    const size_t off = static_cast<size_t>(lo) * 16, bytes = static_cast<size_t>(hi - lo) * 16;
    st = put_signal<Group::kBlock>(comm, p.recv + static_cast<size_t>(t.node) * chunk_bytes + off, chunk + off,
                                   bytes, &p.node_flags->partial_in[t.node][rb], e, SignalOp::kSet, o);
    if (!block_ok(st)) return;
  }
  // 2. This rank's rows. The fused kernel in pieces (one node): piece by piece in one pass as every rank
  //    announces it. Otherwise, one node: in one pass (reduce_pieces, one piece) after the plain GEMM (unfused:
  //    every partial is complete) or after every partial (the fused one-pass knob); else step by step as the
  //    partials land: the other nodes' partials (n-1, n-2, ...), then this node's (l-1, l-2, ..., l).
  if constexpr (kPieces) {
    if (reduce_pieces<Element, true>(p, rb, p.pieces, p.piece_rows, p.out, own_out, e))
      gather_reduced<Element>(p, t, rb, lo, hi, e);
    return;
  }
  // (one pass holds a source pointer per rank in registers: at most kMaxFusedRsWorld ranks; more go step by step)
  const bool one_pass = t.N == 1 && world <= kMaxFusedRsWorld && (p.mode == RsMode::kReduceOnly || p.fused_one_pass);
  const bool ok = one_pass ? reduce_pieces<Element, false>(p, rb, 1, p.chunk_rows, p.out, own_out, e) :
                  reduce_stream<Element>(t.N - 1 + t.L, lo, hi, p.acc, p.out, own_out, p.timeline,
                                         [&](int s) -> const uint4* {
    if (s < t.N - 1) {
      const int n = t.node_at(-1 - s);
      if (threadIdx.x == 0)
        st = wait_until(comm, &p.node_flags->partial_in[n][rb], Cmp::kGe, e, t.rank_of(n, t.local));
      if (!block_ok(st)) return nullptr;
      return reinterpret_cast<const uint4*>(p.recv + static_cast<size_t>(n) * chunk_bytes);
    }
    const int q = t.rank_of(t.node, t.local_at(-1 - (s - (t.N - 1))));
    if (threadIdx.x == 0) st = wait_until_backoff(comm, &ctl->arrive[q], Cmp::kGe, e, kRolePollNs, q);
    if (!block_ok(st)) return nullptr;
    return reinterpret_cast<const uint4*>(peer_ptr(comm, my_rows, q));  // null: refused on the host
  });
  if (!ok) return;
  gather_reduced<Element>(p, t, rb, lo, hi, e);
}

// AR (p.gather_out set): publish this rank's reduced rows and gather every owner's; RS: nothing.
template <class Element, class P>
__device__ void gather_reduced(const P& p, const Topology& t, int rb, int64_t lo, int64_t hi, uint64_t e,
                               bool published) {
  using namespace tandem::device;
  const DeviceComm& comm = p.comm;
  const int rank = comm.rank;
  Control* ctl = p.ctl;
  const size_t chunk_bytes = static_cast<size_t>(p.chunk_elems) * sizeof(Element);
  Status st = Status::kOk;
  if (p.gather_out == nullptr) return;
  p.timeline.stamp(kSlotGatherStart);
  // AR: publish this rank's reduced rows (its partial chunk, p.out): to this node by a flag, to the other nodes'
  // representatives of this chunk by puts of each slice; then gather every chunk (same slicing on every rank).
  {
    const size_t off = static_cast<size_t>(lo) * 16, bytes = static_cast<size_t>(hi - lo) * 16;
    for (int d = 1; d < t.N; ++d) {
      st = put_signal<Group::kBlock>(comm, p.out + off, p.out + off, bytes, &p.node_flags->reduced_in[t.node][rb], e,
                                     SignalOp::kSet, t.rank_of(t.node_at(d), t.local));
      if (!block_ok(st)) return;
    }
  }
  // (joined reduction: the block that completed the last item published them)
  if (!published && threadIdx.x == 0 && last_of(&ctl->reduce_done, p.reduce_blocks)) {
    for (int l = 0; l < t.L; ++l)
      if (l != t.local) (void)signal(comm, &ctl->reduced[rank], e, SignalOp::kSet, t.rank_of(t.node, l));
  }
  // Chunks of the other nodes this rank represents: copy out, then tell this node's ranks where to read them.
  for (int d = 1; d < t.N; ++d) {
    const int n_o = t.node_at(d), o = t.rank_of(n_o, t.local);
    if (threadIdx.x == 0) st = wait_until(comm, &p.node_flags->reduced_in[n_o][rb], Cmp::kGe, e, o);
    if (!block_ok(st)) return;
    const size_t off = static_cast<size_t>(o) * chunk_bytes;
    copy_slice(reinterpret_cast<uint4*>(p.gather_out + off), reinterpret_cast<const uint4*>(p.partial + off), lo, hi);
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int l = 0; l < t.L; ++l)
        if (l != t.local) (void)signal(comm, &p.node_flags->forwarded[o][rb], e, SignalOp::kSet, t.rank_of(t.node, l));
    }
  }
  // Every other chunk, read where it sits on this node: at its owner (this node's) or at its representative.
  for (int d = 0; d < t.N; ++d) {
    const int n_o = t.node_at(d);
    for (int dl = d == 0 ? 1 : 0; dl < t.L; ++dl) {
      const int l = t.local_at(dl);
      if (d > 0 && l == t.local) continue;  // copied above
      const int o = t.rank_of(n_o, l), holder = t.rank_of(t.node, l);
      uint64_t* flag = d == 0 ? &ctl->reduced[o] : &p.node_flags->forwarded[o][rb];
      if (threadIdx.x == 0) st = wait_until_backoff(comm, flag, Cmp::kGe, e, kRolePollNs, holder);
      if (!block_ok(st)) return;
      const size_t off = static_cast<size_t>(o) * chunk_bytes;
      const uint4* src = reinterpret_cast<const uint4*>(peer_ptr(comm, p.partial + off, holder));
      if (src == nullptr) return;
      copy_slice(reinterpret_cast<uint4*>(p.gather_out + off), src, lo, hi);
    }
  }
  __syncthreads();
  p.timeline.stamp(kSlotGatherEnd);
}

// AR one-shot: wait for every rank's whole partial, then reduce every row in registers, in the order its owner c
// uses (acc = p[c-1]; acc += p[c-2]; ...; out = acc + p[c]): the same bits as the two-shot path, on every rank.
template <class Element, class P>
__device__ void ar_one_shot_role(const P& p, int rb, uint64_t e) {
  using namespace tandem::device;
  using T = typename CudaType<Element>::type;
  const DeviceComm& comm = p.comm;
  const int world = comm.world;
  Status st = Status::kOk;
  if (threadIdx.x == 0) {
    for (int q = 0; q < world && st == Status::kOk; ++q)
      st = wait_until_backoff(comm, &p.ctl->arrive[q], Cmp::kGe, e, kRolePollNs, q);
  }
  if (!block_ok(st)) return;
  const int64_t nvec = p.chunk_elems / 8;
  const int64_t lo = nvec * rb / p.reduce_blocks, hi = nvec * (rb + 1) / p.reduce_blocks;
  const size_t chunk_bytes = static_cast<size_t>(p.chunk_elems) * sizeof(Element);
  for (int c = 0; c < world; ++c) {
    const uint4* src[kMaxFusedRsWorld];
    if (!partial_sources(comm, p.partial + c * chunk_bytes, c, src)) return;  // refused on the host (load/store only)
    roles::reduce_vectors_n<T>(world, src, lo, hi, reinterpret_cast<uint4*>(p.gather_out + c * chunk_bytes), nullptr);
  }
}

// kPieces: the fused kernel in pieces (p.pieces > 1; one node, two-shot); its own instantiation, so that the
// whole-chunk kernel's registers stay as they were.
template <class Element, class GemmKernel, bool kPieces>
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
    if (p.one_shot) ar_one_shot_role<Element>(p, rb, e);
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

// Stages of the unfused path that run: all three, the reduction alone, or the wait alone (the caller's GEMM
// goes between the wait and the reduction).
enum class Stages { kAll, kReduceOnly, kWaitOnly };

// The fused GEMM+RS/AR in pieces (TANDEM_RS_PIECES; one node, two-shot, the scheduler's plain order): pieces of
// whole rows of 2x1 clusters (256 rows); "auto": at least about four waves of the GEMM's grid each, at most
// kMaxPieces a chunk; a number S: S pieces (or fewer, of whole cluster rows). 1 = whole chunks.
struct PiecePlan {
  int pieces = 1;
  int rows = 0;  // rows of a piece (the last may be shorter)
  int len = 0;   // the scheduler's linear indices of a piece
};
PiecePlan piece_plan(const GemmRsArgs& a, const SmPlan& plan, bool one_shot, const FusedKnobs& knobs) {
  PiecePlan pp;
  if (knobs.pieces == 0 || topology_of(a).N != 1 || one_shot || knobs.raster_m || knobs.swizzle != 1) return pp;
  const int mr = a.m / a.comm.world;
  const int tiles_n = (a.n + 255) / 256, m_clusters = ((mr + 127) / 128 + 1) / 2;
  const int gemm_sms = plan.sm_count - plan.comm_blocks;
  // auto: at least ~4 waves a piece, at most kMaxPieces; S: as close to S pieces as whole cluster rows allow
  const int want = knobs.pieces > 0 && knobs.pieces < kMaxPieces ? knobs.pieces : kMaxPieces;
  int per = knobs.pieces < 0 ? (4 * gemm_sms + 2 * tiles_n - 1) / (2 * tiles_n) : 1;
  per = per < 1 ? 1 : per;
  per = per < (m_clusters + want - 1) / want ? (m_clusters + want - 1) / want : per;
  const int pieces = (m_clusters + per - 1) / per;
  if (pieces > 1) {
    pp.pieces = pieces;
    pp.rows = per * 256;
    pp.len = per * 2 * tiles_n;
  }
  return pp;
}

template <bool kPieces, bool kClaims>
using RsSchedulerTag = std::conditional_t<
    kPieces, std::conditional_t<kClaims, gemm::ArrivalPiecesClaimsSchedulerTag, gemm::ArrivalPiecesSchedulerTag>,
    std::conditional_t<kClaims, gemm::ArrivalClaimsSchedulerTag, gemm::ArrivalSchedulerTag>>;

template <class Element, bool kPieces = false, bool kClaims = false>
Status run_typed(const GemmRsArgs& a, cudaStream_t stream, bool fused, bool all_reduce, bool one_shot,
                 std::string* why, Stages stages = Stages::kAll) {
  using G = gemm::detail::Sm90Gemm<Element, RsSchedulerTag<kPieces, kClaims>>;
  using Kernel = typename G::Kernel;
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
  const PiecePlan pieces = kPieces ? piece_plan(a, plan, one_shot, knobs) : PiecePlan{};
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
      if (Status s = launch(dim3(2, 1, 1), 0); s != Status::kOk) return s;
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
    return launch(dim3(2, blocks / 2, 1), 0);
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
      if (gg.z != 1 || (gg.x != 2 && gg.y != 1) || (gg.x * gg.y) % 2) return fail(why, "unexpected GEMM grid shape", Status::kInternal);
      gg = dim3(2, gg.x * gg.y / 2, 1);
    }
    args.scheduler.arrival.gemm_grid_x = static_cast<int32_t>(gg.x);
    args.scheduler.arrival.gemm_grid_y = static_cast<int32_t>(gg.y);
    args.scheduler.arrival.gemm_block_y0 = plan.comm_blocks / 2;
    p.gemm[o] = Kernel::to_underlying_arguments(args, nullptr);
    p.chunk_tiles = static_cast<int64_t>(p.gemm[o].scheduler.blocks_per_problem_);
  }
  if (kClaims && gg.y > static_cast<unsigned>(gemm::kClaimClusters))
    return fail(why, "too many GEMM clusters for the tile claims", Status::kInternal);
  p.reduce_rows_y = plan.comm_blocks / 2;
  p.gemm_blocks = static_cast<int>(gg.x * gg.y);
  if (p.pieces > 1 && p.gemm_blocks > kMaxGemmBlocks) return fail(why, "too many GEMM blocks for the piece table", Status::kInternal);
  return launch(dim3(2, gg.y + plan.comm_blocks / 2, 1), Kernel::SharedStorageSize);
}

}  // namespace

namespace detail {

namespace {
bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}
uint64_t* g_timeline = nullptr;  // host: the device buffer, made on the first traced launch
}  // namespace
int g_last_fused_pieces = 0;
bool g_last_fused_claims = false;
bool g_last_fused_joined = false;

bool tile_claims_enabled() { return !env_is("TANDEM_TP_CLAIM", "0"); }

uint64_t* timeline_for_launch(cudaStream_t stream) {
  if (!env_is("TANDEM_TP_TRACE", "1")) return nullptr;
  const size_t bytes = sizeof(uint64_t) * runtime::kTimelineBlocks * runtime::kTimelineSlots;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess || capturing != cudaStreamCaptureStatusNone)
    return nullptr;  // no allocation (nor a memset node) inside a capture: graph replays are not traced
  if (g_timeline == nullptr && cudaMalloc(&g_timeline, bytes) != cudaSuccess) {
    g_timeline = nullptr;
    return nullptr;
  }
  return cudaMemsetAsync(g_timeline, 0, bytes, stream) == cudaSuccess ? g_timeline : nullptr;
}

FusedKnobs FusedKnobs::from_env() {
  FusedKnobs k;
  if (const char* v = std::getenv("TANDEM_TP_SWIZZLE")) {
    const int s = std::atoi(v);
    k.swizzle = s == 2 || s == 4 || s == 8 ? s : 1;
  }
  k.raster_m = env_is("TANDEM_TP_RASTER", "m");
  k.common_order = env_is("TANDEM_RS_ORDER", "common");
  k.one_pass = env_is("TANDEM_RS_REDUCE", "onepass");
  if (const char* v = std::getenv("TANDEM_RS_PIECES")) k.pieces = std::strcmp(v, "auto") == 0 ? -1 : std::atoi(v);
  k.join = env_is("TANDEM_RS_JOIN", "1");
  if (const char* v = std::getenv("TANDEM_TP_LATE")) {
    int c = 0;
    unsigned us = 0;
    if (std::sscanf(v, "%d:%u", &c, &us) == 2 && c >= 0) {
      k.late_cluster = c;
      k.late_us = us;
    }
  }
  return k;
}

}  // namespace detail

cudaError_t timeline_snapshot(std::vector<uint64_t>* out) {
  out->clear();
  if (detail::g_timeline == nullptr) return cudaSuccess;
  if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return e;
  out->assign(static_cast<size_t>(runtime::kTimelineBlocks) * runtime::kTimelineSlots, 0);
  return cudaMemcpy(out->data(), detail::g_timeline, sizeof(uint64_t) * out->size(), cudaMemcpyDeviceToHost);
}

int timeline_slots() { return runtime::kTimelineSlots; }
int last_fused_rs_pieces() { return detail::g_last_fused_pieces; }
bool last_fused_claims() { return detail::g_last_fused_claims; }
bool last_fused_rs_joined() { return detail::g_last_fused_joined; }

template <class Element, bool kPieces, bool kClaims>
cudaError_t preload_rs_kernel() {
  using K = typename gemm::detail::Sm90Gemm<Element, RsSchedulerTag<kPieces, kClaims>>::Kernel;
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, gemm_rs_kernel<Element, K, kPieces>);
}

cudaError_t preload_rs_kernels() {
  // The unfused path's (static) kernels always; the fused ones of the current tile-claim setting.
  const bool claims = tile_claims_enabled();
  const cudaError_t e[] = {
      preload_rs_kernel<cutlass::bfloat16_t, false, false>(),
      preload_rs_kernel<cutlass::half_t, false, false>(),
      claims ? preload_rs_kernel<cutlass::bfloat16_t, false, true>() : cudaSuccess,
      claims ? preload_rs_kernel<cutlass::half_t, false, true>() : cudaSuccess,
      claims ? preload_rs_kernel<cutlass::bfloat16_t, true, true>() : preload_rs_kernel<cutlass::bfloat16_t, true, false>(),
      claims ? preload_rs_kernel<cutlass::half_t, true, true>() : preload_rs_kernel<cutlass::half_t, true, false>()};
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

size_t workspace_size(const GemmRsArgs& a) {
  return acc_offset(a) + static_cast<size_t>(a.m / (a.comm.world > 0 ? a.comm.world : 1)) * a.n * sizeof(float);
}

static Status check_rs(const GemmRsArgs& a, bool fused, std::string* why) {
  const int world = a.comm.world;
  if (world < 1 || world > kMaxWorld) return fail(why, "world size must be in [1, 64]");
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
  return check_common(a.comm, a.dtype, {a.a, a.b, a.out}, "A, B, out", a.workspace, workspace_size(a), plan, why);
}

Status can_implement(const GemmRsArgs& a, std::string* why) { return check_rs(a, true, why); }

template <bool kAllReduce>
static Status dispatch(const GemmRsArgs& a, bool fused, bool one_shot, cudaStream_t stream, std::string* why,
                       Stages stages = Stages::kAll) {
  if (const Status s = check_rs(a, fused, why); s != Status::kOk) return s;
  if (one_shot && a.comm.world > kMaxFusedRsWorld) return fail(why, "the one-shot all-reduce takes at most 8 ranks");
  if (one_shot && topology_of(a).N > 1)
    return fail(why, "the one-shot all-reduce reads every partial by load/store: one node only (use two_shot)");
  // The fused kernel in pieces is its own instantiation (TANDEM_RS_PIECES; see piece_plan).
  const SmPlan plan = a.plan.comm_blocks > 0 ? a.plan : default_plan(a.plan.sm_count);
  const int piece_count = fused ? piece_plan(a, plan, one_shot, FusedKnobs::from_env()).pieces : 0;
  const bool pieces = piece_count > 1;
  // Tile claims (default; TANDEM_TP_CLAIM=0 off) in the fused kernel only: the unfused GEMM is a kernel of its
  // own. Across nodes too: a chunk's claims are numbered by the step at which this rank computes it
  // (rs_chunk_at of the node topology), so the ring tags still grow call by call.
  const bool claims = fused && tile_claims_enabled();
  if (fused) {
    detail::g_last_fused_pieces = piece_count;
    detail::g_last_fused_claims = claims;
  }
  const auto typed = [&](auto element) {
    using Element = decltype(element);
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
  if (const Status s = check_rs(a, true, why); s != Status::kOk) return s;
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
