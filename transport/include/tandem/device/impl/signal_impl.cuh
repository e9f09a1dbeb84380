// tandem device API — signal (implementation).
#pragma once

#include "tandem/device/impl/addressing.cuh"
#include "tandem/device/impl/ptx.cuh"
#include "tandem/device/signal.cuh"

namespace tandem::device {

__device__ __forceinline__ Status signal(const DeviceComm& comm, uint64_t* sig, uint64_t value, SignalOp op,
                                         int peer) {
  Status status = Status::kOk;
  auto* remote = reinterpret_cast<uint64_t*>(
      impl::checked_peer_ptr(comm, sig, sizeof(uint64_t), peer, DeviceOp::kSignal, &status));
  if (remote == nullptr) return status;
  if (op == SignalOp::kSet) {
    impl::st_release_sys(remote, value);
  } else {
    impl::red_release_sys_add(remote, value);
  }
  return Status::kOk;
}

}  // namespace tandem::device
