// tandem kernels — host-side launch state set once per kernel and device, not once per call.
//
// Why: every launch of a kernel with more than 48 KB of dynamic shared memory needs the function attribute
// cudaFuncAttributeMaxDynamicSharedMemorySize set on the device first. CUTLASS's GemmUniversalAdapter::initialize
// and tandem's own launchers set it on every call, and the call takes the driver's function lock: host time a
// call that is paid again for an attribute that never changes. The GEMM op's host path (tools/diag/
// gemm_host_path.py) was 11-12 us a call against 13-14 us for all of torch.matmul's (cuBLAS's, dispatch and output
// allocation included), which is the whole single-call gap at small shapes (issue 23).
//
// Contract: ensure_dynamic_smem(fn, bytes) returns what cudaFuncSetAttribute would, but calls it only when
// (fn, current device) has not been raised to at least `bytes` yet in this process. Thread-safe (one mutex, held
// only for the lookup and the call). A failed call is not remembered, so the next launch tries again and reports
// the same error. The attribute is a property of the function in the device's primary context, which tandem's
// launches all use; a caller that destroys and re-creates the primary context (cudaDeviceReset) must call
// forget_dynamic_smem() after it.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <utility>

namespace tandem::kernels::runtime {

namespace detail {
struct DynamicSmemCache {
  std::mutex lock;
  std::map<std::pair<const void*, int>, int> raised;  // (function, device) -> bytes set
};
// One per process (an inline function's static: the same object in every translation unit).
inline DynamicSmemCache& dynamic_smem_cache() {
  static DynamicSmemCache cache;
  return cache;
}
}  // namespace detail

inline cudaError_t ensure_dynamic_smem(const void* fn, int bytes) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  auto& cache = detail::dynamic_smem_cache();
  std::lock_guard<std::mutex> hold(cache.lock);
  const auto key = std::make_pair(fn, device);
  if (auto it = cache.raised.find(key); it != cache.raised.end() && it->second >= bytes) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) cache.raised[key] = bytes;
  return e;
}

template <class Kernel>
cudaError_t ensure_dynamic_smem(Kernel* fn, int bytes) {
  return ensure_dynamic_smem(reinterpret_cast<const void*>(fn), bytes);
}

// After cudaDeviceReset: every attribute is back at its default, so the next launch sets it again.
inline void forget_dynamic_smem() {
  auto& cache = detail::dynamic_smem_cache();
  std::lock_guard<std::mutex> hold(cache.lock);
  cache.raised.clear();
}

}  // namespace tandem::kernels::runtime
