// tandem device API — put family (contract).
//
// Addresses: `dst` and `sig` are *symmetric* addresses, i.e. addresses inside this rank's own symmetric heap;
// the same offset is used in the peer's heap. `src` is any address this thread can read (local heap, local
// global memory) for load/store peers; for a peer on another node the group's first thread hands the put to
// the CPU proxy, which reads `src` by heap offset: there `src` must be in the symmetric heap too, and must
// not be overwritten before a quiet (or the peer's acknowledgement) says the proxy has read it.
//
// Ordering (docs/memory-model.md has the full contract):
//  * put: weak stores. Nothing is promised about when the peer sees them until a later signal/put_signal
//    (release) or quiet by the same group.
//  * put_signal: the data stores of the whole group happen-before the signal (release, system scope): a peer
//    that observes the signal with wait_until (acquire) observes all data of this put.
//  * Every thread of the group calls with identical arguments; the group synchronizes inside put_signal.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/device/types.cuh"

namespace tandem::device {

// Local address of symmetric address `sym` on `peer`, or nullptr if the peer has no load/store path.
__device__ __forceinline__ void* peer_ptr(const DeviceComm& comm, const void* sym, int peer);
template <class T>
__device__ __forceinline__ T* peer_ptr(const DeviceComm& comm, T* sym, int peer) {
  return static_cast<T*>(peer_ptr(comm, static_cast<const void*>(sym), peer));
}

// True if `peer` can be reached by loads and stores (same GPU under MPS, or NVLink/PCIe peer mapping).
__device__ __forceinline__ bool is_load_store_peer(const DeviceComm& comm, int peer);

// Copy `bytes` from `src` to `dst` (symmetric) on `peer` with group G. Returns kOk or kUnreachablePeer.
template <Group G>
__device__ Status put(const DeviceComm& comm, void* dst, const void* src, size_t bytes, int peer);

// put, then signal: after the group's data stores, `*sig` on `peer` is set to / increased by `value`
// (release, system scope). One signal per call, issued by the group's first thread.
template <Group G>
__device__ Status put_signal(const DeviceComm& comm, void* dst, const void* src, size_t bytes, uint64_t* sig,
                             uint64_t value, SignalOp op, int peer);

// Block-wide put through the Tensor Memory Accelerator's bulk copy engine (cp.async.bulk, sm_90+): the data is
// staged global -> shared -> peer by thread 0 alone, so one warp per SM keeps hundreds of KB in flight and the
// other warps stay free for compute. Requirements: dst, src and bytes multiples of 16; `stage` a 16-byte
// aligned shared buffer of `stage_bytes` (a multiple of 16 * kBulkStages), `bar` kBulkStages shared 8-byte
// mbarriers. Called by all threads of the block. Completion: the bytes are written when the call returns
// (use put_signal_bulk_block to also publish them).
constexpr int kBulkStages = 4;
__device__ Status put_bulk_block(const DeviceComm& comm, void* dst, const void* src, size_t bytes, int peer,
                                 void* stage, uint32_t stage_bytes, uint64_t* bar);
__device__ Status put_signal_bulk_block(const DeviceComm& comm, void* dst, const void* src, size_t bytes,
                                        uint64_t* sig, uint64_t value, SignalOp op, int peer, void* stage,
                                        uint32_t stage_bytes, uint64_t* bar);

}  // namespace tandem::device

#include "tandem/device/impl/put_impl.cuh"
