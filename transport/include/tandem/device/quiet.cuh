// tandem device API — fence and quiet (contract).
//
// fence(comm): orders this thread's earlier puts/signals before its later ones, per peer, as seen by any
//   observer (fence.acq_rel.sys). Cheap; does not wait for delivery.
// quiet(comm): returns once every put/signal this thread issued earlier is complete and visible at its
//   destination (fence.sc.sys over load/store paths, completion of the bulk-copy groups this thread committed,
//   and, for peers on other nodes, every command this rank handed to the proxy acknowledged by the
//   destination). Use before reusing a source buffer that a bulk or proxied put may still read, or before
//   telling a third party about the data by a means other than a signal. Returns kOk, or kTimeout/kAborted
//   (recorded) if the proxy does not complete within the communicator timeout.
#pragma once

#include "tandem/device/types.cuh"

namespace tandem::device {

__device__ void fence(const DeviceComm& comm);
__device__ Status quiet(const DeviceComm& comm);

}  // namespace tandem::device

#include "tandem/device/impl/quiet_impl.cuh"
