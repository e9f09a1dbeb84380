// CUTLASS 3 instantiation of the GEMM core (sm90a): 128x256x64 tiles, 2x1 clusters, TMA warp-specialized
// cooperative mainloop and epilogue, persistent tile scheduler sized to the rank's SMs.
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

namespace tandem::kernels::gemm {

namespace {

using namespace cute;

template <class Element, class SchedulerTag = cutlass::gemm::PersistentScheduler>
struct Sm90Gemm {
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::RowMajor;
  using LayoutC = cutlass::layout::RowMajor;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte accesses
  using Accumulator = float;
  using TileShape = Shape<_128, _256, _64>;
  using ClusterShape = Shape<_2, _1, _1>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, Accumulator, Element, LayoutC, kAlign, Element,
      LayoutC, kAlign, cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element, LayoutB, kAlign,
      Accumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, SchedulerTag>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Device::Arguments arguments(const GemmArgs& g) {
    using StrideA = typename Device::GemmKernel::StrideA;
    using StrideB = typename Device::GemmKernel::StrideB;
    using StrideC = typename Device::GemmKernel::StrideC;
    using StrideD = typename Device::GemmKernel::StrideD;
    // Row-major A: (M, K) with K contiguous; row-major B as CUTLASS sees it: (N, K) with N contiguous.
    StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(g.m, g.k, 1));
    StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(g.n, g.k, 1));
    StrideC sc = cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(g.m, g.n, 1));
    StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(g.m, g.n, 1));
    cute::get<0>(sa) = g.lda;
    cute::get<1>(sb) = g.ldb;
    cute::get<0>(sc) = g.ldc > 0 ? g.ldc : g.ldd;
    cute::get<0>(sd) = g.ldd;
    cutlass::KernelHardwareInfo hw;
    hw.device_id = 0;
    cudaGetDevice(&hw.device_id);
    hw.sm_count = g.sm_count > 0 ? g.sm_count
                                 : cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw.device_id);
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
    return args;
  }
};

template <class Element, class SchedulerTag = cutlass::gemm::PersistentScheduler>
Status run_typed(const GemmArgs& g, void* workspace, cudaStream_t stream, std::string* why,
                 const ArrivalSchedule* schedule = nullptr) {
  using G = Sm90Gemm<Element, SchedulerTag>;
  typename G::Device op;
  auto args = G::arguments(g);
  if constexpr (std::is_same_v<SchedulerTag, ArrivalSchedulerTag>) args.scheduler.arrival = *schedule;
  if (op.can_implement(args) != cutlass::Status::kSuccess) {
    if (why) *why = "CUTLASS cannot implement this problem (alignment or shape)";
    return Status::kInvalidArgument;
  }
  if (op.initialize(args, workspace, stream) != cutlass::Status::kSuccess) {
    if (why) *why = "CUTLASS initialize failed";
    return Status::kCudaError;
  }
  if (op.run(stream) != cutlass::Status::kSuccess) {
    if (why) *why = std::string("CUTLASS run failed: ") + cudaGetErrorString(cudaGetLastError());
    return Status::kCudaError;
  }
  return Status::kOk;
}

}  // namespace

Status can_implement(const GemmArgs& g, std::string* why) {
  auto fail = [&](const char* w) {
    if (why) *why = w;
    return Status::kInvalidArgument;
  };
  if (g.m <= 0 || g.n <= 0 || g.k <= 0) return fail("M, N and K must be positive");
  if (g.a == nullptr || g.b == nullptr || g.d == nullptr) return fail("A, B and D must be non-null");
  if (g.beta != 0.0f && g.c == nullptr) return fail("beta != 0 needs C");
  if (g.lda < g.k || g.ldb < g.n || g.ldd < g.n || (g.c != nullptr && g.ldc < g.n))
    return fail("leading dimensions must be at least the row length");
  // TMA: 16-byte aligned base addresses and row pitches (8 bf16/fp16 elements).
  const auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) != 0; };
  if (misaligned(g.a) || misaligned(g.b) || misaligned(g.d) || (g.c != nullptr && misaligned(g.c)))
    return fail("A, B, C and D must be 16-byte aligned");
  if (g.lda % 8 || g.ldb % 8 || g.ldd % 8 || (g.c != nullptr && g.ldc % 8) || g.k % 8 || g.n % 8)
    return fail("K, N and the leading dimensions must be multiples of 8 elements (16-byte rows for TMA)");
  if (g.dtype != DType::kBF16 && g.dtype != DType::kFP16) return fail("dtype must be bf16 or fp16");
  return Status::kOk;
}

size_t workspace_size(const GemmArgs& g) {
  if (g.dtype == DType::kFP16) return Sm90Gemm<cutlass::half_t>::Device::get_workspace_size(Sm90Gemm<cutlass::half_t>::arguments(g));
  return Sm90Gemm<cutlass::bfloat16_t>::Device::get_workspace_size(Sm90Gemm<cutlass::bfloat16_t>::arguments(g));
}

Status run(const GemmArgs& g, void* workspace, cudaStream_t stream, std::string* why) {
  if (const Status s = can_implement(g, why); s != Status::kOk) return s;
  if (g.dtype == DType::kFP16) return run_typed<cutlass::half_t>(g, workspace, stream, why);
  return run_typed<cutlass::bfloat16_t>(g, workspace, stream, why);
}

Status can_implement_with_arrivals(const GemmArgs& g, const ArrivalSchedule& a, std::string* why) {
  if (const Status s = can_implement(g, why); s != Status::kOk) return s;
  auto fail = [&](const char* w) {
    if (why) *why = w;
    return Status::kInvalidArgument;
  };
  if (a.flags == nullptr || a.chunks <= 0) return fail("the arrival schedule needs flags and chunks > 0");
  if (a.tile_m != 128 || a.chunk_rows <= 0 || a.chunk_rows % 256 != 0)
    return fail("chunk_rows must be a positive multiple of 256 (tile M 128 x cluster M 2)");
  if (static_cast<int64_t>(a.chunks) * a.chunk_rows != g.m) return fail("M must equal chunks * chunk_rows");
  if (a.first_chunk < 0 || a.first_chunk >= a.chunks) return fail("first_chunk out of range");
  return Status::kOk;
}

Status run_with_arrivals(const GemmArgs& g, const ArrivalSchedule& a, void* workspace, cudaStream_t stream,
                         std::string* why) {
  if (const Status s = can_implement_with_arrivals(g, a, why); s != Status::kOk) return s;
  if (g.dtype == DType::kFP16) return run_typed<cutlass::half_t, ArrivalSchedulerTag>(g, workspace, stream, why, &a);
  return run_typed<cutlass::bfloat16_t, ArrivalSchedulerTag>(g, workspace, stream, why, &a);
}

}  // namespace tandem::kernels::gemm
