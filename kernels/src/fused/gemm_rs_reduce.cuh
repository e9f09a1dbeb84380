// GEMM+RS/AR (gemm_rs_sm90.cu), the reduce blocks' roles: the fixed-order reduction of every rank's partial of
// this rank's rows (whole chunks through an fp32 buffer, or pieces in one pass), the joined reduction, the
// cross-node levels, the AR gather and the one-shot all-reduce. The protocol is at the top of gemm_rs_sm90.cu.
// Included by that file only: the definitions have its internal linkage.
#pragma once

#include "gemm_rs_common.cuh"
#include "tandem/kernels/roles/stream.cuh"

namespace tandem::kernels::tp {

namespace {

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
template <class Element, bool kPieceFlags, int kInFlightBytes, class P>
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
    const bool ok = roles::reduce_vectors_n<T, kRsStreamLoads, kInFlightBytes>(world, src, lo, hi, reinterpret_cast<uint4*>(out),
                                                               reinterpret_cast<uint4*>(out2));
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
    (void)roles::reduce_vectors_n<T, kRsStreamLoads, roles::kReduceInFlightBytesBesideGemm>(world, src, lo, hi,
                                                                                    reinterpret_cast<uint4*>(p.out),
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
    if (reduce_pieces<Element, true, roles::kReduceInFlightBytesBesideGemm>(p, rb, p.pieces, p.piece_rows, p.out,
                                                                           own_out, e))
      gather_reduced<Element>(p, t, rb, lo, hi, e);
    return;
  }
  // (one pass holds a source pointer per rank in registers: at most kMaxFusedRsWorld ranks; more go step by step)
  const bool one_pass = t.N == 1 && world <= kMaxFusedRsWorld && (p.mode == RsMode::kReduceOnly || p.fused_one_pass);
  const bool ok = one_pass ? reduce_pieces<Element, false, roles::kReduceInFlightBytes>(p, rb, 1, p.chunk_rows, p.out,
                                                                                       own_out, e) :
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
template <class Element, int kInFlightBytes, class P>
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
    roles::reduce_vectors_n<T, false, kInFlightBytes>(world, src, lo, hi,
                                                      reinterpret_cast<uint4*>(p.gather_out + c * chunk_bytes), nullptr);
  }
}

}  // namespace

}  // namespace tandem::kernels::tp
