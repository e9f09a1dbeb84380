// tandem device API — wait_until (contract).
//
// Waits on a flag in this rank's own memory (usually its symmetric heap) until `*flag <cmp> value` holds.
// Acquire semantics on success: everything the signalling peer released is visible after the call, to the
// calling thread (use __syncthreads afterwards to extend it to the block).
//
// With Order::kRelaxed the wait observes the flag only: nothing else the signaller wrote is guaranteed
// visible (pair it with relaxed signals used as pure notifications; types.cuh).
//
// `peer` names the rank whose signal is awaited — the flag's only writer — or is -1 if that is unknown or
// the flag has several writers. It picks the scope: a peer on this GPU reached directly (several ranks per
// GPU under MPS) is synchronized at .gpu scope, anything else (another GPU, the CPU proxy, -1) at .sys.
// Naming a peer that is not the writer can miss the writer's data.
//
// Every wait is bounded and abortable:
//  * wait_until_timeout(...) returns kOk, kTimeout (after timeout_ns; 0 = no time bound) or kAborted (the
//    communicator's abort flag was raised by the host or by another failed wait). It records nothing.
//  * wait_until(...) is bounded by the communicator's default timeout. On timeout it records the error
//    (rank, op kWaitUntil, `peer`, expected and last observed value) for the host, raises the abort flag so
//    that every other wait of this rank stops too, and returns kTimeout.
//
// test(...) is one poll and never waits: true if `*flag <cmp> value` held at that load, with the same ordering on
// success as a wait of that order (acquire by default) and the same scope rule. For a thread that must not hold
// its SM waiting (a GEMM block offered optional work: it takes the work only if its inputs are there).
//
// wait_until_backoff(...) is wait_until with a __nanosleep(sleep_ns) after every poll that failed: for flags
// that many waiters poll at once (every block of a persistent grid waiting for one chunk), where back-to-back
// polls of one L2 line slow down the very writers being waited for. It adds up to sleep_ns to the latency.
#pragma once

#include <cstdint>

#include "tandem/device/types.cuh"

namespace tandem::device {

__device__ Status wait_until_timeout(const DeviceComm& comm, const uint64_t* flag, Cmp cmp, uint64_t value,
                                     uint64_t timeout_ns, uint64_t* observed = nullptr, int peer = -1,
                                     Order order = Order::kOrdered);

__device__ Status wait_until(const DeviceComm& comm, const uint64_t* flag, Cmp cmp, uint64_t value,
                             int peer = -1, Order order = Order::kOrdered);

__device__ Status wait_until_backoff(const DeviceComm& comm, const uint64_t* flag, Cmp cmp, uint64_t value,
                                     uint32_t sleep_ns, int peer = -1, Order order = Order::kOrdered);

__device__ bool test(const DeviceComm& comm, const uint64_t* flag, Cmp cmp, uint64_t value, int peer = -1,
                     Order order = Order::kOrdered);

}  // namespace tandem::device

#include "tandem/device/impl/wait_impl.cuh"
