#include "driver_api.h"

#include <cuda_runtime_api.h>

namespace tandem::detail {

namespace {

template <class Fn>
bool resolve(const char* name, Fn& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || p == nullptr) {
    return false;
  }
  fn = reinterpret_cast<Fn>(p);
  return true;
}

DriverApi load() {
  DriverApi api;
  bool ok = true;
  ok &= resolve("cuMemCreate", api.cuMemCreate);
  ok &= resolve("cuMemRelease", api.cuMemRelease);
  ok &= resolve("cuMemMap", api.cuMemMap);
  ok &= resolve("cuMemUnmap", api.cuMemUnmap);
  ok &= resolve("cuMemSetAccess", api.cuMemSetAccess);
  ok &= resolve("cuMemAddressReserve", api.cuMemAddressReserve);
  ok &= resolve("cuMemAddressFree", api.cuMemAddressFree);
  ok &= resolve("cuMemGetAllocationGranularity", api.cuMemGetAllocationGranularity);
  ok &= resolve("cuMemExportToShareableHandle", api.cuMemExportToShareableHandle);
  ok &= resolve("cuMemImportFromShareableHandle", api.cuMemImportFromShareableHandle);
  ok &= resolve("cuDeviceGetAttribute", api.cuDeviceGetAttribute);
  api.complete = ok;
  (void)resolve("cuMemGetHandleForAddressRange", api.cuMemGetHandleForAddressRange);
  (void)resolve("cuCtxGetCurrent", api.cuCtxGetCurrent);
  (void)resolve("cuCtxSetCurrent", api.cuCtxSetCurrent);
  return api;
}

}  // namespace

const DriverApi& driver_api() {
  static const DriverApi api = load();
  return api;
}

}  // namespace tandem::detail
