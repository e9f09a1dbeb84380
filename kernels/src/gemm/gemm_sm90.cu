// The unfused GEMM core (sm90a) on the shared CUTLASS configuration (sm90_config.hpp).
#include <cuda_runtime_api.h>

#include <type_traits>

#include "sm90_config.hpp"

namespace tandem::kernels::gemm {

namespace {

using detail::Sm90Gemm;

template <class Element, class SchedulerTag = cutlass::gemm::PersistentScheduler>
Status run_typed(const GemmArgs& g, void* workspace, cudaStream_t stream, std::string* why,
                 const ArrivalSchedule* schedule = nullptr) {
  using G = Sm90Gemm<Element, SchedulerTag>;
  auto args = G::arguments(g);
  if constexpr (std::is_same_v<SchedulerTag, ArrivalSchedulerTag>) args.scheduler.arrival = *schedule;
  return detail::run_adapter<typename G::Device>(args, workspace, stream, why,
                                                 "CUTLASS cannot implement this problem (alignment or shape)");
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
  if (const char* bad = tile_walk_error(g.max_swizzle, g.raster)) return fail(bad);
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
  if (a.tile_m != 128 || a.chunk_rows <= 0 || a.chunk_rows % 8 != 0)
    return fail("chunk_rows must be a positive multiple of 8 (16-byte rows of A for TMA)");
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

// Load every kernel this file can launch. With lazy module loading (the CUDA 12+ default) the first launch of
// a kernel loads its module, and that load waited for a running persistent kernel on the H200 under MPS; the
// running kernel waited for data the proxy thread could not copy meanwhile (its CUDA calls queued behind the
// load): a deadlock until the device timeout. Loading up front, before anything waits, avoids it.
cudaError_t preload_kernels() {
  cudaFuncAttributes attr{};
  cudaError_t e = cudaSuccess;
  const auto load = [&](const void* f) {
    const cudaError_t r = cudaFuncGetAttributes(&attr, f);
    if (e == cudaSuccess) e = r;
  };
  load(reinterpret_cast<const void*>(cutlass::device_kernel<Sm90Gemm<cutlass::bfloat16_t>::Kernel>));
  load(reinterpret_cast<const void*>(cutlass::device_kernel<Sm90Gemm<cutlass::half_t>::Kernel>));
  load(reinterpret_cast<const void*>(cutlass::device_kernel<Sm90Gemm<cutlass::bfloat16_t, ArrivalSchedulerTag>::Kernel>));
  load(reinterpret_cast<const void*>(cutlass::device_kernel<Sm90Gemm<cutlass::half_t, ArrivalSchedulerTag>::Kernel>));
  return e;
}

}  // namespace tandem::kernels::gemm
