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
// reason when the problem is not implementable). The steps of GemmUniversalAdapter::initialize and run, with two
// function attributes no longer set on every call: the dynamic shared memory (once per kernel and context,
// runtime/launch_cache.hpp; initialize() set it per call) and, for clusters, NonPortableClusterSizeAllowed
// (CUTLASS's ClusterLauncher sets it per launch; tandem's clusters are of 2 CTAs, which is portable, so the launch
// below needs none). The launch's host time is what small GEMMs wait for (issue 23).
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
  // GemmUniversalAdapter::run's launch: a plain launch for 1x1x1 clusters, else cudaLaunchKernelEx with the
  // cluster dimension (no PDL, no host adapter)
  using ClusterShape = typename Kernel::DispatchPolicy::ClusterShape;
  constexpr int kCx = cute::size<0>(ClusterShape{}), kCy = cute::size<1>(ClusterShape{}),
                kCz = cute::size<2>(ClusterShape{});
  static_assert(kCx * kCy * kCz <= 8, "a portable cluster size (no NonPortableClusterSizeAllowed attribute)");
  const dim3 grid = Device::get_grid_shape(params), block = Kernel::get_block_shape();
  cudaError_t e = cudaSuccess;
  if constexpr (kCx * kCy * kCz == 1) {
    cutlass::device_kernel<Kernel><<<grid, block, smem, stream>>>(params);
    e = cudaGetLastError();
  } else {
    const runtime::ClusterLaunch launch(grid, block, static_cast<size_t>(smem), stream, dim3(kCx, kCy, kCz));
    e = cudaLaunchKernelEx(&launch.config, cutlass::device_kernel<Kernel>, params);
    if (e != cudaSuccess) (void)cudaGetLastError();
  }
  if (e != cudaSuccess) {
    if (why) *why = std::string("CUTLASS kernel launch failed: ") + cudaGetErrorString(e);
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
    // The kernel's problem: D (M x N) = A @ B, or swapped D^T (N x M) = B^T @ A^T, i.e. M and N, A and B, and their
    // leading dimensions trade places. Unswapped: A (M, K) with K contiguous, B as CUTLASS sees it (N, K) with N
    // contiguous, D (M, N) with N contiguous: row-major layouts, whose leading dimension is stride mode 0 of A, C
    // and D and mode 1 of B. Swapped, the kernel's A = B^T (N, K) has N contiguous, its B = A^T as (M, K) has K
    // contiguous and its D = D^T (N, M) has N contiguous: column-major layouts, the modes the other way round.
    const int m = kSwapAB ? g.n : g.m, n = kSwapAB ? g.m : g.n;
    const void* a = kSwapAB ? g.b : g.a;
    const void* b = kSwapAB ? g.a : g.b;
    const int64_t lda = kSwapAB ? g.ldb : g.lda, ldb = kSwapAB ? g.lda : g.ldb;
    constexpr int kLeading = kSwapAB ? 1 : 0;  // the leading-dimension mode of A, C and D (B's: the other one)
    StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(m, g.k, 1));
    StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(n, g.k, 1));
    StrideC sc = cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(m, n, 1));
    StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(m, n, 1));
    cute::get<kLeading>(sa) = lda;
    cute::get<1 - kLeading>(sb) = ldb;
    cute::get<kLeading>(sc) = g.ldc > 0 ? g.ldc : g.ldd;
    cute::get<kLeading>(sd) = g.ldd;
    typename Device::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, g.k, 1},
        {static_cast<const Element*>(a), sa, static_cast<const Element*>(b), sb},
        {{g.alpha, g.beta},
         static_cast<const Element*>(g.c != nullptr ? g.c : g.d),
         sc,
         static_cast<Element*>(g.d),
         sd},
        hardware_info(g.sm_count)};
    // the raster is the problem's (GemmArgs::Raster: along its M or N); swapped, the kernel's M is the problem's N
    GemmArgs::Raster raster = g.raster;
    if (kSwapAB && raster != GemmArgs::Raster::kHeuristic)
      raster = raster == GemmArgs::Raster::kAlongM ? GemmArgs::Raster::kAlongN : GemmArgs::Raster::kAlongM;
    set_tile_walk(args.scheduler, g.max_swizzle, raster);
    return args;
  }
};

}  // namespace tandem::kernels::gemm::detail
