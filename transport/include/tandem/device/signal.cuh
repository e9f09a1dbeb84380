// tandem device API — signal (contract).
//
// signal(comm, sig, value, op, peer): one thread changes the 64-bit flag at symmetric address `sig` on `peer`
// (kSet: store, for flags with a single writer; kAdd: atomic add, any number of writers). Release semantics at
// system scope: every write this thread has performed or observed before the call (including other threads'
// writes ordered before it by __syncthreads/__syncwarp) is visible to a peer that acquires the new value.
// With Order::kRelaxed the change is a notification only: no earlier write is ordered before it (types.cuh).
// Flags must be 8-byte aligned; keep unrelated flags on different 128-byte lines to avoid false sharing.
//
// signal_target(comm, sig, peer) resolves and checks the flag's address on `peer` once (bounds, path: load/
// store or proxy, scope); signal(comm, target, ...) then costs the store alone. Use it where one thread signals
// the same flag in a loop: each call of the address-taking form re-derives all of that, which measured
// 0.18 us per call on one H200 (tools/diag/flag_latency.cu) -- a third of a relaxed flag round trip. A target
// that failed to resolve carries the error (already recorded) and every signal through it returns that status.
#pragma once

#include <cstdint>

#include "tandem/device/types.cuh"

namespace tandem::device {

__device__ Status signal(const DeviceComm& comm, uint64_t* sig, uint64_t value, SignalOp op, int peer,
                         Order order = Order::kOrdered);

// A flag on one peer, resolved (see above). Plain data: copy it freely, keep it in registers.
struct SignalTarget {
  uint64_t* remote = nullptr;  // the flag in the peer's heap, mapped here; null: proxy path or error
  uint64_t* sym = nullptr;     // the symmetric address (what the proxy path sends)
  int32_t peer = -1;
  Status status = Status::kOk;  // kOk, or why the target cannot be signalled
  bool same_device = false;     // the peer runs on this GPU: .gpu scope suffices
};

__device__ SignalTarget signal_target(const DeviceComm& comm, uint64_t* sig, int peer);

__device__ Status signal(const DeviceComm& comm, const SignalTarget& target, uint64_t value, SignalOp op,
                         Order order = Order::kOrdered);

}  // namespace tandem::device

#include "tandem/device/impl/signal_impl.cuh"
