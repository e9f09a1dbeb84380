// Other configurations of the GEMM core, an occupancy query per configuration, and a residency probe: for
// measuring why the core runs below cuBLAS on a rank's MPS share (gemm_variants.h).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "sm90_config.hpp"
#include "tandem/kernels/gemm/gemm_variants.h"

namespace tandem::kernels::gemm::variants {

namespace {

using namespace cute;
using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CoopEpi = cutlass::epilogue::TmaWarpSpecializedCooperative;
using Ping = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using PingEpi = cutlass::epilogue::TmaWarpSpecialized;

// How a configuration cuts the K loop: not at all (the persistent scheduler), or through CUTLASS's stream-K
// scheduler as split-K in `splits` slices or as stream-K (work units balanced over the grid). Both reduce the
// partial tiles in fp32 in the workspace, in a fixed order (ReductionMode::Deterministic): the same bits every
// run, not the same bits as the unsplit configurations (another summation order).
enum class Split { kNone, kSplitK, kStreamK };

template <class Config, Split kSplit>
using G = detail::Sm90Gemm<cutlass::bfloat16_t,
                           std::conditional_t<kSplit == Split::kNone, cutlass::gemm::PersistentScheduler,
                                              cutlass::gemm::StreamKScheduler>,
                           Config>;

template <class Config, Split kSplit, int kSplits>
typename G<Config, kSplit>::Device::Arguments split_arguments(const GemmArgs& g) {
  auto args = G<Config, kSplit>::arguments(g);
  if constexpr (kSplit != Split::kNone) {
    using Mode = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamKParams::DecompositionMode;
    using Reduction = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamKParams::ReductionMode;
    args.scheduler.splits = kSplit == Split::kSplitK ? kSplits : 1;
    args.scheduler.decomposition_mode = kSplit == Split::kSplitK ? Mode::SplitK : Mode::StreamK;
    args.scheduler.reduction_mode = Reduction::Deterministic;
  }
  return args;
}

Status fail(std::string* why, const std::string& w, Status s = Status::kInvalidArgument) {
  if (why) *why = w;
  return s;
}

template <class Config, Split kSplit, int kSplits>
size_t workspace_config(const GemmArgs& g) {
  return G<Config, kSplit>::Device::get_workspace_size(split_arguments<Config, kSplit, kSplits>(g));
}

template <class Config, Split kSplit, int kSplits>
Status run_config(const GemmArgs& g, void* workspace, cudaStream_t stream, std::string* why) {
  using Gemm = G<Config, kSplit>;
  auto args = split_arguments<Config, kSplit, kSplits>(g);
  if (workspace == nullptr && Gemm::Device::get_workspace_size(args) != 0)
    return fail(why, "this variant needs a workspace of workspace_size() bytes");
  return detail::run_adapter<typename Gemm::Device>(args, workspace, stream, why,
                                                   "CUTLASS cannot implement this problem");
}

template <class Config, Split kSplit, int kSplits>
Status occupancy_config(const GemmArgs& g, Occupancy* out, std::string* why) {
  using Kernel = typename G<Config, kSplit>::Kernel;
  auto args = split_arguments<Config, kSplit, kSplits>(g);
  if (!Kernel::can_implement(args)) return fail(why, "CUTLASS cannot implement this problem");
  // the grid does not depend on the workspace's address (a stream-K grid needs one: any non-null pointer serves
  // here, nothing is launched)
  static char placeholder_workspace;
  const auto params = Kernel::to_underlying_arguments(args, &placeholder_workspace);
  const dim3 grid = Kernel::get_grid_shape(params);
  const int smem = static_cast<int>(Kernel::SharedStorageSize);
  const void* fn = reinterpret_cast<const void*>(cutlass::device_kernel<Kernel>);
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
    return fail(why, "cudaFuncSetAttribute failed", Status::kCudaError);
  using ClusterShape = typename G<Config, kSplit>::ClusterShape;
  const dim3 cluster(cute::size<0>(ClusterShape{}), cute::size<1>(ClusterShape{}), 1);
  const runtime::ClusterLaunch launch(grid, dim3(Kernel::MaxThreadsPerBlock, 1, 1), static_cast<size_t>(smem), nullptr,
                                      cluster);
  int clusters = 0;
  const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, fn, &launch.config);
  if (e != cudaSuccess) return fail(why, std::string("cudaOccupancyMaxActiveClusters: ") + cudaGetErrorString(e),
                                    Status::kCudaError);
  out->grid_ctas = static_cast<int>(grid.x * grid.y * grid.z);
  out->cluster_size = static_cast<int>(cluster.x * cluster.y);
  out->max_active_clusters = clusters;
  out->smem_bytes = smem;
  return Status::kOk;
}

// One entry per variant: its name and its three functions.
struct Entry {
  const char* name;
  Status (*run)(const GemmArgs&, void*, cudaStream_t, std::string*);
  Status (*occupancy)(const GemmArgs&, Occupancy*, std::string*);
  size_t (*workspace)(const GemmArgs&);
  int cluster_ctas;  // CTAs a cluster: a persistent grid holds whole clusters, so sm_count must be at least this
};

template <int TM, int TN, int CM, class S, class E, Split kSplit = Split::kNone, int kSplits = 1, int CN = 1,
          bool kSwapAB = false>
constexpr Entry entry(const char* name) {
  using C = detail::Sm90Config<TM, TN, CM, S, E, CN, kSwapAB>;
  return Entry{name, &run_config<C, kSplit, kSplits>, &occupancy_config<C, kSplit, kSplits>,
               &workspace_config<C, kSplit, kSplits>, CM * CN};
}

// The split ones share two kernel instantiations (128x128 and 128x256 tiles, cooperative, 1-CTA clusters): the
// decomposition is a runtime argument of the stream-K scheduler. They are for shapes with too few output tiles to
// fill the GPU (small M with long K: 256 x 4096 x 14336 has 64 tiles of 128 x 128 for 132 SMs).
const Entry kEntries[] = {
    entry<128, 256, 2, Coop, CoopEpi>("coop_128x256_c2"),
    entry<128, 256, 1, Coop, CoopEpi>("coop_128x256_c1"),
    entry<256, 128, 1, Coop, CoopEpi>("coop_256x128_c1"),
    entry<128, 128, 1, Ping, PingEpi>("pingpong_128x128_c1"),
    entry<128, 128, 2, Ping, PingEpi>("pingpong_128x128_c2"),
    entry<128, 128, 1, Coop, CoopEpi, Split::kSplitK, 2>("splitk2_128x128_c1"),
    entry<128, 128, 1, Coop, CoopEpi, Split::kSplitK, 4>("splitk4_128x128_c1"),
    entry<128, 128, 1, Coop, CoopEpi, Split::kStreamK>("streamk_128x128_c1"),
    entry<128, 256, 1, Coop, CoopEpi, Split::kStreamK>("streamk_128x256_c1"),
    // Clusters along N (A tiles multicast to the pair) and 256x128 tiles in 2x1 clusters (B multicast): for
    // shapes whose M tiles do not pair up (777 x 4104 x 4096: 7 M tiles of 128, so 2x1 clusters pad to 8 and
    // spill into a second wave) and the ragged shapes where cuBLAS led by 10-28 % (docs/results.md, issue 23).
    entry<128, 256, 1, Coop, CoopEpi, Split::kNone, 1, 2>("coop_128x256_c1x2"),
    entry<256, 128, 2, Coop, CoopEpi>("coop_256x128_c2"),
    // Swapped (D^T = B^T A^T, Sm90Config::kSwapAB), named by the problem's tile M x N: 256 x 128 with the kernel's
    // 128 x 256 tiles running over N x M. Measured on an H100 (docs/results.md, 2026-12-06): the fastest of all
    // configurations at 10 of bench gemm's 24 shapes, up to 18 % faster than the unswapped coop_256x128_c1.
    // And 208 x 128 (the kernel's 128 x 208 tile in 1x2 clusters, pairs along M sharing their B tiles): 4 x 33 = 132
    // tiles at 777 x 4104 x 4096, one per SM, next to the swapped 128 x 200 cuBLAS runs there (CuTe's TMA
    // partitioning refuses 200 rows). Its MMA is one 64x208x16 wgmma per k-slice and warp group because this file
    // is compiled with CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED (kernels/CMakeLists.txt, the whole target): without it CuTe's atom
    // selector knows no 208-wide atom and falls back to 64x16 (13 instructions), which ran 1.35-4.3x slower than
    // the best configuration everywhere (H100, 2026-12-06).
    entry<128, 208, 1, Coop, CoopEpi, Split::kNone, 1, 2, true>("swap_coop_208x128_c2"),
    entry<128, 256, 1, Coop, CoopEpi, Split::kNone, 1, 1, true>("swap_coop_256x128_c1"),
};

const Entry* find(const std::string& name) {
  for (const Entry& e : kEntries)
    if (name == e.name) return &e;
  return nullptr;
}

// A grid of sm_count SMs smaller than one cluster cannot be launched (CUDA refuses it as a cluster
// misconfiguration, a CUDA error, after the arguments were built): refused first as the caller's error.
Status check_cluster_fits(const Entry& e, const GemmArgs& g, std::string* why) {
  if (g.sm_count > 0 && g.sm_count < e.cluster_ctas)
    return fail(why, std::string("sm_count (") + std::to_string(g.sm_count) + ") is smaller than variant '" + e.name +
                         "''s cluster of " + std::to_string(e.cluster_ctas) +
                         " CTAs: a persistent grid holds whole clusters");
  return Status::kOk;
}

__global__ void residency_kernel(int spin_us, int64_t* timeline) {
  extern __shared__ char smem[];  // only its size matters: it limits how many CTAs fit on an SM
  uint64_t t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  if (threadIdx.x == 0) smem[0] = 1;
  for (t1 = t0; t1 - t0 < static_cast<uint64_t>(spin_us) * 1000u;) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  if (threadIdx.x == 0) {
    const int b = blockIdx.x;
    timeline[3 * b] = static_cast<int64_t>(t0);
    timeline[3 * b + 1] = static_cast<int64_t>(t1);
    timeline[3 * b + 2] = static_cast<int64_t>(smid) + smem[0] - 1;
  }
}

}  // namespace

std::vector<std::string> names() {
  std::vector<std::string> v;
  for (const Entry& e : kEntries) v.emplace_back(e.name);
  return v;
}

Status run(const std::string& name, const GemmArgs& g, cudaStream_t stream, std::string* why, void* workspace) {
  const Entry* e = find(name);
  if (e == nullptr) return fail(why, "unknown GEMM variant '" + name + "'");
  if (g.dtype != DType::kBF16) return fail(why, "the GEMM variants are bf16 only");
  if (const Status s = can_implement(g, why); s != Status::kOk) return s;
  if (const Status s = check_cluster_fits(*e, g, why); s != Status::kOk) return s;
  return e->run(g, workspace, stream, why);
}

Status workspace_size(const std::string& name, const GemmArgs& g, size_t* bytes, std::string* why) {
  const Entry* e = find(name);
  if (e == nullptr) return fail(why, "unknown GEMM variant '" + name + "'");
  if (g.dtype != DType::kBF16) return fail(why, "the GEMM variants are bf16 only");
  if (const Status s = can_implement(g, why); s != Status::kOk) return s;
  if (const Status s = check_cluster_fits(*e, g, why); s != Status::kOk) return s;
  *bytes = e->workspace(g);
  return Status::kOk;
}

Status occupancy(const std::string& name, const GemmArgs& g, Occupancy* out, std::string* why) {
  const Entry* e = find(name);
  if (e == nullptr) return fail(why, "unknown GEMM variant '" + name + "'");
  if (const Status s = check_cluster_fits(*e, g, why); s != Status::kOk) return s;
  return e->occupancy(g, out, why);
}

Status residency_probe(int blocks, int cluster_x, int smem_bytes, int spin_us, int64_t* timeline, cudaStream_t stream,
                       std::string* why) {
  if (blocks <= 0 || cluster_x <= 0 || blocks % cluster_x != 0 || smem_bytes < 1 || spin_us <= 0 || timeline == nullptr)
    return fail(why, "blocks must be a positive multiple of cluster_x; smem_bytes >= 1; spin_us > 0; timeline set");
  const void* fn = reinterpret_cast<const void*>(residency_kernel);
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) != cudaSuccess)
    return fail(why, "cudaFuncSetAttribute failed (smem_bytes too large?)", Status::kCudaError);
  if (cluster_x > 1 && cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
    return fail(why, "cudaFuncSetAttribute (cluster size) failed", Status::kCudaError);
  const runtime::ClusterLaunch launch(dim3(static_cast<unsigned>(blocks), 1, 1), dim3(128, 1, 1),
                                      static_cast<size_t>(smem_bytes), stream,
                                      dim3(static_cast<unsigned>(cluster_x), 1, 1));
  const cudaError_t e = cudaLaunchKernelEx(&launch.config, residency_kernel, spin_us, timeline);
  return e == cudaSuccess ? Status::kOk
                          : fail(why, std::string("launch failed: ") + cudaGetErrorString(e), Status::kCudaError);
}

namespace {
__global__ void empty_kernel() {}

// us a call: the median over `reps` batches of 20 calls of f
template <class F>
double median_us(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) f();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 20);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

Status host_costs(int reps, cudaStream_t stream, HostCosts* out, std::string* why) {
  if (reps < 1 || out == nullptr) return fail(why, "reps must be >= 1 and out set");
  void* buf = nullptr;  // TMA descriptors need a 16-byte aligned device address; nothing reads it
  if (cudaMalloc(&buf, 1 << 20) != cudaSuccess) return fail(why, "cudaMalloc failed", Status::kCudaError);
  bool ok = true;
  out->entry_point_lookup_us = median_us(reps, [&] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    ok &= cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess;
  });
  out->tensor_map_encode_us = median_us(reps, [&] {
    CUtensorMap map;
    const cuuint64_t dims[2] = {4096, 4096}, strides[1] = {4096 * 2};
    const cuuint32_t box[2] = {64, 128}, elem[2] = {1, 1};
    ok &= cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, buf, dims, strides, box, elem,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  });
  const void* fn = reinterpret_cast<const void*>(residency_kernel);
  out->func_set_attribute_us = median_us(reps, [&] {
    ok &= cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 << 10) == cudaSuccess;
  });
  out->dynamic_smem_cached_us =
      median_us(reps, [&] { ok &= runtime::ensure_dynamic_smem(fn, 100 << 10) == cudaSuccess; });
  {
    using Gemm = G<detail::Sm90Config<128, 256, 2, Coop, CoopEpi>, Split::kNone>;
    GemmArgs g;
    g.m = g.n = g.k = 4096;
    g.lda = g.ldb = g.ldd = 4096;
    g.a = g.b = g.d = buf;
    g.dtype = DType::kBF16;
    const auto args = Gemm::arguments(g);
    out->gemm_params_us = median_us(reps, [&] {
      const auto params = Gemm::Kernel::to_underlying_arguments(args, nullptr);
      ok &= Gemm::Kernel::get_grid_shape(params).x > 0;
    });
  }
  out->launch_plain_us = median_us(reps, [&] { empty_kernel<<<1, 32, 0, stream>>>(); });
  out->launch_cluster_us = median_us(reps, [&] {
    const runtime::ClusterLaunch launch(dim3(2, 1, 1), dim3(32, 1, 1), 0, stream, dim3(2, 1, 1));
    ok &= cudaLaunchKernelEx(&launch.config, empty_kernel) == cudaSuccess;
  });
  const cudaError_t e = cudaStreamSynchronize(stream);
  cudaFree(buf);
  if (!ok || e != cudaSuccess) return fail(why, "a timed call failed", Status::kCudaError);
  return Status::kOk;
}

}  // namespace tandem::kernels::gemm::variants
