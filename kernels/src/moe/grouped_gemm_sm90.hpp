// tandem kernels (private) — the experts' grouped GEMM on CUTLASS 3's pointer-array kernel (sm90a): one group per
// local expert, y_j (M_j x I) = x_j (M_j x H) @ W_j (H x I), bf16/fp16 in, fp32 accumulate, M_j read from device
// memory (the dispatch computes them; no host sync), 128x256x64 tiles, 2x1 clusters (the fused kernel and the
// default) or 1x1 clusters (kClusterM = 1: the GEMM alone, TANDEM_MOE_GEMM_CLUSTER=1; see Sm90GroupedGemm).
//
// CUTLASS's group tile scheduler is kept; a derived scheduler (selected through TileSchedulerSelector on
// tandem's problem-shape type) adds what the fused kernel needs:
//   * a virtual grid: the GEMM blocks are rows [y0, y0 + Gy) of a grid whose other rows dispatch tokens, so
//     the linear tile index starts at blockIdx.x + 2 (blockIdx.y - y0) and strides by 2 Gy;
//   * before a tile of group j is handed out (and before the mainloop producer loads its first tile), one
//     thread waits (bounded, abortable: the device API's wait_until_backoff) until every source rank that sends
//     expert j rows has signalled their arrival for this epoch, then fences the async proxy (the TMA loads that
//     follow read what peers stored).
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "tandem/device.cuh"
#include "tandem/kernels/runtime/persistent.cuh"
#include "tandem/kernels/runtime/trace.cuh"

namespace tandem::kernels::moe::detail {

// The dispatch launch's diagnostic timeline (TANDEM_MOE_TRACE=1, moe_sm90.cu), the runtime's (trace.cuh):
// kTraceSlots globaltimer slots for each of the first kTraceBlocks blocks, no SM slot (moe::trace_snapshot's
// layout, 512 x 8); the dispatch kernel stamps slots 0-5, the scheduler writes slots 2, 6 and 7.
constexpr int kTraceSlots = 8, kTraceBlocks = 512;
using MoeTimeline = tandem::kernels::runtime::TimelineOf<kTraceBlocks, kTraceSlots, /*RecordSm=*/false>;

// What the scheduler waits on. flags == nullptr: no waits (the unfused GEMM, launched after the dispatch).
struct ExpertArrivals {
  const uint64_t* flags = nullptr;          // [group * world + source]: epoch when source's rows have landed
  const int32_t* counts = nullptr;          // [source * experts_total + expert]: rows source sends expert
  const uint64_t* epoch_counter = nullptr;  // the workspace's completed epoch; this launch waits for it + 1
  int world = 1;
  int expert0 = 0;                          // global id of group 0 (rank * experts_per_rank)
  int experts_total = 1;
  int gemm_block_y0 = 0;                    // first grid row of GEMM blocks
  int gemm_grid_y = 0;                      // rows of GEMM blocks (0: the whole grid)
  uint32_t poll_sleep_ns = 5000;           // between polls: each poll costs the senders memory bandwidth
  MoeTimeline timeline{};                   // diagnostic (moe_sm90.cu): slots 2, 6, 7 of each block
  tandem::DeviceComm comm{};
};

struct ExpertProblemShape : cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>> {
  ExpertArrivals arrivals{};
};

}  // namespace tandem::kernels::moe::detail

namespace cutlass::gemm::kernel::detail {

template <class GroupProblemShape, int SchedulerPipelineStageCount>
class ExpertArrivalScheduler : public PersistentTileSchedulerSm90Group<GroupProblemShape, SchedulerPipelineStageCount> {
  using Base = PersistentTileSchedulerSm90Group<GroupProblemShape, SchedulerPipelineStageCount>;

 public:
  using Params = typename Base::Params;
  using WorkTileInfo = typename Base::WorkTileInfo;
  using RasterOrder = typename Base::RasterOrder;
  ExpertArrivalScheduler() = default;

  CUTLASS_DEVICE ExpertArrivalScheduler(Params const& params, typename Base::SchedulerResponse* response)
      : Base(params, response) {
#if defined(__CUDA_ARCH__)
    const auto& a = params.problem_shapes_.arrivals;
    const uint64_t y = a.gemm_grid_y > 0 ? uint64_t(blockIdx.y) - uint64_t(a.gemm_block_y0) : uint64_t(blockIdx.y);
    const uint64_t gy = a.gemm_grid_y > 0 ? uint64_t(a.gemm_grid_y) : uint64_t(gridDim.y);
    // raster AlongN with a grid 2 wide (the 2x1 cluster): x is the cluster's minor index. The 1x1-cluster kernel
    // (raster AlongM) is launched on a grid one row high: blockIdx.y, the base's minor offset for AlongM, is 0.
    linear_idx_ = uint64_t(blockIdx.x) + y * uint64_t(gridDim.x);
    grid_size_ = uint64_t(gridDim.x) * gy;
#endif
  }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    WorkTileInfo w = this->get_current_work_for_linear_idx(linear_idx_);
    // Every warp calls this for its first tile, but only the mainloop producer (warp 0) reads what the peers
    // store (the A rows, by TMA); the scheduler warp waits before it publishes each later tile. Polling from all
    // twelve warps of every block starved the dispatch's sends ~60x on the H200 (tools/diag/moe_fused.py).
    if (w.is_valid() && cutlass::canonical_warp_idx_sync() == 0) wait_group(w.L_idx, true);
    return w;
  }

  template <class TileSchedulerPipeline, class TileSchedulerPipelineState>
  CUTLASS_DEVICE auto advance_to_next_work(TileSchedulerPipeline& pipeline, TileSchedulerPipelineState state,
                                           uint32_t advance_count = 1) {
    linear_idx_ += grid_size_ * uint64_t(advance_count);
    WorkTileInfo w = this->get_current_work_for_linear_idx(linear_idx_);
    if (w.is_valid()) wait_group(w.L_idx, false);  // before the consumers see the tile
    pipeline.producer_acquire(state);
    if (cute::elect_one_sync()) {
      this->response_ptr_[state.index()] = w;
      cutlass::arch::fence_view_async_shared();
      pipeline.producer_commit(state);
    }
    return cute::make_tuple(w, true);
  }

 private:
  CUTLASS_DEVICE void wait_group(int group, bool initial) {
    const auto& a = this->scheduler_params.problem_shapes_.arrivals;
    if (a.flags == nullptr || group == waited_group_) return;
    waited_group_ = group;
    if (cute::elect_one_sync()) {
      using namespace tandem::device;
      const uint64_t t0 = a.timeline.on() ? tandem::device::now_ns() : 0;
      const uint64_t epoch = tandem::kernels::runtime::epoch_after(a.epoch_counter);
      const int expert = a.expert0 + group;
      tandem::Status st = tandem::Status::kOk;
      for (int s = 0; s < a.world && st == tandem::Status::kOk; ++s) {
        if (a.counts[s * a.experts_total + expert] == 0) continue;
        st = wait_until_backoff(a.comm, a.flags + group * a.world + s, Cmp::kGe, epoch, a.poll_sleep_ns, s);
      }
      // A failed wait leaves the abort flag up: the tile is still computed so every block stays in step.
      asm volatile("fence.proxy.async.global;" ::: "memory");
      // slot 2: when the mainloop producer got its first tile; 6 / 7: the scheduler's later waits, time and count
      if (uint64_t* const trace_row = a.timeline.row()) {
        const uint64_t t1 = tandem::device::now_ns();
        unsigned long long* row = reinterpret_cast<unsigned long long*>(trace_row);
        if (initial) {
          atomicMax(row + 2, static_cast<unsigned long long>(t1));
        } else {
          atomicAdd(row + 6, static_cast<unsigned long long>(t1 - t0));
          atomicAdd(row + 7, 1ull);
        }
      }
    }
    __syncwarp();
  }

  uint64_t linear_idx_ = 0;
  uint64_t grid_size_ = 0;
  int waited_group_ = -1;
};

template <class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<GroupScheduler, arch::Sm90, TileShape, ClusterShape, SchedulerPipelineStageCount,
                             tandem::kernels::moe::detail::ExpertProblemShape> {
  using Scheduler =
      ExpertArrivalScheduler<tandem::kernels::moe::detail::ExpertProblemShape, SchedulerPipelineStageCount>;
};

}  // namespace cutlass::gemm::kernel::detail

namespace tandem::kernels::moe::detail {

using namespace cute;

// kClusterM = 2 (the default, and the only one the fused dispatch + GEMM kernel runs): 2x1 clusters sharing each B
// tile by multicast, raster along N, launched on a grid 2 blocks wide. Where an expert has at most 128 rows (1k
// tokens a rank at the DeepSeek config: ~64 rows an expert at world 2) the cluster's second block has no rows and
// computes nothing, so half the grid streams the weights, which is the GEMM's whole cost there (every weight byte
// is read once; the math is small). kClusterM = 1: every block takes a (row tile, column tile) of its own, raster
// along M so that the row tiles of one expert's column tile run side by side and share its B tile through L2
// instead of multicast; launched on a grid one row high (the base scheduler's AlongM minor offset is blockIdx.y).
// The tile, the mainloop and the K order are the same: both compute the same bits.
template <class Element, int kClusterM = 2>
struct Sm90GroupedGemm {
  static_assert(kClusterM == 1 || kClusterM == 2, "2x1 or 1x1 clusters");
  using Layout = cutlass::layout::RowMajor;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;
  static constexpr int kClusterRows = kClusterM;
  using TileShape = Shape<_128, _256, _64>;
  using ClusterShape = Shape<Int<kClusterM>, _1, _1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, Layout*, kAlign, Element, Layout*, kAlign,
      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<Element, float, void, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, Layout*, kAlign, Element, Layout*, kAlign, float,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ExpertProblemShape, Mainloop, Epilogue>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using Shape3 = typename ExpertProblemShape::UnderlyingProblemShape;

  // Device arrays (one entry per group) the dispatch fills before the GEMM runs.
  struct Arrays {
    Shape3* shapes;
    const Element** a;
    const Element** b;
    Element** d;
    StrideA* da;
    StrideB* db;
    StrideD* dd;
  };

  // `arr`: this type's Arrays or another cluster shape's (the dispatch fills the default's; the element, layout
  // and stride types are the same, checked here).
  template <class ArraysOf>
  static typename Kernel::Arguments arguments(int groups, const ArraysOf& arr, const ExpertArrivals& arrivals,
                                              int sm_slots) {
    static_assert(std::is_same_v<decltype(arr.da), StrideA*> && std::is_same_v<decltype(arr.db), StrideB*> &&
                      std::is_same_v<decltype(arr.dd), StrideD*> && std::is_same_v<decltype(arr.shapes), Shape3*>,
                  "the arrays of another cluster shape must have this one's types");
    ExpertProblemShape shape;
    shape.num_groups = groups;
    shape.problem_shapes = arr.shapes;
    shape.host_problem_shapes = nullptr;
    shape.arrivals = arrivals;
    cutlass::KernelHardwareInfo hw;
    cudaGetDevice(&hw.device_id);
    hw.sm_count = sm_slots;  // tensormap slots: one per block of the launch grid (indexed by the raw block id)
    typename Kernel::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                    shape,
                                    {arr.a, arr.da, arr.b, arr.db},
                                    {{}, nullptr, nullptr, arr.d, arr.dd},
                                    hw};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.scheduler.raster_order = kClusterM == 2 ? decltype(args.scheduler.raster_order)::AlongN
                                                 : decltype(args.scheduler.raster_order)::AlongM;
    return args;
  }
};

}  // namespace tandem::kernels::moe::detail
