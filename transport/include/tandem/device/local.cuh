// tandem device API — this rank's own words (contract).
//
// A persistent kernel keeps control words in its own memory for its own blocks: the launch epoch, finish and
// last-block counters, "ready" flags one block publishes to the others. Those never cross to another rank, so
// they need neither a peer nor the system scope; flags that other ranks write or read go through signal() /
// wait_until() instead. Every function here acts on this GPU's memory only and orders nothing across ranks.
//
// local_load(p)           relaxed load at gpu scope: a value another block of this GPU stored, no ordering.
// local_store(p, v)       relaxed store at gpu scope: visible to other blocks of this GPU, no ordering.
// local_publish(p, v)     release store at gpu scope: every write this thread made (or observed through an
//                         acquire) before it is visible to a block that reads v with an acquire load.
// local_acquire(p)        acquire load at gpu scope: pairs with local_publish (what the publisher wrote before it
//                         is visible to this thread once it reads the published value).
// fence_system()          fence.acq_rel.sys: this thread's earlier accesses before its later ones, for every
//                         observer, the host and peers included (fence(comm) without a communicator).
// now_ns()                the GPU's global timer in ns: monotonic on one GPU, not comparable across GPUs.
// report(comm, status, op, peer, expected, observed)
//                         the communicator's first error record (the host's check() raises it, naming rank,
//                         op and peer) and the abort flag raised: for failures the kernel itself detects (an
//                         argument it cannot honour, a capacity overrun). Later records are dropped.
// has_proxy(comm)         whether the communicator has the proxy path (peers on other nodes); host and device.
// has_proxy(comm, peer)   whether `peer` is reached through that path: another node (no load/store path) and
//                         a proxy; false for a peer out of [0, world). Device only (reads the peer table).
#pragma once

#include "tandem/device/impl/addressing.cuh"
#include "tandem/device/impl/errors.cuh"
#include "tandem/device/impl/ptx.cuh"
#include "tandem/device/types.cuh"

namespace tandem::device {

__device__ __forceinline__ uint64_t local_load(const uint64_t* p) { return impl::ld_relaxed_gpu(p); }
__device__ __forceinline__ void local_store(uint64_t* p, uint64_t v) { impl::st_relaxed_gpu(p, v); }
__device__ __forceinline__ void local_publish(uint64_t* p, uint64_t v) { impl::st_release_gpu(p, v); }
__device__ __forceinline__ uint64_t local_acquire(const uint64_t* p) { return impl::ld_acquire_gpu(p); }
__device__ __forceinline__ void fence_system() { impl::fence_acq_rel_sys(); }
__device__ __forceinline__ uint64_t now_ns() { return impl::globaltimer_ns(); }

__device__ __forceinline__ void report(const DeviceComm& comm, Status status, DeviceOp op, int peer,
                                       uint64_t expected, uint64_t observed) {
  impl::report_error(comm, status, op, peer, expected, observed, 0);
}

__host__ __device__ __forceinline__ bool has_proxy(const DeviceComm& comm) { return comm.proxy_slots != nullptr; }
__device__ __forceinline__ bool has_proxy(const DeviceComm& comm, int peer) { return impl::is_proxy_peer(comm, peer); }

}  // namespace tandem::device
