// tandem device API — wait_until (implementation).
//
// Spins with relaxed system-scope loads and upgrades the successful load to acquire with a fence, which is
// cheaper than an acquire load per iteration. The abort flag (host-mapped, so a PCIe read) and the clock are
// checked every kCheckInterval spins only, keeping the flag round trip at the load latency.
#pragma once

#include "tandem/device/impl/errors.cuh"
#include "tandem/device/impl/ptx.cuh"
#include "tandem/device/wait.cuh"

namespace tandem::device {
namespace impl {

constexpr uint32_t kCheckInterval = 64;

__device__ __forceinline__ bool compare(uint64_t v, Cmp cmp, uint64_t x) {
  switch (cmp) {
    case Cmp::kEq: return v == x;
    case Cmp::kNe: return v != x;
    case Cmp::kGe: return v >= x;
    case Cmp::kGt: return v > x;
    case Cmp::kLe: return v <= x;
    case Cmp::kLt: return v < x;
  }
  return false;
}

}  // namespace impl

__device__ __forceinline__ Status wait_until_timeout(const DeviceComm& comm, const uint64_t* flag, Cmp cmp,
                                                     uint64_t value, uint64_t timeout_ns, uint64_t* observed) {
  uint64_t v = impl::ld_relaxed_sys(flag);
  if (impl::compare(v, cmp, value)) {
    impl::fence_acq_rel_sys();
    if (observed != nullptr) *observed = v;
    return Status::kOk;
  }
  const uint64_t start = impl::globaltimer_ns();
  for (uint32_t spins = 1;; ++spins) {
    v = impl::ld_relaxed_sys(flag);
    if (impl::compare(v, cmp, value)) {
      impl::fence_acq_rel_sys();
      if (observed != nullptr) *observed = v;
      return Status::kOk;
    }
    if (spins % impl::kCheckInterval == 0) {
      if (observed != nullptr) *observed = v;
      if (impl::aborted(comm)) return Status::kAborted;
      if (timeout_ns != 0 && impl::globaltimer_ns() - start > timeout_ns) return Status::kTimeout;
    }
  }
}

__device__ __forceinline__ Status wait_until(const DeviceComm& comm, const uint64_t* flag, Cmp cmp,
                                             uint64_t value, int peer) {
  uint64_t observed = 0;
  const Status s = wait_until_timeout(comm, flag, cmp, value, comm.timeout_ns, &observed);
  if (s == Status::kTimeout) {
    impl::report_error(comm, s, DeviceOp::kWaitUntil, peer, value, observed, comm.timeout_ns);
  }
  return s;
}

}  // namespace tandem::device
