// tandem device API — wait_until (implementation).
//
// Spins with acquire loads at system scope: an acquire needs no memory barrier (only the signaller's release
// does), so the flag round trip stays at the load latency. The abort flag (host-mapped, so a PCIe read) and
// the clock are checked every kCheckInterval spins only; the clock starts at the first check, so a timeout
// is measured from a few microseconds after the wait began.
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
  uint64_t start = 0;
  for (uint32_t spins = 1;; ++spins) {
    const uint64_t v = impl::ld_acquire_sys(flag);
    if (impl::compare(v, cmp, value)) {
      if (observed != nullptr) *observed = v;
      return Status::kOk;
    }
    if (spins % impl::kCheckInterval == 0) {
      if (observed != nullptr) *observed = v;
      if (impl::aborted(comm)) return Status::kAborted;
      const uint64_t now = impl::globaltimer_ns();
      if (start == 0) start = now;
      if (timeout_ns != 0 && now - start > timeout_ns) return Status::kTimeout;
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
