// tandem kernels — a CUTLASS sm90 persistent tile scheduler that waits for A's rows to arrive.
//
// The fused AG+GEMM hands each output tile to the GEMM only once the chunk of A rows it reads has landed in the
// gathered buffer (an arrival flag per chunk, monotonic epochs), and hands out the chunks in arrival order
// (this rank's own chunk first). Everything else is PersistentTileSchedulerSm90's: this class shadows only the
// members that walk the linear tile index, and adds the remap and the wait. CUTLASS needs no change: its
// GemmUniversal takes the scheduler through TileSchedulerSelector, specialized below for ArrivalSchedulerTag.
//
// Device code (header-only, included by the .cu that instantiates the kernel).
#pragma once

#include "cutlass/gemm/kernel/sm90_tile_scheduler.hpp"
#include "cutlass/version.h"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "tandem/device/local.cuh"
#include "tandem/device/wait.cuh"
#include "tandem/kernels/gemm/gemm.h"
#include "tandem/kernels/runtime/persistent.cuh"
#include "tandem/transport/device_comm.h"

namespace tandem::kernels::gemm {

// Tags for GemmUniversal's scheduler slot: the arrival-aware scheduler, and the same one computing one piece of
// the problem per call (ArrivalSchedule::piece_len; the fused GEMM+RS in pieces). Two types so that the kernels
// without pieces carry none of the pieces' state through their mainloop.
struct ArrivalSchedulerTag {};
struct ArrivalPiecesSchedulerTag {};
// The same two with tile claims (ArrivalSchedule::claims) instead of the static persistent stride.
struct ArrivalClaimsSchedulerTag {};
struct ArrivalPiecesClaimsSchedulerTag {};

// The launch's last block (every block done: no claim is pending) zeroes the counters of the `calls` calls the
// launch made, for the next launch on the stream.
__device__ __forceinline__ void tile_claims_reset(TileClaims* claims, int calls) {
  for (int c = 0; c < calls && c < kClaimCalls; ++c) claims->next[c] = 0u;
}

}  // namespace tandem::kernels::gemm

// The specializations at the end of this file fill CUTLASS's internal TileSchedulerSelector slot, whose template
// parameters are those of CUTLASS 4.2 (the version the build pins: pyproject.toml, cmake/FindCUTLASS.cmake). A
// later CUTLASS changed them; say so here rather than in a page of template errors.
static_assert(CUTLASS_MAJOR == 4 && CUTLASS_MINOR == 2,
              "tandem's arrival scheduler is written against CUTLASS 4.2's TileSchedulerSelector: build with "
              "nvidia-cutlass==4.2.x (or TANDEM_CUTLASS_DIR at a 4.2 source tree)");

namespace cutlass::gemm::kernel::detail {

// kClusterM: the GEMM's cluster extent along M (its ClusterShape's first mode), 2 for the core's 2x1 clusters or 1
// for single-CTA clusters (measured for the fused AG+GEMM on 2026-12-06 and not kept: tools/pending/ag-cluster1.diff).
// The pinned fused grid stays two blocks wide either way.
template <bool kPieces, bool kClaims = false, int kClusterM = 2>
class TandemArrivalScheduler : public PersistentTileSchedulerSm90 {
  using Base = PersistentTileSchedulerSm90;
  static_assert(kClusterM == 1 || kClusterM == 2, "clusters of 1 or 2 CTAs along M");

 public:
  using WorkTileInfo = typename Base::WorkTileInfo;
  static constexpr bool kTileClaims = kClaims;  // for the kernels around it
  static constexpr bool kPieceCalls = kPieces;   // each call computes the piece piece_of_block names
  struct Arguments : Base::Arguments {
    tandem::kernels::gemm::ArrivalSchedule arrival{};
  };
  struct Params : Base::Params {
    tandem::kernels::gemm::ArrivalSchedule arrival{};
  };

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem, TileShape tile, ClusterShape cluster,
                                        KernelHardwareInfo const& hw, Arguments const& args, void* workspace = nullptr,
                                        const uint32_t epilogue_subtile = 1, uint32_t ktile_start_alignment = 1u) {
    const PersistentTileSchedulerSm90::Arguments& base_args = args;
    Params p;
    PersistentTileSchedulerSm90Params& base_params = p;
    base_params = PersistentTileSchedulerSm90::to_underlying_arguments(problem, tile, cluster, hw, base_args,
                                                                       workspace, epilogue_subtile,
                                                                       ktile_start_alignment);
    p.arrival = args.arrival;
    return p;
  }

  CUTLASS_HOST_DEVICE static bool can_implement(Arguments const& args) {
    const PersistentTileSchedulerSm90::Arguments& base_args = args;
    return PersistentTileSchedulerSm90::can_implement(base_args) && args.arrival.chunks > 0 &&
           args.arrival.chunk_rows > 0;
  }

  CUTLASS_HOST_DEVICE TandemArrivalScheduler() {}

  CUTLASS_DEVICE explicit TandemArrivalScheduler(Params const& p) : Base(p), arrival_(&p.arrival), epoch_(p.arrival.epoch) {
#if defined(__CUDA_ARCH__)
    // Tiles are numbered and strided over the GEMM's grid only: blocks beyond it (other roles) never count.
    const uint64_t gx = arrival_->gemm_grid_x > 0 ? uint64_t(arrival_->gemm_grid_x) : uint64_t(gridDim.x);
    const uint64_t gy = arrival_->gemm_grid_y > 0 ? uint64_t(arrival_->gemm_grid_y) : uint64_t(gridDim.y);
    const uint64_t by = uint64_t(blockIdx.y) - uint64_t(arrival_->gemm_block_y0);
    // A pinned grid (the fused kernels: (2, clusters) below the role rows) is numbered cluster-minor first in
    // either raster order: with 2x1 clusters the base takes the low bit of the index as the block's place in its
    // cluster; with clusters of one CTA every index is a CTA of its own.
    if (p.raster_order_ == RasterOrder::AlongN || arrival_->gemm_grid_x > 0) {
      linear_ = uint64_t(blockIdx.x) + by * gx;
    } else {
      linear_ = uint64_t(blockIdx.x) * gy + by;
    }
    stride_ = gx * gy * uint64_t(gridDim.z);
    int32_t piece = 0;
    if constexpr (kPieces) {
      // This call's piece: written by the block's thread 0 before the call (a block barrier orders it).
      piece = *static_cast<const volatile int32_t*>(arrival_->piece_of_block + linear_);
      const uint64_t begin = uint64_t(piece) * uint64_t(arrival_->piece_len);
      linear_ += begin;
      end_ = begin + uint64_t(arrival_->piece_len);
    }
    if (arrival_->epoch_counter != nullptr) {
      // Written by the previous launch on this stream, which finished before this one started.
      epoch_ = tandem::kernels::runtime::epoch_after(arrival_->epoch_counter);
    }
    if constexpr (kClaims) {
      // A cluster is kClusterM consecutive blocks of the pinned GEMM grid (a row of it for 2x1 clusters:
      // gemm_grid_x == 2, checked by the host). linear_ keeps the call's first index (pieces) plus the block's
      // place in its cluster; claim v is the cluster tile at linear_ + kClusterM v. seq_ numbers this thread's
      // work tiles.
      block_ = int32_t(by * gx + blockIdx.x);
      cluster_ = block_ / kClusterM;
      call_ = arrival_->claim_call + piece * arrival_->claim_stride;
      linear_ -= uint64_t(cluster_) * kClusterM;
      tag0_ = (epoch_ << 26) | (uint64_t(call_ & 63) << 20);
      if (threadIdx.x == 0) arrival_->claims->tiles_of_block[block_] = 0u;
    }
#endif
  }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return get_current_work();
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work() {
    if constexpr (kClaims) {
      const uint32_t v = claimed(seq_);
      if (v == kNoTile) return WorkTileInfo::invalid_work_tile();
      WorkTileInfo w = work_for(linear_ + uint64_t(kClusterM) * uint64_t(v), /*wait=*/true);
      if (threadIdx.x == 0 && seq_ >= counted_) {  // the producer thread sees each tile once
        counted_ = seq_ + 1;
        if (w.is_valid()) arrival_->claims->tiles_of_block[block_] += 1u;
      }
      return w;
    } else {
      return work_for(linear_, /*wait=*/true);
    }
  }

  CUTLASS_DEVICE void advance_to_next_work(uint32_t advance_count = 1) {
    if constexpr (kClaims) seq_ += advance_count;
    else linear_ += stride_ * advance_count;
  }

  CUTLASS_DEVICE bool is_last_tile(WorkTileInfo& work, uint32_t advance_count = 1) const {
    if (continue_current_work(work)) return false;
    if constexpr (kClaims) return false;  // unknown until claimed; CUTLASS uses it only as a hint (GDC)
    else return !work_for(linear_ + stride_ * advance_count, /*wait=*/false).is_valid();
  }

  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work) {
    if (continue_current_work(work)) return cute::make_tuple(work, true);
    advance_to_next_work();
    return cute::make_tuple(get_current_work(), true);
  }

  template <class TileSchedulerPipeline, class TileSchedulerPipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work, TileSchedulerPipeline&, TileSchedulerPipelineState) {
    return fetch_next_work(work);
  }

 private:
  static constexpr uint32_t kNoTile = 0xffffffffu;

  // Claims: the cluster tile of this cluster's work tile number `seq`. The first CTA's thread 0 (the mainloop
  // producer's lane 0, the first of the cluster's threads to need each tile: the consumers follow it through the
  // shared-memory pipeline) takes it from the call's counter and publishes it in the cluster's ring slot (value,
  // then the tag with release); every other thread waits for the slot's tag (acquire, gpu scope). A slot is
  // rewritten kClaimRingSlots tiles later, which the producer cannot reach before the cluster's slowest reader
  // has read it: it runs at most a pipeline's stages ahead of either CTA's consumers (the B tiles are multicast
  // into both CTAs' stages).
  //
  // The readers' wait is the kernel's one wait without a timeout, of the same kind as CUTLASS's own pipeline
  // waits (unbounded mbarrier waits between the warps of one cluster): it waits for a thread of the same
  // cluster, co-resident by construction, that publishes every claim before it waits for anything (its arrival
  // waits come after, and are bounded). Giving up would be worse than waiting: a reader that went on without its
  // claim would leave the cluster's CTAs computing different tiles, and CUTLASS's pipeline would hang. (A cap --
  // a clock with an error record, or a spin count with a trap -- cost 200-230 bytes more spills in every claims
  // kernel: ptxas, nvcc 13.0.)
  CUTLASS_DEVICE uint32_t claimed(uint64_t seq) {
    tandem::kernels::gemm::TileClaims::Slot* slot =
        &arrival_->claims->ring[cluster_][seq % tandem::kernels::gemm::kClaimRingSlots];
    const uint64_t tag = tag0_ | (seq & 0xfffffu);
    if (block_ % kClusterM == 0 && threadIdx.x == 0 && seq >= published_) {
      published_ = seq + 1;
      const uint32_t v = atomicAdd(&arrival_->claims->next[call_ & 63], 1u);
      const uint64_t at = linear_ + uint64_t(kClusterM) * uint64_t(v);
      const bool valid = at < end_ && Base::get_current_work_for_linear_idx(at).is_valid();
      const uint32_t value = valid ? v : kNoTile;
      tandem::device::local_store(&slot->value, uint64_t(value));
      tandem::device::local_publish(&slot->tag, tag);
      return value;
    }
    while (tandem::device::local_acquire(&slot->tag) < tag) __nanosleep(64);
    return uint32_t(tandem::device::local_load(&slot->value));
  }

  // The base maps a linear index to (M, N) with its raster order and swizzle; the M block is then rotated so
  // that the block holding the first row of chunk `first_chunk` comes first, rounded down to a whole cluster so
  // that the clusters (kClusterM M blocks) stay whole, and the tile is handed out once every chunk it reads has landed.
  // Chunks need not be tile multiples (any chunk_rows a multiple of 8): a tile whose rows straddle chunks waits
  // for each of them, and the M blocks past the last row (padding up to the cluster) wait for none.
  CUTLASS_DEVICE WorkTileInfo work_for(uint64_t linear, bool wait) const {
    if (kPieces && linear >= end_) return WorkTileInfo::invalid_work_tile();  // past this call's piece
    WorkTileInfo w = Base::get_current_work_for_linear_idx(linear);
    if (!w.is_valid() || arrival_->flags == nullptr) return w;
    const int64_t rows = int64_t(arrival_->chunk_rows) * arrival_->chunks;
    const int32_t tm = arrival_->tile_m;
    const int32_t m_tiles = int32_t((rows + tm - 1) / tm);
    const int32_t m_blocks = (m_tiles + kClusterM - 1) / kClusterM * kClusterM;  // the base rounds M up to clusters
    // With a swizzle the base pads M further (to whole swizzle groups): such M blocks lie past the last row (no
    // rotation, no wait; the kernel's bounds make them write nothing).
    if (w.M_idx >= m_blocks) return w;
    const int32_t first = int32_t(int64_t(arrival_->first_chunk) * arrival_->chunk_rows / tm) / kClusterM * kClusterM;
    const int32_t rotated = int32_t((int64_t(w.M_idx) + first) % m_blocks);
    w.M_idx = rotated;
    if (wait && rotated < m_tiles) {
      const int64_t row0 = int64_t(rotated) * tm;
      const int64_t row1 = (row0 + tm < rows ? row0 + tm : rows) - 1;
      const int32_t c0 = int32_t(row0 / arrival_->chunk_rows), c1 = int32_t(row1 / arrival_->chunk_rows);
      // Only the mainloop producer warp (warp 0 of the cooperative kernel: it issues every TMA load of A) waits,
      // one lane, acquire, bounded, abortable; the other warps take the tile at once and block on the shared-memory
      // pipeline that warp fills after its wait. (Every warp spinning measured ~100x slower copies beside the GEMM:
      // hundreds of warps polling one L2 line.) Its TMA loads of these rows go through the async proxy, hence the
      // proxy fence. A failed wait is recorded and the tile is computed anyway: the CUTLASS pipeline must stay in
      // step, and every later wait fails fast once the abort flag is up.
      if (threadIdx.x < 32u) {
        if (threadIdx.x == 0) {
          for (int32_t chunk = c0; chunk <= c1; ++chunk) {
            const int peer =
                arrival_->comm.world > 0 ? (arrival_->source_of_chunk0 + chunk) % arrival_->comm.world : -1;
            (void)tandem::device::wait_until_backoff(arrival_->comm, arrival_->flags + chunk,
                                                     tandem::device::Cmp::kGe, epoch_,
                                                     arrival_->poll_sleep_ns, peer);
          }
        }
        __syncwarp();
        asm volatile("fence.proxy.async.global;" ::: "memory");
      }
    }
    return w;
  }

  // The schedule stays where the kernel's parameters are (grid-constant parameter space): a copy in the
  // scheduler object put the whole ArrivalSchedule, its DeviceComm included, on every thread's stack (ptxas:
  // a 552-byte stack frame in the arrival GEMM, none in CUTLASS's own scheduler). epoch_ is the one field the
  // scheduler sets.
  const tandem::kernels::gemm::ArrivalSchedule* arrival_ = nullptr;
  uint64_t epoch_ = 0;
  uint64_t linear_ = 0;
  uint64_t stride_ = 1;
  uint64_t end_ = ~uint64_t(0);  // the end of this call's piece (pieces), else unbounded
  // Claims only:
  int32_t cluster_ = 0;       // this cluster's index in the GEMM grid (its ring)
  int32_t block_ = 0;         // this block's index in the GEMM grid
  int32_t call_ = 0;          // this call's counter
  uint64_t tag0_ = 0;         // (epoch << 26) | (call << 20): the ring tags of this call
  uint64_t seq_ = 0;          // this thread's current work tile number
  uint64_t published_ = 0;    // the claimer: tiles claimed so far
  uint64_t counted_ = 0;      // thread 0: tiles counted into tiles_of_block
};

// The cluster extent along M of the GEMM that instantiates the scheduler.
template <class ClusterShape>
inline constexpr int kArrivalClusterM = static_cast<int>(decltype(cute::size<0>(ClusterShape{}))::value);

template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<tandem::kernels::gemm::ArrivalSchedulerTag, ArchTag, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = TandemArrivalScheduler<false, false, kArrivalClusterM<ClusterShape>>;
};
template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<tandem::kernels::gemm::ArrivalPiecesSchedulerTag, ArchTag, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = TandemArrivalScheduler<true, false, kArrivalClusterM<ClusterShape>>;
};
template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<tandem::kernels::gemm::ArrivalClaimsSchedulerTag, ArchTag, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = TandemArrivalScheduler<false, true, kArrivalClusterM<ClusterShape>>;
};
template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<tandem::kernels::gemm::ArrivalPiecesClaimsSchedulerTag, ArchTag, TileShape,
                             ClusterShape, SchedulerPipelineStageCount> {
  using Scheduler = TandemArrivalScheduler<true, true, kArrivalClusterM<ClusterShape>>;
};

}  // namespace cutlass::gemm::kernel::detail
