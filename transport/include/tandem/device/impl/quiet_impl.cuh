// tandem device API — fence and quiet (implementation).
#pragma once

#include "tandem/device/impl/proxy_impl.cuh"
#include "tandem/device/impl/ptx.cuh"
#include "tandem/device/quiet.cuh"

namespace tandem::device {

__device__ __forceinline__ void fence(const DeviceComm&) { impl::fence_acq_rel_sys(); }

__device__ __forceinline__ Status quiet(const DeviceComm& comm) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
  impl::fence_sc_sys();
  return impl::proxy_quiet(comm);  // commands handed to the proxy: complete at their destination
}

}  // namespace tandem::device
