// tandem device API — signal (contract).
//
// signal(comm, sig, value, op, peer): one thread changes the 64-bit flag at symmetric address `sig` on `peer`
// (kSet: store, for flags with a single writer; kAdd: atomic add, any number of writers). Release semantics at
// system scope: every write this thread has performed or observed before the call (including other threads'
// writes ordered before it by __syncthreads/__syncwarp) is visible to a peer that acquires the new value.
// With Order::kRelaxed the change is a notification only: no earlier write is ordered before it (types.cuh).
// Flags must be 8-byte aligned; keep unrelated flags on different 128-byte lines to avoid false sharing.
#pragma once

#include <cstdint>

#include "tandem/device/types.cuh"

namespace tandem::device {

__device__ Status signal(const DeviceComm& comm, uint64_t* sig, uint64_t value, SignalOp op, int peer,
                         Order order = Order::kOrdered);

}  // namespace tandem::device

#include "tandem/device/impl/signal_impl.cuh"
