// tandem device API — error reporting and abort (implementation detail).
#pragma once

#include "tandem/device/impl/ptx.cuh"
#include "tandem/device/types.cuh"

namespace tandem::device::impl {

__device__ __forceinline__ bool aborted(const DeviceComm& comm) {
  return comm.abort_flag != nullptr && *comm.abort_flag != 0;
}

// Raise the communicator's abort flag so that every other spin loop on this rank stops too.
__device__ __forceinline__ void raise_abort(const DeviceComm& comm) {
  if (comm.abort_flag != nullptr) {
    *comm.abort_flag = 1;
    __threadfence_system();
  }
}

// Record the first error of this communicator. The claim word lives in device memory (device-scope CAS is
// always available); the record itself is host-mapped so the host can read it while kernels still run.
__device__ __forceinline__ void report_error(const DeviceComm& comm, Status status, DeviceOp op, int peer,
                                             uint64_t expected, uint64_t observed, uint64_t elapsed_ns) {
  if (comm.error != nullptr && comm.heap_base != nullptr) {
    auto* claim = reinterpret_cast<unsigned int*>(comm.heap_base +
                                                  tandem::ReservedLayout::error_claim_offset(comm.world));
    if (atomicCAS(claim, 0u, 1u) == 0u) {
      ErrorRecord* rec = comm.error;
      rec->rank = comm.rank;
      rec->op = static_cast<int32_t>(op);
      rec->peer = peer;
      rec->expected = expected;
      rec->observed = observed;
      rec->elapsed_ns = elapsed_ns;
      rec->block = static_cast<int32_t>(blockIdx.x);
      rec->thread = static_cast<int32_t>(threadIdx.x);
      __threadfence_system();
      rec->status = static_cast<int32_t>(status);
      __threadfence_system();
    }
  }
  raise_abort(comm);
}

}  // namespace tandem::device::impl
