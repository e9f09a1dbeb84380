// FP8 (e4m3) GEMM with tensor-wise or row-wise scales, bf16 out (sm90a): scaled_gemm.h has the contract.
//
// CUTLASS 3: TMA warp-specialized mainloop for FP8 (fp32 accumulation with periodic promotion), persistent grid,
// in one of the configurations of ScaledConfig (scaled_gemm.h): cooperative 128x128x128 tiles in 2x1, 1x1 or 1x2
// clusters, ping-pong 64x128x128, cooperative 128x128x128 split along K by CUTLASS's stream-K scheduler (2
// slices, or stream-K), and cooperative 128x192x128 (2x1 or 1x1 clusters) / ping-pong 64x192x128. No 128x256 (nor
// 256x128, nor ping-pong 64x256) tile: the fp32 promotion buffer doubles the accumulators, 2 x 128 fp32 registers a
// consumer thread against its 232 (setmaxnreg), and ptxas spills about 800-900 bytes a thread (CUDA 13.0, CUTLASS
// 4.2); 128x192 needs 2 x 96 and compiles without spills (highest register about 216 of 232, row-wise). The
// scales in an epilogue visitor tree,
//   D = bf16( scale_a * (scale_b * acc) ),
// with scale_a / scale_b broadcast per row / column (row-wise) or as scalars read from device memory
// (tensor-wise). Why CUTLASS and not cuBLASLt: the same kernel is the GEMM role of the fused TP ops' FP8
// variants, which need the core inside a persistent kernel (docs/architecture.md).
#include <cuda_runtime_api.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "sm90_config.hpp"  // detail::hardware_info, detail::run_adapter, detail::set_tile_walk
#include "sm90_fp8_overlapped_promotion.hpp"

// The 128-wide configurations' mainloop: CUTLASS's FP8 collective with its promotion overlapped
// (sm90_fp8_overlapped_promotion.hpp; the same bits). 0 builds CUTLASS's own mainloop for every configuration (the
// before side of a comparison).
#ifndef TANDEM_FP8_OVERLAPPED_PROMOTION
#define TANDEM_FP8_OVERLAPPED_PROMOTION 1
#endif
#include "tandem/kernels/gemm/scaled_gemm.h"

namespace tandem::kernels::gemm {

namespace {

using namespace cute;

using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CoopEpi = cutlass::epilogue::TmaWarpSpecializedCooperative;
using Ping = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using PingEpi = cutlass::epilogue::TmaWarpSpecialized;

// One configuration's compile-time shape: tile (M, N; K is 128), cluster (M, N), schedules, tile scheduler.
template <int kTileM, int kTileN, int kClusterM, int kClusterN, class Mainloop_, class Epilogue_,
          class Scheduler_ = cutlass::gemm::PersistentScheduler>
struct ScaledShape {
  using TileShape = Shape<Int<kTileM>, Int<kTileN>, _128>;
  using ClusterShape = Shape<Int<kClusterM>, Int<kClusterN>, _1>;
  using MainloopSchedule = Mainloop_;
  using EpilogueSchedule = Epilogue_;
  using Scheduler = Scheduler_;
  // a third fp32 tile of registers (the overlapped promotion's) fits beside 128-wide tiles' 64 a thread, not 192's 96:
  // those overlap half-tile batches instead (two half partials, sm90_fp8_overlapped_promotion.hpp)
  static constexpr bool kOverlappedPromotion = TANDEM_FP8_OVERLAPPED_PROMOTION && kTileN == 128;
  static constexpr bool kSplitPromotion = TANDEM_FP8_OVERLAPPED_PROMOTION && kTileN == 192;
};
using Coop128C2 = ScaledShape<128, 128, 2, 1, Coop, CoopEpi>;
using Coop128C1 = ScaledShape<128, 128, 1, 1, Coop, CoopEpi>;
using Coop128C1x2 = ScaledShape<128, 128, 1, 2, Coop, CoopEpi>;
using Ping64C1 = ScaledShape<64, 128, 1, 1, Ping, PingEpi>;
using Coop128Split = ScaledShape<128, 128, 1, 1, Coop, CoopEpi, cutlass::gemm::StreamKScheduler>;
using Coop192C2 = ScaledShape<128, 192, 2, 1, Coop, CoopEpi>;
using Coop192C1 = ScaledShape<128, 192, 1, 1, Coop, CoopEpi>;
using Ping192C1 = ScaledShape<64, 192, 1, 1, Ping, PingEpi>;

template <Scaling kScaling, class Config>
struct Sm90ScaledGemm {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using LayoutA = cutlass::layout::RowMajor;     // K-major
  using LayoutB = cutlass::layout::ColumnMajor;  // K-major
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignAB = 16;  // 16 bytes of e4m3
  static constexpr int kAlignD = 8;    // 16 bytes of bf16
  using TileShape = typename Config::TileShape;
  using ClusterShape = typename Config::ClusterShape;
  using EpilogueSchedule = typename Config::EpilogueSchedule;
  using MainloopSchedule = typename Config::MainloopSchedule;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  // The scales: per row of D (scale_a, a column broadcast) and per column (scale_b, a row broadcast), or one
  // scalar each.
  using ScaleA = std::conditional_t<
      kScaling == Scaling::kRow,
      cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, int64_t>, 1>,
      cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>>;
  using ScaleB = std::conditional_t<
      kScaling == Scaling::kRow,
      cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>, 1>,
      cutlass::epilogue::fusion::Sm90ScalarBroadcast<float>>;
  using TimesScaleB = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, ScaleB,
      cutlass::epilogue::fusion::Sm90AccFetch>;
  using Scaled = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementD, float, kRound>, ScaleA, TimesScaleB>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignD, ElementD, LayoutD,
      kAlignD, EpilogueSchedule, Scaled>::CollectiveOp;

  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlignAB, ElementB, LayoutB, kAlignAB,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using Mainloop = std::conditional_t<
      Config::kOverlappedPromotion, detail::Fp8OverlappedPromotionMainloop<BuiltMainloop>,
      std::conditional_t<Config::kSplitPromotion, detail::Fp8SplitPromotionMainloop<BuiltMainloop>, BuiltMainloop>>;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      typename Config::Scheduler>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Device::Arguments arguments(const ScaledGemmArgs& g) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(g.m, g.k, 1));
    StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(g.n, g.k, 1));
    StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(g.m, g.n, 1));
    cute::get<0>(sa) = g.lda;  // A (M, K): row m at m * lda
    cute::get<0>(sb) = g.ldb;  // B as CUTLASS sees it, (N, K): column n at n * ldb
    cute::get<0>(sd) = g.ldd;
    const cutlass::KernelHardwareInfo hw = detail::hardware_info(g.sm_count);
    typename Device::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                    {g.m, g.n, g.k, 1},
                                    {static_cast<const ElementA*>(g.a), sa, static_cast<const ElementB*>(g.b), sb},
                                    {{}, nullptr, sd, static_cast<ElementD*>(g.d), sd},
                                    hw};
    // The visitor tree's arguments: {scale_a, {scale_b, acc, multiply}, multiply}.
    detail::set_tile_walk(args.scheduler, g.max_swizzle, g.raster);
    if constexpr (kScaling == Scaling::kRow) {
      args.epilogue.thread = {{g.scale_a, 0.0f, {}}, {{g.scale_b, 0.0f, {}}, {}, {}}, {}};
    } else {
      args.epilogue.thread = {{{1.0f}, {g.scale_a}, {}}, {{{1.0f}, {g.scale_b}, {}}, {}, {}}, {}};
    }
    return args;
  }
};

// The stream-K scheduler's decomposition for a split configuration: K in `splits` slices (split-K) or balanced
// over the grid (stream-K); partial tiles summed in fp32 in the workspace, in a fixed order (deterministic).
template <class Args>
void set_split(Args& args, ScaledConfig config) {
  using Params = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamKParams;
  args.scheduler.splits = config == ScaledConfig::kSplitK2Coop128 ? 2 : 1;
  args.scheduler.decomposition_mode = config == ScaledConfig::kSplitK2Coop128 ? Params::DecompositionMode::SplitK
                                                                              : Params::DecompositionMode::StreamK;
  args.scheduler.reduction_mode = Params::ReductionMode::Deterministic;
}

template <Scaling kScaling, class Config>
typename Sm90ScaledGemm<kScaling, Config>::Device::Arguments config_arguments(const ScaledGemmArgs& g) {
  auto args = Sm90ScaledGemm<kScaling, Config>::arguments(g);
  if constexpr (std::is_same_v<typename Config::Scheduler, cutlass::gemm::StreamKScheduler>) set_split(args, g.config);
  return args;
}

// Calls f.template operator()<Config>() with the configuration type `config` names; false for an unknown one.
template <class F>
bool with_config(ScaledConfig config, F&& f) {
  switch (config) {
    case ScaledConfig::kCoop128C2: f.template operator()<Coop128C2>(); return true;
    case ScaledConfig::kCoop128C1: f.template operator()<Coop128C1>(); return true;
    case ScaledConfig::kCoop128C1x2: f.template operator()<Coop128C1x2>(); return true;
    case ScaledConfig::kPingpong64C1: f.template operator()<Ping64C1>(); return true;
    case ScaledConfig::kSplitK2Coop128:
    case ScaledConfig::kStreamKCoop128: f.template operator()<Coop128Split>(); return true;
    case ScaledConfig::kCoop128x192C2: f.template operator()<Coop192C2>(); return true;
    case ScaledConfig::kCoop128x192C1: f.template operator()<Coop192C1>(); return true;
    case ScaledConfig::kPingpong64x192C1: f.template operator()<Ping192C1>(); return true;
  }
  return false;
}

}  // namespace

Status can_implement(const ScaledGemmArgs& g, std::string* why) {
  auto fail = [&](const char* w) {
    if (why) *why = w;
    return Status::kInvalidArgument;
  };
  if (g.m <= 0 || g.n <= 0 || g.k <= 0) return fail("M, N and K must be positive");
  if (g.a == nullptr || g.b == nullptr || g.d == nullptr) return fail("A, B and D must be non-null");
  if (g.scale_a == nullptr || g.scale_b == nullptr) return fail("scale_a and scale_b must be non-null");
  if (g.scaling != Scaling::kTensor && g.scaling != Scaling::kRow) return fail("scaling must be tensor or row");
  if (static_cast<int>(g.config) < 0 || static_cast<int>(g.config) >= kScaledConfigs)
    return fail("config must be one of ScaledConfig");
  if (g.lda < g.k || g.ldb < g.k || g.ldd < g.n) return fail("leading dimensions must be at least the row length");
  const auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) != 0; };
  if (misaligned(g.a) || misaligned(g.b) || misaligned(g.d)) return fail("A, B and D must be 16-byte aligned");
  if (misaligned(g.scale_a) || misaligned(g.scale_b)) return fail("scale_a and scale_b must be 16-byte aligned");
  if (g.k % 16 || g.lda % 16 || g.ldb % 16)
    return fail("K and the leading dimensions of A and B must be multiples of 16 (16-byte rows of e4m3 for TMA)");
  if (g.n % 8 || g.ldd % 8) return fail("N and the leading dimension of D must be multiples of 8 (16-byte bf16 rows)");
  if (const char* bad = tile_walk_error(g.max_swizzle, g.raster)) return fail(bad);
  return Status::kOk;
}

size_t workspace_size(const ScaledGemmArgs& g) {
  size_t bytes = 0;
  with_config(g.config, [&]<class Config>() {
    bytes = g.scaling == Scaling::kRow
                ? Sm90ScaledGemm<Scaling::kRow, Config>::Device::get_workspace_size(
                      config_arguments<Scaling::kRow, Config>(g))
                : Sm90ScaledGemm<Scaling::kTensor, Config>::Device::get_workspace_size(
                      config_arguments<Scaling::kTensor, Config>(g));
  });
  return bytes;
}

Status run(const ScaledGemmArgs& g, void* workspace, cudaStream_t stream, std::string* why) {
  if (const Status s = can_implement(g, why); s != Status::kOk) return s;
  if (workspace == nullptr && workspace_size(g) != 0) {
    if (why) *why = "this configuration needs a workspace of workspace_size() bytes";
    return Status::kInvalidArgument;
  }
  Status status = Status::kInvalidArgument;
  with_config(g.config, [&]<class Config>() {
    constexpr const char* kCannot = "CUTLASS cannot implement this FP8 problem (alignment or shape)";
    if (g.scaling == Scaling::kRow) {
      status = detail::run_adapter<typename Sm90ScaledGemm<Scaling::kRow, Config>::Device>(
          config_arguments<Scaling::kRow, Config>(g), workspace, stream, why, kCannot);
    } else {
      status = detail::run_adapter<typename Sm90ScaledGemm<Scaling::kTensor, Config>::Device>(
          config_arguments<Scaling::kTensor, Config>(g), workspace, stream, why, kCannot);
    }
  });
  return status;
}

cudaError_t preload_scaled_kernels() {
  // every configuration's two kernels (row-wise, tensor-wise): the first launch must not load modules while a
  // peer waits (docs/reliability.md)
  cudaError_t first = cudaSuccess;
  for (int c = 0; c < kScaledConfigs; ++c) {
    with_config(static_cast<ScaledConfig>(c), [&]<class Config>() {
      cudaFuncAttributes attr{};
      const cudaError_t a = cudaFuncGetAttributes(
          &attr, cutlass::device_kernel<typename Sm90ScaledGemm<Scaling::kRow, Config>::Kernel>);
      const cudaError_t b = cudaFuncGetAttributes(
          &attr, cutlass::device_kernel<typename Sm90ScaledGemm<Scaling::kTensor, Config>::Kernel>);
      if (first == cudaSuccess) first = a != cudaSuccess ? a : b;
    });
  }
  return first;
}

}  // namespace tandem::kernels::gemm
