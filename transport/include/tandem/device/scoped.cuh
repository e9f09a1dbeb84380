// tandem device API — scoped word accesses (contract).
//
// One 64-bit load, one 64-bit store or one fence at an explicit memory-model scope, on an address the caller
// already holds: a word of its own memory, or a peer's word mapped here (peer_ptr, SignalTarget::remote). They are
// the instructions signal / wait_until / the local_* words compile to, public for code that measures those
// primitives one instruction at a time (the transport probe: kernels/src/transport_probe.cu) and for a kernel that
// resolves a peer's flag once and keeps it. Nothing here checks a bound, picks a path or talks to the proxy (a peer
// without a load/store path has no address to pass), records an error or waits: prefer signal / wait_until, which
// do all of that, and local.cuh for words that never leave this GPU.
//
// Scope. .gpu covers every thread of this GPU, other MPS processes of the same GPU included; .sys covers every
// observer (other GPUs, the host, the proxy, the copy engines). A synchronizing access (release, acquire, fence)
// orders only towards observers inside its scope: towards a peer on another GPU use .sys, towards one on this GPU
// .gpu suffices and costs less (peer_on_same_device says which). Relaxed accesses order nothing but are strong:
// the value is never torn, and a relaxed load eventually sees a store of its scope.
//
// ld_acquire_gpu(p) / ld_acquire_sys(p)      ld.acquire: later accesses of this thread stay after it, and what a
//                                            releaser of the value wrote before it is visible (pairs with
//                                            st_release_* or a fence + relaxed store of the same scope)
// ld_relaxed_gpu(p) / ld_relaxed_sys(p)      ld.relaxed: the value, no ordering
// st_release_gpu(p, v) / st_release_sys(p, v)  st.release: this thread's earlier writes (and what it acquired)
//                                            before v, for an observer that loads v by acquire
// st_relaxed_gpu(p, v) / st_relaxed_sys(p, v)  st.relaxed: the value, no ordering
// fence_acq_rel_gpu() / fence_acq_rel_sys()  fence.acq_rel: this thread's earlier accesses before its later ones
//                                            (a relaxed store after it acts as a release, a relaxed load before it
//                                            as an acquire)
// peer_on_same_device(comm, peer)            whether `peer` runs on this GPU (another MPS process of it): .gpu
//                                            scope then covers it. False for a peer out of [0, world) or on
//                                            another GPU or node.
#pragma once

#include <cstdint>

#include "tandem/device/impl/addressing.cuh"
#include "tandem/device/impl/ptx.cuh"
#include "tandem/device/types.cuh"

namespace tandem::device {

__device__ __forceinline__ uint64_t ld_acquire_gpu(const uint64_t* p) { return impl::ld_acquire_gpu(p); }
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) { return impl::ld_acquire_sys(p); }
__device__ __forceinline__ uint64_t ld_relaxed_gpu(const uint64_t* p) { return impl::ld_relaxed_gpu(p); }
__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t* p) { return impl::ld_relaxed_sys(p); }
__device__ __forceinline__ void st_release_gpu(uint64_t* p, uint64_t v) { impl::st_release_gpu(p, v); }
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) { impl::st_release_sys(p, v); }
__device__ __forceinline__ void st_relaxed_gpu(uint64_t* p, uint64_t v) { impl::st_relaxed_gpu(p, v); }
__device__ __forceinline__ void st_relaxed_sys(uint64_t* p, uint64_t v) { impl::st_relaxed_sys(p, v); }
__device__ __forceinline__ void fence_acq_rel_gpu() { impl::fence_acq_rel_gpu(); }
__device__ __forceinline__ void fence_acq_rel_sys() { impl::fence_acq_rel_sys(); }

__device__ __forceinline__ bool peer_on_same_device(const DeviceComm& comm, int peer) {
  return peer >= 0 && peer < comm.world && impl::peer_on_same_device(comm, peer);
}

}  // namespace tandem::device
