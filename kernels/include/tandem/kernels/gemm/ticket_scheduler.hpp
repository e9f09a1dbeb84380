// tandem kernels — a CUTLASS sm90 tile scheduler whose fixup reduces a tile across ranks where the tile's last
// partial lands: the "last arriver reduces" (ticket) reduction, for GEMM+RS / GEMM+AR (gemm_rs_sm90.cu, the
// ticket mode) and any kernel whose ranks compute partial products of the same tiles.
//
// Contract, per call (one chunk o of the problem: rows owned by rank o), per output tile t of the chunk, on every
// one of the W ranks computing it:
//   1. the tile's partial, rounded to the element type, goes from the accumulators to this rank's slot of t
//      (fragment order: 16-byte vectors [vector][thread], so every warp stores 512 contiguous bytes)
//   2. one thread takes a ticket: k = fetch-add(tickets[t] at o, 1), acq_rel, after a barrier of the tile's
//      threads and a fence (the block's slot stores are released by it)
//   3. the rank that draws k = W - 1 (every other rank's slot is stored: each stored before its ticket) resets
//      the ticket, reads every other rank's slot through the peer mappings, adds the W partials in rank order
//      0, 1, ..., W-1 in fp32 (its own read back from its slot, rounded as the others were), and stores the sum,
//      rounded once: the owner itself (rank o, the usual last arriver: o computes its own chunk last) straight
//      into its output rows (`direct`; AR: into o's staging rows too, which the other ranks copy), any other rank
//      into o's staging rows (row-major), marking the tile in o's `staged` flags so that o's end copies it; then
//      it counts the tile at o (fetch-add, acq_rel), and the thread that completes the chunk's count resets it
//      and signals reduced[o] = epoch to the ranks that read the staging (RS: o; AR: every rank)
//   4. CUTLASS's epilogue never runs (compute_epilogue is false): the fixup's stores (output, staging) are all
// Nothing here waits. A tile's reduction happens on whichever rank finishes it last, so a rank that MPS starts
// late, or that is slow, never holds the others back inside the GEMM; only the end of the launch waits for the
// chunk's count (gemm_rs_sm90.cu). The sum is deterministic (rank order, one rounding of each partial, fp32,
// one final rounding) whoever reduces.
//
// Memory ordering: the slot stores of a tile's 256 threads -> named barrier -> thread 0's fence.acq_rel and
// ticket (acq_rel RMW at the scope covering every reader: .gpu when every rank is on this GPU, else .sys) -> the
// last arriver's ticket RMW acquires them (an RMW chain is a release sequence) -> named barrier -> its threads'
// loads. The staging stores and the staged flags are published the same way by the count's RMW chain, and the
// completer's signal (a release) passes everything it acquired on to the readers' acquire-wait. The owner's direct
// stores need no publishing for RS (its own end phase and the stream follow them); AR's readers read the staging.
//
// Reset: tickets and the count are reset by the thread that completes them, so they are zero between launches;
// the next launch's first ticket comes after every rank's ready[] of this one (gemm_rs_sm90.cu), which the
// resets precede. The staged flags are cleared by the owner's end as it copies each flagged tile, before its
// ready[]. A launch cut short by an abort leaves them behind: the communicator is failed then anyway.
#pragma once

#include "cutlass/arch/barrier.h"
#include "tandem/kernels/gemm/arrival_scheduler.hpp"

namespace tandem::kernels::gemm {

// What the ticket fixup of one call (one chunk) needs; the host fills it per call.
struct TicketReduce {
  char* slots = nullptr;              // this rank's heap: the chunk's partial tiles, tile t at t * tile_bytes
  uint64_t* tickets = nullptr;        // the owner's heap (mapped here): [tile], zero between launches
  uint64_t* reduced_count = nullptr;  // the owner's heap (mapped here): tiles of the chunk reduced this launch
  char* staging = nullptr;            // the owner's heap (mapped here): the chunk's sums, row-major, ld = cols
  char* direct = nullptr;             // the owner's call only (o == this rank): its output rows of the chunk, ld = cols
  uint32_t* staged = nullptr;         // the owner's heap (mapped here): [tile], 1 = the sum is in the staging only
  uint64_t* reduced_flag = nullptr;   // this rank's symmetric address of the word signalled when the chunk is done
  uint32_t* scratch = nullptr;        // this rank's workspace: a word a GEMM block (the end phase's broadcast)
  int32_t rows = 0;                   // the chunk's rows
  int32_t cols = 0;                   // N (a multiple of 8)
  int32_t tiles_m = 0;                // tiles with rows (the scheduler pads M to whole clusters: those have none)
  int32_t tiles_n = 0;
  int32_t owner = 0;
  int32_t notify_all = 0;             // 1: the completer signals every rank (AR); 0: the owner only (RS)
  int32_t sys_scope = 1;              // 1: a rank on another GPU reads or counts (.sys); 0: all on this GPU (.gpu)
};

// The scheduler's tag: tile claims (TandemArrivalScheduler<kPieces, true>) plus the ticket fixup, for a GEMM of
// `Element` whose mainloop is `TiledMma` (its thread -> accumulator coordinate map places the sums). kPieces: each
// call computes one piece of its chunk (ArrivalSchedule::piece_len; the ticket kernel in rounds).
template <class Element, class TiledMma, bool kPieces = false>
struct TicketClaimsSchedulerTag {};

namespace ticket_detail {

__device__ __forceinline__ uint64_t fetch_add_acq_rel(uint64_t* p, uint64_t v, bool sys) {
  uint64_t old;
  if (sys) asm volatile("atom.acq_rel.sys.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  else asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}
__device__ __forceinline__ void fence_acq_rel(bool sys) {
  if (sys) asm volatile("fence.acq_rel.sys;" ::: "memory");
  else asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
__device__ __forceinline__ void store_relaxed(uint64_t* p, uint64_t v, bool sys) {
  if (sys) asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  else asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

template <class Element>
__device__ __forceinline__ uint16_t bits_of(float x) {
  return Element(x).raw();
}
template <class Element>
__device__ __forceinline__ float value_of(uint32_t word, int half) {
  return float(Element::bitcast(static_cast<uint16_t>(half ? word >> 16 : word & 0xffffu)));
}

}  // namespace ticket_detail

}  // namespace tandem::kernels::gemm

namespace cutlass::gemm::kernel::detail {

template <class Element, class TiledMma, class TileShape, int kClusterM, bool kPieces>
class TandemTicketScheduler : public TandemArrivalScheduler<kPieces, true, kClusterM> {
  using Base = TandemArrivalScheduler<kPieces, true, kClusterM>;
  static constexpr int kTileM = static_cast<int>(decltype(cute::size<0>(TileShape{}))::value);
  static constexpr int kTileN = static_cast<int>(decltype(cute::size<1>(TileShape{}))::value);
  static constexpr int kThreads = static_cast<int>(decltype(cute::size(TiledMma{}))::value);
  static_assert(sizeof(Element) == 2, "16-bit elements (bf16, fp16)");

 public:
  using WorkTileInfo = typename Base::WorkTileInfo;
  // one tile's slot: every accumulator of every MMA thread as the element type
  static constexpr int64_t kTileBytes = int64_t(kTileM) * kTileN * sizeof(Element);

  struct Arguments : Base::Arguments {
    tandem::kernels::gemm::TicketReduce ticket{};
  };
  struct Params : Base::Params {
    tandem::kernels::gemm::TicketReduce ticket{};
  };

  template <class ProblemShapeMNKL, class TileShape_, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem, TileShape_ tile, ClusterShape cluster,
                                        KernelHardwareInfo const& hw, Arguments const& args, void* workspace = nullptr,
                                        const uint32_t epilogue_subtile = 1, uint32_t ktile_start_alignment = 1u) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(
        problem, tile, cluster, hw, args, workspace, epilogue_subtile, ktile_start_alignment);
    p.ticket = args.ticket;
    return p;
  }

  CUTLASS_HOST_DEVICE static bool can_implement(Arguments const& args) {
    const auto& t = args.ticket;
    return Base::can_implement(args) && t.slots != nullptr && t.tickets != nullptr && t.reduced_count != nullptr &&
           t.staging != nullptr && t.staged != nullptr && t.reduced_flag != nullptr && t.scratch != nullptr &&
           t.cols % 8 == 0;
  }

  CUTLASS_HOST_DEVICE TandemTicketScheduler() {}
  CUTLASS_DEVICE explicit TandemTicketScheduler(Params const& p) : Base(p) {}

  // The sums are stored by the fixup: CUTLASS's epilogue stores nothing (its source is not read: beta = 0).
  CUTLASS_HOST_DEVICE static bool compute_epilogue(WorkTileInfo const&, Params const&) { return false; }
  CUTLASS_HOST_DEVICE static bool compute_epilogue(WorkTileInfo const&) { return false; }

  // Called by every MMA thread after the tile's mainloop (accumulators complete); the protocol is at the top of
  // this file.
  template <class FrgTensorC>
  CUTLASS_DEVICE static void fixup(Params const& params, WorkTileInfo const& work, FrgTensorC& acc, uint32_t,
                                   uint32_t) {
    using namespace tandem::kernels::gemm::ticket_detail;
    using cute::get;
    const tandem::kernels::gemm::TicketReduce& t = params.ticket;
    if (!work.is_valid() || work.M_idx >= t.tiles_m || work.N_idx >= t.tiles_n) return;  // cluster padding: no rows
    constexpr int kValues = static_cast<int>(decltype(cute::size(acc))::value);
    static_assert(kValues % 8 == 0 && int64_t(kValues) * kThreads * sizeof(Element) == kTileBytes,
                  "the accumulators cover the tile, 8 values a 16-byte vector");
    constexpr int kVectors = kValues / 8;
    const tandem::DeviceComm& comm = params.arrival.comm;
    const int world = comm.world, rank = comm.rank;
    const bool sys = t.sys_scope != 0;
    const int tid = static_cast<int>(threadIdx.x) % kThreads;  // CUTLASS's mma_thread_idx
    const int64_t tile = int64_t(work.M_idx) * t.tiles_n + work.N_idx;
    const auto barrier = [] {
      cutlass::arch::NamedBarrier::sync(kThreads, cutlass::arch::ReservedNamedBarriers::StreamkBarrier0);
    };
    // the same named barrier, returning whether any of the tile's threads passed `pred`
    const auto barrier_or = [](bool pred) {
      uint32_t any;
      asm volatile(
          "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
          : "=r"(any)
          : "r"(static_cast<uint32_t>(pred)),
            "r"(static_cast<uint32_t>(cutlass::arch::ReservedNamedBarriers::StreamkBarrier0)), "r"(kThreads)
          : "memory");
      return any != 0u;
    };
    // 1. this rank's partial, rounded, in fragment order
    uint4* slot = reinterpret_cast<uint4*>(t.slots + tile * kTileBytes);
    CUTLASS_PRAGMA_UNROLL
    for (int v = 0; v < kVectors; ++v) {
      uint32_t w[4];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j)
        w[j] = uint32_t(bits_of<Element>(acc(8 * v + 2 * j))) | (uint32_t(bits_of<Element>(acc(8 * v + 2 * j + 1))) << 16);
      slot[v * kThreads + tid] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    barrier();
    // 2. the ticket (thread 0 of the tile's threads), broadcast by the barrier itself (bar.red.or: the same
    // ordering as bar.sync, and no word in memory to store, load and protect with a third barrier per tile)
    bool drew_last = false;
    if (tid == 0) {
      fence_acq_rel(sys);
      const uint64_t k = fetch_add_acq_rel(t.tickets + tile, 1, sys);
      drew_last = k + 1 == static_cast<uint64_t>(world);
      if (drew_last) store_relaxed(t.tickets + tile, 0, sys);  // every rank's ticket of this launch is drawn
    }
    const bool last = barrier_or(drew_last);
    if (!last) return;
    // 3. the last arriver: every rank's partial in rank order, fp32, summed in the accumulators. Its own partial
    // is read back from its slot (this thread's own stores, so no ordering is needed), which lets one loop serve
    // every rank: the loads of a batch of vectors are issued before any is added (kBatch x 16 B in flight a
    // thread, 32 KB a block), as one load at a time left the reduction latency-bound (2026-12-07, H100: the
    // owner's last step took 1.6 ms against 0.5 for the others at world 4, 16384x8192x4096).
    constexpr int kBatch = kVectors % 8 == 0 ? 8 : (kVectors % 4 == 0 ? 4 : 1);
    for (int q = 0; q < world; ++q) {
      const uint4* src =
          reinterpret_cast<const uint4*>(q == rank ? t.slots : tandem::device::peer_ptr(comm, t.slots, q)) +
          (tile * kTileBytes) / 16 + tid;
      CUTLASS_PRAGMA_UNROLL
      for (int v0 = 0; v0 < kVectors; v0 += kBatch) {
        uint4 x[kBatch];
        // (L1-bypassing: another rank wrote it this launch; each slot is read once)
        CUTLASS_PRAGMA_UNROLL
        for (int b = 0; b < kBatch; ++b) x[b] = __ldcg(src + (v0 + b) * kThreads);
        CUTLASS_PRAGMA_UNROLL
        for (int b = 0; b < kBatch; ++b) {
          const uint32_t xs[4] = {x[b].x, x[b].y, x[b].z, x[b].w};
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < 4; ++j) {
            const int i = 8 * (v0 + b) + 2 * j;
            // (0 + x for the first rank: the same sum, -0 included, as starting from 0)
            acc(i) = (q == 0 ? 0.0f : float(acc(i))) + value_of<Element>(xs[j], 0);
            acc(i + 1) = (q == 0 ? 0.0f : float(acc(i + 1))) + value_of<Element>(xs[j], 1);
          }
        }
      }
    }
    // 4. the sums, rounded once, into the owner's output rows when the owner reduces (its end then has nothing to
    // copy for the tile: the end copy was 1-2 ms of the ticket kernel at world 4, 2026-12-07), else into the
    // owner's staging rows; AR's owner stores both (the other ranks copy its staging). The accumulators of an SM90
    // MMA come in pairs of adjacent columns of one row (values 2i, 2i+1: the C layout's first value mode): one
    // 4-byte store a pair.
    const bool owner_reduces = t.direct != nullptr;
    char* const dst = owner_reduces ? t.direct : t.staging;
    const bool to_staging_too = owner_reduces && t.notify_all != 0;
    auto thr = TiledMma{}.get_thread_slice(tid);
    auto coords = thr.partition_C(cute::make_identity_tensor(cute::make_shape(cute::Int<kTileM>{}, cute::Int<kTileN>{})));
    static_assert(decltype(cute::size(coords))::value == kValues, "one coordinate an accumulator");
    const int m0 = work.M_idx * kTileM, n0 = work.N_idx * kTileN;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kValues; i += 2) {
      const auto c = coords(i);
      const int m = m0 + get<0>(c), n = n0 + get<1>(c);
      if (m < t.rows && n < t.cols) {
        const uint32_t pair = uint32_t(bits_of<Element>(acc(i))) | (uint32_t(bits_of<Element>(acc(i + 1))) << 16);
        const int64_t at = (int64_t(m) * t.cols + n) * int64_t(sizeof(Element));
        *reinterpret_cast<uint32_t*>(dst + at) = pair;
        if (to_staging_too) *reinterpret_cast<uint32_t*>(t.staging + at) = pair;
      }
    }
    barrier();
    if (tid == 0) {
      // (the flag and the staging rows are released together by the count's RMW below; the owner's end acquires
      // them through reduced[o] and clears the flag when it has copied the tile)
      if (!owner_reduces) *reinterpret_cast<volatile uint32_t*>(t.staged + tile) = 1u;
      fence_acq_rel(sys);
      const uint64_t done = fetch_add_acq_rel(t.reduced_count, 1, sys) + 1;
      if (done == uint64_t(t.tiles_m) * uint64_t(t.tiles_n)) {  // the chunk's last tile: its staging is complete
        store_relaxed(t.reduced_count, 0, sys);
        const uint64_t e = tandem::kernels::runtime::epoch_after(params.arrival.epoch_counter);
        for (int q = 0; q < world; ++q)
          if (t.notify_all || q == t.owner)
            (void)tandem::device::signal(comm, t.reduced_flag, e, tandem::device::SignalOp::kSet, q);
      }
    }
    barrier();
  }
};

template <class Element, class TiledMma, bool kPieces, class ArchTag, class TileShape, class ClusterShape,
          uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<tandem::kernels::gemm::TicketClaimsSchedulerTag<Element, TiledMma, kPieces>, ArchTag,
                             TileShape, ClusterShape, SchedulerPipelineStageCount> {
  using Scheduler = TandemTicketScheduler<Element, TiledMma, TileShape, kArrivalClusterM<ClusterShape>, kPieces>;
};

}  // namespace cutlass::gemm::kernel::detail
