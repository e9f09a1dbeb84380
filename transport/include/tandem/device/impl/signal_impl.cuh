// tandem device API — signal (implementation).
#pragma once

#include "tandem/device/impl/addressing.cuh"
#include "tandem/device/impl/proxy_impl.cuh"
#include "tandem/device/impl/ptx.cuh"
#include "tandem/device/signal.cuh"

namespace tandem::device {

// One read of the peer's heap entry gives the path, the base and the scope (the separate helpers would read it
// three times, and each read is a dependent constant-bank load before the store can issue).
__device__ __forceinline__ SignalTarget signal_target(const DeviceComm& comm, uint64_t* sig, int peer) {
  SignalTarget t;
  t.sym = sig;
  t.peer = peer;
  const char* p = reinterpret_cast<const char*>(sig);
#ifndef TANDEM_DEVICE_UNCHECKED
  if (peer < 0 || peer >= comm.world || !impl::sym_in_heap(comm, p, sizeof(uint64_t))) {
    impl::report_error(comm, Status::kInvalidArgument, DeviceOp::kSignal, peer, sizeof(uint64_t),
                       static_cast<uint64_t>(reinterpret_cast<uintptr_t>(sig)), 0);
    t.status = Status::kInvalidArgument;
    return t;
  }
#endif
  const uint64_t entry = impl::peer_heap_entry(comm, peer);
  const uint64_t base = entry & ~tandem::kPeerSameDeviceBit;
  if (base == 0) {
    if (comm.proxy_slots == nullptr) {
      impl::report_error(comm, Status::kUnreachablePeer, DeviceOp::kSignal, peer, 0, 0, 0);
      t.status = Status::kUnreachablePeer;
    }
    return t;  // remote == nullptr and status kOk: the proxy path
  }
  t.remote = reinterpret_cast<uint64_t*>(base + static_cast<uint64_t>(p - comm.heap_base));
  t.same_device = (entry & tandem::kPeerSameDeviceBit) != 0;
  return t;
}

__device__ __forceinline__ Status signal(const DeviceComm& comm, const SignalTarget& t, uint64_t value,
                                         SignalOp op, Order order) {
  if (t.remote == nullptr) {
    if (t.status != Status::kOk) return t.status;
    return impl::proxy_enqueue(comm, proxy::CommandOp::kSignal, t.peer, nullptr, nullptr, 0, t.sym, value,
                               static_cast<uint32_t>(op));
  }
  if (order == Order::kRelaxed) {
    if (op == SignalOp::kSet) impl::relaxed_store(t.remote, value, t.same_device);
    else impl::relaxed_add(t.remote, value, t.same_device);
  } else if (op == SignalOp::kSet) {
    impl::release_store(t.remote, value, t.same_device);
  } else {
    impl::release_add(t.remote, value, t.same_device);
  }
  return Status::kOk;
}

__device__ __forceinline__ Status signal(const DeviceComm& comm, uint64_t* sig, uint64_t value, SignalOp op,
                                         int peer, Order order) {
  return signal(comm, signal_target(comm, sig, peer), value, op, order);
}

}  // namespace tandem::device
