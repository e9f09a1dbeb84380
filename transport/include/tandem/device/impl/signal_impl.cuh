// tandem device API — signal (implementation).
#pragma once

#include "tandem/device/impl/addressing.cuh"
#include "tandem/device/impl/proxy_impl.cuh"
#include "tandem/device/impl/ptx.cuh"
#include "tandem/device/signal.cuh"

namespace tandem::device {

__device__ __forceinline__ Status signal(const DeviceComm& comm, uint64_t* sig, uint64_t value, SignalOp op,
                                         int peer, Order order) {
  if (impl::is_proxy_peer(comm, peer))
    return impl::proxy_enqueue(comm, proxy::CommandOp::kSignal, peer, nullptr, nullptr, 0, sig, value,
                               static_cast<uint32_t>(op));
  Status status = Status::kOk;
  auto* remote = reinterpret_cast<uint64_t*>(
      impl::checked_peer_ptr(comm, sig, sizeof(uint64_t), peer, DeviceOp::kSignal, &status));
  if (remote == nullptr) return status;
  const bool same_device = impl::peer_on_same_device(comm, peer);
  if (order == Order::kRelaxed) {
    if (op == SignalOp::kSet) impl::relaxed_store(remote, value, same_device);
    else impl::relaxed_add(remote, value, same_device);
    return Status::kOk;
  }
  if (op == SignalOp::kSet) {
    impl::release_store(remote, value, same_device);
  } else {
    impl::release_add(remote, value, same_device);
  }
  return Status::kOk;
}

}  // namespace tandem::device
