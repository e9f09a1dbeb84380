// tandem kernels (private) — the CUTLASS 3 configuration of the Hopper GEMM core, shared by the unfused GEMM
// and the fused TP kernels: 128x256x64 tiles, 2x1 clusters, TMA warp-specialized cooperative mainloop and
// epilogue, persistent tile scheduler sized to the SMs it is given.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "tandem/kernels/gemm/arrival_scheduler.hpp"
#include "tandem/kernels/gemm/gemm.h"
#include "tandem/kernels/runtime/launch_cache.hpp"

namespace tandem::kernels::gemm::detail {

using namespace cute;

// The tile, cluster and schedules of one GEMM configuration. CooperativeConfig is the core's (and the fused
// kernels'); the others exist for measuring (kernels/src/gemm/gemm_variants_sm90.cu, tools/diag/gemm_mps.py).
// kClusterN > 1 pairs CTAs along N: they share (TMA-multicast) their A tiles, as kClusterM > 1 shares B tiles.
// kSwapAB: the kernel computes D^T = B^T A^T instead, so its tile M runs over the problem's N and its tile N over
// the problem's M (the kernel's (M, N, K) is the problem's (N, M, K); D is written column-major as D^T, which is
// D row-major). This is how cuBLAS serves shapes whose M is small or ragged: the wide, freely sized wgmma N
// dimension (any multiple of 8 up to 256) goes where it makes the tiles fill the GPU (777 x 4104 x 4096: tiles of
// 128 over N and 200 over M give 33 x 4 = 132 tiles, one per SM of an H100/H200). kTileM / kTileN / kClusterM /
// kClusterN are the kernel's, i.e. the swapped ones.
template <int kTileM, int kTileN, int kClusterM, class MainloopSchedule_, class EpilogueSchedule_, int kClusterN = 1,
          bool kSwapAB_ = false>
struct Sm90Config {
  using TileShape = Shape<Int<kTileM>, Int<kTileN>, _64>;
  using ClusterShape = Shape<Int<kClusterM>, Int<kClusterN>, _1>;
  using MainloopSchedule = MainloopSchedule_;
  using EpilogueSchedule = EpilogueSchedule_;
  static constexpr bool kSwapAB = kSwapAB_;
};
using CooperativeConfig = Sm90Config<128, 256, 2, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                     cutlass::epilogue::TmaWarpSpecializedCooperative>;

// The hardware a persistent grid is sized to: this device, `sm_count` SMs (0 = all of the device's).
inline cutlass::KernelHardwareInfo hardware_info(int sm_count) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count > 0 ? sm_count : cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw.device_id);
  return hw;
}

// A tile walk (max_swizzle, raster: GemmArgs') into a CUTLASS persistent or stream-K scheduler's arguments.
template <class SchedulerArguments>
void set_tile_walk(SchedulerArguments& s, int max_swizzle, GemmArgs::Raster raster) {
  using RasterOrder = decltype(s.raster_order);
  s.max_swizzle_size = max_swizzle;
  s.raster_order = raster == GemmArgs::Raster::kAlongM   ? RasterOrder::AlongM
                   : raster == GemmArgs::Raster::kAlongN ? RasterOrder::AlongN
                                                         : RasterOrder::Heuristic;
}

// A CUTLASS device adapter's can_implement -> initialize -> run, as tandem's Status and reason (`cannot`: the
// reason when the problem is not implementable). The steps of GemmUniversalAdapter::initialize and run, but the
// kernel's shared-memory attribute is set once per kernel and device (runtime/launch_cache.hpp), not on every
// call as initialize() does: the launch's host time is what small GEMMs wait for (issue 23).
template <class Device>
Status run_adapter(const typename Device::Arguments& args, void* workspace, cudaStream_t stream, std::string* why,
                   const char* cannot) {
  using Kernel = typename Device::GemmKernel;
  if (!Kernel::can_implement(args)) {
    if (why) *why = cannot;
    return Status::kInvalidArgument;
  }
  // zeroes what a split / stream-K reduction needs of the workspace (stream-ordered); nothing for the others
  if (Kernel::initialize_workspace(args, workspace, stream, nullptr) != cutlass::Status::kSuccess) {
    if (why) *why = "CUTLASS initialize failed (workspace)";
    return Status::kCudaError;
  }
  typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);
  const int smem = static_cast<int>(Kernel::SharedStorageSize);
  if (const cudaError_t e = runtime::ensure_dynamic_smem(cutlass::device_kernel<Kernel>, smem); e != cudaSuccess) {
    if (why) *why = std::string("cudaFuncSetAttribute (dynamic shared memory) failed: ") + cudaGetErrorString(e);
    return Status::kCudaError;
  }
  if (Device::run(params, stream) != cutlass::Status::kSuccess) {
    if (why) *why = std::string("CUTLASS run failed: ") + cudaGetErrorString(cudaGetLastError());
    return Status::kCudaError;
  }
  return Status::kOk;
}

template <class Element, class SchedulerTag = cutlass::gemm::PersistentScheduler, class Config = CooperativeConfig>
struct Sm90Gemm {
  static constexpr bool kSwapAB = Config::kSwapAB;
  // Row-major A, B and D; swapped, the kernel's A is B^T (N x K with N contiguous: column-major), its B is A^T
  // (K x M with K contiguous: column-major) and its D is D^T (N x M with N contiguous: column-major).
  using LayoutA = std::conditional_t<kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutB = std::conditional_t<kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutC = std::conditional_t<kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte accesses
  using Accumulator = float;
  using TileShape = typename Config::TileShape;
  using ClusterShape = typename Config::ClusterShape;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, Accumulator, Element, LayoutC, kAlign, Element,
      LayoutC, kAlign, typename Config::EpilogueSchedule>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element, LayoutB, kAlign,
      Accumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Config::MainloopSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, SchedulerTag>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Device::Arguments arguments(const GemmArgs& g) {
    using StrideA = typename Device::GemmKernel::StrideA;
    using StrideB = typename Device::GemmKernel::StrideB;
    using StrideC = typename Device::GemmKernel::StrideC;
    using StrideD = typename Device::GemmKernel::StrideD;
    const cutlass::KernelHardwareInfo hw = hardware_info(g.sm_count);
    if constexpr (kSwapAB) {
      // The kernel's A = B^T as (N, K): element (n, k) at k * ldb + n; its B = A^T as CUTLASS's (N', K) = (M, K):
      // element (m, k) at m * lda + k; its D = D^T as (N, M): element (n, m) at m * ldd + n.
      StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(g.n, g.k, 1));
      StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(g.m, g.k, 1));
      StrideC sc = cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(g.n, g.m, 1));
      StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(g.n, g.m, 1));
      cute::get<1>(sa) = g.ldb;
      cute::get<0>(sb) = g.lda;
      cute::get<1>(sc) = g.ldc > 0 ? g.ldc : g.ldd;
      cute::get<1>(sd) = g.ldd;
      typename Device::Arguments args{
          cutlass::gemm::GemmUniversalMode::kGemm,
          {g.n, g.m, g.k, 1},
          {static_cast<const Element*>(g.b), sa, static_cast<const Element*>(g.a), sb},
          {{g.alpha, g.beta},
           static_cast<const Element*>(g.c != nullptr ? g.c : g.d),
           sc,
           static_cast<Element*>(g.d),
           sd},
          hw};
      set_tile_walk(args.scheduler, g.max_swizzle, g.raster);
      return args;
    } else {
      // Row-major A: (M, K) with K contiguous; row-major B as CUTLASS sees it: (N, K) with N contiguous.
      StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(g.m, g.k, 1));
      StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(g.n, g.k, 1));
      StrideC sc = cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(g.m, g.n, 1));
      StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(g.m, g.n, 1));
      cute::get<0>(sa) = g.lda;
      cute::get<1>(sb) = g.ldb;
      cute::get<0>(sc) = g.ldc > 0 ? g.ldc : g.ldd;
      cute::get<0>(sd) = g.ldd;
      typename Device::Arguments args{
          cutlass::gemm::GemmUniversalMode::kGemm,
          {g.m, g.n, g.k, 1},
          {static_cast<const Element*>(g.a), sa, static_cast<const Element*>(g.b), sb},
          {{g.alpha, g.beta},
           static_cast<const Element*>(g.c != nullptr ? g.c : g.d),
           sc,
           static_cast<Element*>(g.d),
           sd},
          hw};
      set_tile_walk(args.scheduler, g.max_swizzle, g.raster);
      return args;
    }
  }
};

}  // namespace tandem::kernels::gemm::detail
