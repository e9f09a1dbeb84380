// tandem device API — barrier (contract).
//
// barrier_block(comm[, team]): called by every thread of exactly one block on each member rank. Returns when
// every member has entered the same barrier. Ordering: all writes of this block before the call (to any
// rank) are visible to every member's block after it returns (release on entry, acquire on exit, system
// scope). Writes of *other* blocks of the grid are covered only if the kernel orders them before the call
// (e.g. a grid-wide sync). Consecutive barriers need no reset: each pair of ranks counts the barriers it
// completed together (monotonic counters), so a late peer can never satisfy an old or a future barrier.
// Bounded by the communicator timeout; a timeout is recorded naming the first missing peer.
#pragma once

#include <cstdint>

#include "tandem/device/types.cuh"

namespace tandem::device {

// Ranks {start, start + stride, ..., start + (size - 1) * stride}. Members must agree on the order in which
// they run barriers over teams that share a pair of ranks.
struct Team {
  int32_t start = 0;
  int32_t stride = 1;
  int32_t size = 0;
  __host__ __device__ int32_t member(int32_t i) const { return start + i * stride; }
};

__device__ __forceinline__ Team world_team(const DeviceComm& comm) { return Team{0, 1, comm.world}; }

__device__ Status barrier_block(const DeviceComm& comm, const Team& team);
__device__ Status barrier_block(const DeviceComm& comm);

}  // namespace tandem::device

#include "tandem/device/impl/barrier_impl.cuh"
