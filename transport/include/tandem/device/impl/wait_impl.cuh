// tandem device API — wait_until (implementation).
//
// Spins on acquire loads: one load per iteration and no fence, so the wait ends one load latency after the
// signal lands. A relaxed spin closed by an acquire re-read or a fence spares the SM's L1 the invalidation of
// each acquire, but measured slower on the H200 (1.43 us vs 1.18 us per flag round trip); fused kernels stream
// operands through TMA into shared memory, which the invalidation does not touch. Scope: .gpu when the named
// peer runs on this GPU and is reached directly (not through the proxy), else .sys. The abort flag
// (host-mapped, so a PCIe read) and the clock are checked every kCheckInterval spins only; the clock starts at
// the first check, so a timeout is measured from a few microseconds after the wait began.
#pragma once

#include "tandem/device/impl/addressing.cuh"
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

// .gpu scope suffices only if the flag's writer is a thread of this GPU: a same-device peer reached directly.
// (The same-device bit is set only on entries with a load/store path, so a proxy peer never has it.)
__device__ __forceinline__ bool wait_at_gpu_scope(const DeviceComm& comm, int peer) {
  return peer >= 0 && peer < comm.world && peer != comm.rank && peer_on_same_device(comm, peer);
}

template <bool kGpuScope, bool kAcquire>
__device__ __forceinline__ Status wait_spin(const DeviceComm& comm, const uint64_t* flag, Cmp cmp, uint64_t value,
                                            uint64_t timeout_ns, uint64_t* observed, uint32_t sleep_ns = 0) {
  uint64_t start = 0;
  for (uint32_t spins = 1;; ++spins) {
    const uint64_t v = kAcquire ? (kGpuScope ? ld_acquire_gpu(flag) : ld_acquire_sys(flag))
                                : (kGpuScope ? ld_relaxed_gpu(flag) : ld_relaxed_sys(flag));
    if (compare(v, cmp, value)) {
      if (observed != nullptr) *observed = v;
      return Status::kOk;
    }
    if (spins % kCheckInterval == 0) {
      if (observed != nullptr) *observed = v;
      if (aborted(comm)) return Status::kAborted;
      const uint64_t now = globaltimer_ns();
      if (start == 0) start = now;
      if (timeout_ns != 0 && now - start > timeout_ns) return Status::kTimeout;
    }
    if (sleep_ns != 0) __nanosleep(sleep_ns);
  }
}

}  // namespace impl

namespace impl {

__device__ __forceinline__ Status wait_dispatch(const DeviceComm& comm, const uint64_t* flag, Cmp cmp,
                                                uint64_t value, uint64_t timeout_ns, uint64_t* observed, int peer,
                                                Order order, uint32_t sleep_ns) {
  const bool gpu = wait_at_gpu_scope(comm, peer);
  if (order == Order::kRelaxed) {
    return gpu ? wait_spin<true, false>(comm, flag, cmp, value, timeout_ns, observed, sleep_ns)
               : wait_spin<false, false>(comm, flag, cmp, value, timeout_ns, observed, sleep_ns);
  }
  return gpu ? wait_spin<true, true>(comm, flag, cmp, value, timeout_ns, observed, sleep_ns)
             : wait_spin<false, true>(comm, flag, cmp, value, timeout_ns, observed, sleep_ns);
}

}  // namespace impl

__device__ __forceinline__ Status wait_until_timeout(const DeviceComm& comm, const uint64_t* flag, Cmp cmp,
                                                     uint64_t value, uint64_t timeout_ns, uint64_t* observed,
                                                     int peer, Order order) {
  return impl::wait_dispatch(comm, flag, cmp, value, timeout_ns, observed, peer, order, 0);
}

__device__ __forceinline__ Status wait_until_backoff(const DeviceComm& comm, const uint64_t* flag, Cmp cmp,
                                                     uint64_t value, uint32_t sleep_ns, int peer, Order order) {
  uint64_t observed = 0;
  const Status s = impl::wait_dispatch(comm, flag, cmp, value, comm.timeout_ns, &observed, peer, order, sleep_ns);
  if (s == Status::kTimeout) {
    impl::report_error(comm, s, DeviceOp::kWaitUntil, peer, value, observed, comm.timeout_ns);
  }
  return s;
}

__device__ __forceinline__ Status wait_until(const DeviceComm& comm, const uint64_t* flag, Cmp cmp,
                                             uint64_t value, int peer, Order order) {
  return wait_until_backoff(comm, flag, cmp, value, 0, peer, order);
}

__device__ __forceinline__ bool test(const DeviceComm& comm, const uint64_t* flag, Cmp cmp, uint64_t value, int peer,
                                     Order order) {
  // the wait's load, once: the same order and scope choice
  const bool gpu = impl::wait_at_gpu_scope(comm, peer);
  const uint64_t v = order == Order::kRelaxed ? (gpu ? impl::ld_relaxed_gpu(flag) : impl::ld_relaxed_sys(flag))
                                              : (gpu ? impl::ld_acquire_gpu(flag) : impl::ld_acquire_sys(flag));
  return impl::compare(v, cmp, value);
}

}  // namespace tandem::device
