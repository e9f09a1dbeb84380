// tandem kernels — transport probes: small kernels that drive each device primitive on its own. They back the
// transport tests and the transport benchmark, and are the simplest examples of kernels built on the device API.
// Host API only (plain C++); the kernels live in kernels/src/transport_probe.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tandem/transport/device_comm.h"

namespace tandem::kernels::probe {

enum class PutMode : int32_t { kThread = 0, kWarp = 1, kBlock = 2, kBulk = 3 };

// Copy [src, src + bytes) to symmetric `dst` on `peer`. kThread/kWarp use one thread/warp; kBlock/kBulk split
// the range over `blocks` blocks of `threads`. With `sig` set, each block then adds 1 to `sig` on the peer
// (put_signal), so the peer waits for `blocks` per launch. The first failing device status goes to
// *status_out (device int32, may be null).
Status put(const DeviceComm& comm, PutMode mode, void* dst, const void* src, size_t bytes, int peer, int blocks,
           int threads, uint64_t* sig, int32_t* status_out, cudaStream_t stream);

// Blocks `put` with the given mode would use for `bytes` when the caller asks for `blocks` (<= 0: sm_count).
int put_blocks(PutMode mode, size_t bytes, int blocks, int sm_count);

// Flag ping-pong with `peer` over the symmetric flag `flag`: the initiator sets the peer's flag to base+i and
// waits for its own to reach base+i; the responder mirrors it. `iters` round trips in one launch.
// variant 0 uses the public API; 3, 7 and 1, 2, 4, 5, 6 are references (see transport_probe.cu); 2 is the
// hardware latency floor with no ordering, for comparison only.
Status pingpong(const DeviceComm& comm, uint64_t* flag, int peer, int iters, uint64_t base, bool initiator,
                int variant, int32_t* status_out, cudaStream_t stream);

// put_signal ordering check: the sender writes pattern(base+i) into `scratch` (local), put_signals it to `buf`
// on the peer with flag = base+i, and waits for the peer's ack before the next round; the receiver waits for
// the flag, checks every 32-bit word of `buf` and acks. Wrong words (and flag values that are not exactly
// base+i) are added to *errors_out (device u64). `bytes` must be a multiple of 4.
Status put_signal_stream(const DeviceComm& comm, void* buf, void* scratch, size_t bytes, uint64_t* flag,
                         uint64_t* ack, int peer, int iters, uint64_t base, bool sender, int threads,
                         unsigned long long* errors_out, int32_t* status_out, cudaStream_t stream);

// `iters` rounds of: write epoch base+i into slot[rank] of every team member, barrier over the team, check that
// slot[p] == base+i for every member p (stale or early epochs are counted in *errors_out), barrier.
// *progress_out = last completed round. The team is {start + i * stride : i < size}; size <= 0 = the world.
Status barrier_loop(const DeviceComm& comm, uint64_t* slots, int iters, uint64_t base, int team_start,
                    int team_stride, int team_size, unsigned long long* errors_out, int32_t* status_out,
                    long long* progress_out, cudaStream_t stream);

// One bounded wait by one thread: the communicator-timeout form (bounded_form) or wait_until_timeout.
Status wait(const DeviceComm& comm, const uint64_t* flag, int cmp, uint64_t value, int peer, uint64_t timeout_ns,
            bool bounded_form, int32_t* status_out, uint64_t* observed_out, cudaStream_t stream);

// quiet() by one thread: every command handed to the proxy so far is complete at its destination.
Status quiet(const DeviceComm& comm, int32_t* status_out, cudaStream_t stream);

// One signal by one thread.
Status signal(const DeviceComm& comm, uint64_t* flag, uint64_t value, int op, int peer, int32_t* status_out,
              cudaStream_t stream);

}  // namespace tandem::kernels::probe
