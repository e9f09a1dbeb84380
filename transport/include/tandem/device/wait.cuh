// tandem device API — wait_until (contract).
//
// Waits on a flag in this rank's own memory (usually its symmetric heap) until `*flag <cmp> value` holds.
// Acquire semantics at system scope on success: everything the signalling peer released is visible after
// the call, to the calling thread (use __syncthreads afterwards to extend it to the block).
//
// Every wait is bounded and abortable:
//  * wait_until_timeout(...) returns kOk, kTimeout (after timeout_ns; 0 = no time bound) or kAborted (the
//    communicator's abort flag was raised by the host or by another failed wait). It records nothing.
//  * wait_until(...) is bounded by the communicator's default timeout. On timeout it records the error
//    (rank, op kWaitUntil, `peer`, expected and last observed value) for the host, raises the abort flag so
//    that every other wait of this rank stops too, and returns kTimeout. `peer` names the rank expected to
//    signal (-1 if unknown); it is only used in the error report.
#pragma once

#include <cstdint>

#include "tandem/device/types.cuh"

namespace tandem::device {

__device__ Status wait_until_timeout(const DeviceComm& comm, const uint64_t* flag, Cmp cmp, uint64_t value,
                                     uint64_t timeout_ns, uint64_t* observed = nullptr);

__device__ Status wait_until(const DeviceComm& comm, const uint64_t* flag, Cmp cmp, uint64_t value,
                             int peer = -1);

}  // namespace tandem::device

#include "tandem/device/impl/wait_impl.cuh"
