// The few CUDA driver entry points tandem uses, resolved at run time through the runtime's
// cudaGetDriverEntryPointByVersion: no link-time dependency on libcuda (build machines often lack it).
#pragma once

#include <cuda.h>

namespace tandem::detail {

struct DriverApi {
  decltype(&::cuMemCreate) cuMemCreate = nullptr;
  decltype(&::cuMemRelease) cuMemRelease = nullptr;
  decltype(&::cuMemMap) cuMemMap = nullptr;
  decltype(&::cuMemUnmap) cuMemUnmap = nullptr;
  decltype(&::cuMemSetAccess) cuMemSetAccess = nullptr;
  decltype(&::cuMemAddressReserve) cuMemAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) cuMemAddressFree = nullptr;
  decltype(&::cuMemGetAllocationGranularity) cuMemGetAllocationGranularity = nullptr;
  decltype(&::cuMemExportToShareableHandle) cuMemExportToShareableHandle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) cuMemImportFromShareableHandle = nullptr;
  decltype(&::cuDeviceGetAttribute) cuDeviceGetAttribute = nullptr;
  // Optional (not part of `complete`): a dmabuf fd of a device range, for RDMA registration.
  decltype(&::cuMemGetHandleForAddressRange) cuMemGetHandleForAddressRange = nullptr;
  // Optional: whether a thread has a current context at all (ScopedDevice, comm.cc).
  decltype(&::cuCtxGetCurrent) cuCtxGetCurrent = nullptr;
  decltype(&::cuCtxSetCurrent) cuCtxSetCurrent = nullptr;
  bool complete = false;
};

// Resolved once per process; `complete` is false if any entry point is missing.
const DriverApi& driver_api();

}  // namespace tandem::detail
