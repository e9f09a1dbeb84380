// tandem device API — symmetric address translation with bounds checks (implementation detail).
//
// The checks are a few integer compares against values already in registers; they turn a wrong offset or
// rank into a recorded kInvalidArgument instead of a write into someone else's memory. Define
// TANDEM_DEVICE_UNCHECKED to compile them out.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/device/impl/errors.cuh"
#include "tandem/device/impl/ptx.cuh"

namespace tandem::device::impl {

// `peer` must be in [0, world). The first ranks come from the kernel argument (constant cache), the rest from
// the device array.
__device__ __forceinline__ uint64_t peer_heap_entry(const DeviceComm& comm, int peer) {
  if (peer < tandem::kInlinePeerHeaps) return comm.peer_heap_inline[peer];
  return __ldg(reinterpret_cast<const unsigned long long*>(comm.peer_heap) + peer);
}

__device__ __forceinline__ uint64_t peer_heap_base(const DeviceComm& comm, int peer) {
  return peer_heap_entry(comm, peer) & ~tandem::kPeerSameDeviceBit;
}

// True if `peer` runs on this GPU: a release at .gpu scope then orders everything the peer can observe, which
// is cheaper than .sys (no wait for system-wide visibility).
__device__ __forceinline__ bool peer_on_same_device(const DeviceComm& comm, int peer) {
  return (peer_heap_entry(comm, peer) & tandem::kPeerSameDeviceBit) != 0;
}

// True if `peer` is reached through the CPU proxy (another node, and this communicator has a proxy).
__device__ __forceinline__ bool is_proxy_peer(const DeviceComm& comm, int peer) {
  return peer >= 0 && peer < comm.world && comm.proxy_slots != nullptr && peer_heap_base(comm, peer) == 0;
}

// Release store / add to a peer's flag at the narrowest scope that still includes the peer.
__device__ __forceinline__ void release_store(uint64_t* remote, uint64_t v, bool same_device) {
  if (same_device) st_release_gpu(remote, v);
  else st_release_sys(remote, v);
}

__device__ __forceinline__ void release_add(uint64_t* remote, uint64_t v, bool same_device) {
  if (same_device) red_release_gpu_add(remote, v);
  else red_release_sys_add(remote, v);
}

// Relaxed store / add: no ordering of earlier writes (Order::kRelaxed), still a strong access at the scope
// that includes the peer, so the value itself is never torn or stuck in a private cache.
__device__ __forceinline__ void relaxed_store(uint64_t* remote, uint64_t v, bool same_device) {
  if (same_device) st_relaxed_gpu(remote, v);
  else st_relaxed_sys(remote, v);
}

__device__ __forceinline__ void relaxed_add(uint64_t* remote, uint64_t v, bool same_device) {
  if (same_device) red_relaxed_gpu_add(remote, v);
  else red_relaxed_sys_add(remote, v);
}

// True if [p, p + bytes) lies in this rank's heap (so at the same offset in every peer's).
__device__ __forceinline__ bool sym_in_heap(const DeviceComm& comm, const char* p, size_t bytes) {
  return p >= comm.heap_base && bytes <= comm.heap_bytes &&
         static_cast<uint64_t>(p - comm.heap_base) <= comm.heap_bytes - bytes;
}

// Translate [sym, sym + bytes) to `peer`; on failure record the error (op), store its code in *status and
// return nullptr.
__device__ __forceinline__ char* checked_peer_ptr(const DeviceComm& comm, const void* sym, size_t bytes,
                                                  int peer, DeviceOp op, Status* status) {
  const char* p = static_cast<const char*>(sym);
#ifndef TANDEM_DEVICE_UNCHECKED
  if (peer < 0 || peer >= comm.world || !sym_in_heap(comm, p, bytes)) {
    report_error(comm, Status::kInvalidArgument, op, peer, static_cast<uint64_t>(bytes),
                 static_cast<uint64_t>(reinterpret_cast<uintptr_t>(sym)), 0);
    *status = Status::kInvalidArgument;
    return nullptr;
  }
#endif
  const uint64_t base = peer_heap_base(comm, peer);
  if (base == 0) {
    report_error(comm, Status::kUnreachablePeer, op, peer, 0, 0, 0);
    *status = Status::kUnreachablePeer;
    return nullptr;
  }
  return reinterpret_cast<char*>(base) + (p - comm.heap_base);
}

}  // namespace tandem::device::impl
