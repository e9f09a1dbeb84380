// tandem kernels — host-side launch state set once per kernel and device, not once per call.
//
// Why: every launch of a kernel with more than 48 KB of dynamic shared memory needs the function attribute
// cudaFuncAttributeMaxDynamicSharedMemorySize set on the device first. CUTLASS's GemmUniversalAdapter::initialize
// and tandem's own launchers set it on every call, and the call takes the driver's function lock: host time a
// call that is paid again for an attribute that never changes (0.6 us of a 4.5-5 us launch on an H100 host,
// tools/diag/gemm_host_path.py; issue 23's small shapes wait for the host).
//
// Contract: ensure_dynamic_smem(fn, bytes) returns what cudaFuncSetAttribute would, but calls it only when (fn, the
// calling thread's current CUDA context) has not been raised to at least `bytes` yet in this process. The key is
// the context's unique id (cuCtxGetId), not the device number, so a context made after cudaDeviceReset, or a
// second context on the same device, gets the attribute set again; where the id cannot be read (no current context,
// a driver without cuCtxGetId) the attribute is set on every call, as before. Thread-safe: the mutex guards the
// lookup and the record only, not the driver call (a first call may load the kernel's module, which must not hold
// up other threads' launches); two threads racing on a first call both set the same attribute, which is harmless.
// A failed call is not remembered (the next launch tries again and reports the same error) and its error is
// taken off the runtime's sticky last-error slot, as CUTLASS's initialize() does, so that it does not surface in an
// unrelated later check.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace tandem::kernels::runtime {

namespace detail {
struct DynamicSmemCache {
  std::mutex lock;
  std::map<std::pair<const void*, unsigned long long>, int> raised;  // (function, context id) -> bytes set
};
// One per process (an inline function's static: the same object in every translation unit of one binary).
inline DynamicSmemCache& dynamic_smem_cache() {
  static DynamicSmemCache cache;
  return cache;
}

// The current context's unique id, or false. The two driver functions are looked up once (no libcuda link).
inline bool current_context_id(unsigned long long* id) {
  using GetCurrent = CUresult (*)(CUcontext*);
  using GetId = CUresult (*)(CUcontext, unsigned long long*);
  struct Fns {
    GetCurrent get_current = nullptr;
    GetId get_id = nullptr;
  };
  static const Fns fns = [] {
    Fns f;
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      f.get_current = reinterpret_cast<GetCurrent>(p);
    p = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetId", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      f.get_id = reinterpret_cast<GetId>(p);
    return f;
  }();
  CUcontext ctx = nullptr;
  if (fns.get_current == nullptr || fns.get_id == nullptr || fns.get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr)
    return false;
  return fns.get_id(ctx, id) == CUDA_SUCCESS;
}
}  // namespace detail

inline cudaError_t ensure_dynamic_smem(const void* fn, int bytes) {
  auto& cache = detail::dynamic_smem_cache();
  unsigned long long ctx = 0;
  const bool keyed = detail::current_context_id(&ctx);
  const auto key = std::make_pair(fn, ctx);
  if (keyed) {
    std::lock_guard<std::mutex> hold(cache.lock);
    if (auto it = cache.raised.find(key); it != cache.raised.end() && it->second >= bytes) return cudaSuccess;
  }
  const cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // reported here, not again by the next unrelated check
    return e;
  }
  if (keyed) {
    std::lock_guard<std::mutex> hold(cache.lock);
    int& set = cache.raised[key];
    if (set < bytes) set = bytes;
  }
  return cudaSuccess;
}

template <class Kernel>
cudaError_t ensure_dynamic_smem(Kernel* fn, int bytes) {
  return ensure_dynamic_smem(reinterpret_cast<const void*>(fn), bytes);
}

// A launch configuration with a cluster dimension (cudaLaunchKernelEx / cudaOccupancyMaxActiveClusters): the one
// spelling of it for every clustered launch and query of the kernels layer. `config` points at `cluster`, so the
// object is neither copied nor moved.
struct ClusterLaunch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute cluster{};
  ClusterLaunch(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, dim3 cluster_dim) {
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = cluster_dim.x;
    cluster.val.clusterDim.y = cluster_dim.y;
    cluster.val.clusterDim.z = cluster_dim.z;
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Forget every recorded attribute (they are keyed by context, so this is never needed for correctness; it bounds
// the cache of a process that makes many contexts).
inline void forget_dynamic_smem() {
  auto& cache = detail::dynamic_smem_cache();
  std::lock_guard<std::mutex> hold(cache.lock);
  cache.raised.clear();
}

}  // namespace tandem::kernels::runtime
