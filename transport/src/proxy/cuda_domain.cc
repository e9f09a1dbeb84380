// CudaMemoryDomain: the proxy's access to a GPU-resident symmetric heap (host code, CUDA runtime only).
//
// Add signals are a read-modify-write through two 8-byte copies under this domain's lock. A kernel doing a
// device atomic would be simpler, but it needs a free SM, and a persistent kernel that spins on this very flag
// holds all of them: the add would never run. The copy engines always can. Consequence (docs/memory-model.md):
// remote adds are atomic with respect to each other, not with respect to concurrent adds by local threads.
#include <cuda_runtime_api.h>

#include <cstring>

#include "tandem/transport/proxy.h"

namespace tandem::proxy {

#define TANDEM_DOMAIN_CHECK(expr) TANDEM_CUDA_CHECK(expr, "proxy.cuda_memory", -1)

CudaMemoryDomain::CudaMemoryDomain(void* base, uint64_t bytes, int device)
    : base_(static_cast<char*>(base)), bytes_(bytes), device_(device) {
  TANDEM_DOMAIN_CHECK(cudaSetDevice(device_));
  cudaStream_t s = nullptr;
  TANDEM_DOMAIN_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  TANDEM_DOMAIN_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned_), sizeof(uint64_t), cudaHostAllocDefault));
  TANDEM_DOMAIN_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&bounce_), kBounceBytes, cudaHostAllocDefault));
  // Test hook: copy straight from/to the caller's pageable buffers, as before the bounce buffer, so a GPU test
  // can show the stall that the bounce buffer removes (tests/gpu/test_transport.py, pageable host copy).
  pageable_ = fault_injected("TANDEM_TEST_PROXY_PAGEABLE_COPIES", -1);  // "all"
}

CudaMemoryDomain::~CudaMemoryDomain() {
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  if (bounce_ != nullptr) cudaFreeHost(bounce_);
}

void* CudaMemoryDomain::stream() {
  TANDEM_DOMAIN_CHECK(cudaSetDevice(device_));  // the current device is per thread
  return stream_;
}

// Heap <-> caller's (pageable) buffer through a pinned bounce buffer: a copy to or from pageable memory goes
// through the driver's shared staging path, which the application's own pageable copies hold while they wait
// for a running kernel (a user's .tolist() or print(t) behind a kernel that waits for this very proxy: a
// deadlock until the device timeout). Pinned copies on this domain's non-blocking stream never wait for it.
void CudaMemoryDomain::read(uint64_t offset, void* dst, uint64_t n) {
  check_range(offset, n, "proxy.cuda_memory");
  std::lock_guard<std::mutex> g(mu_);
  auto s = static_cast<cudaStream_t>(stream());
  if (pageable_) {
    TANDEM_DOMAIN_CHECK(cudaMemcpyAsync(dst, base_ + offset, n, cudaMemcpyDeviceToHost, s));
    TANDEM_DOMAIN_CHECK(cudaStreamSynchronize(s));
    return;
  }
  for (uint64_t done = 0; done < n; done += kBounceBytes) {
    const uint64_t len = n - done < kBounceBytes ? n - done : kBounceBytes;
    TANDEM_DOMAIN_CHECK(cudaMemcpyAsync(bounce_, base_ + offset + done, len, cudaMemcpyDeviceToHost, s));
    TANDEM_DOMAIN_CHECK(cudaStreamSynchronize(s));
    std::memcpy(static_cast<char*>(dst) + done, bounce_, len);
  }
}

void CudaMemoryDomain::write(uint64_t offset, const void* src, uint64_t n) {
  check_range(offset, n, "proxy.cuda_memory");
  std::lock_guard<std::mutex> g(mu_);
  auto s = static_cast<cudaStream_t>(stream());
  if (pageable_) {
    TANDEM_DOMAIN_CHECK(cudaMemcpyAsync(base_ + offset, src, n, cudaMemcpyHostToDevice, s));
    TANDEM_DOMAIN_CHECK(cudaStreamSynchronize(s));
    return;
  }
  for (uint64_t done = 0; done < n; done += kBounceBytes) {
    const uint64_t len = n - done < kBounceBytes ? n - done : kBounceBytes;
    std::memcpy(bounce_, static_cast<const char*>(src) + done, len);
    TANDEM_DOMAIN_CHECK(cudaMemcpyAsync(base_ + offset + done, bounce_, len, cudaMemcpyHostToDevice, s));
    TANDEM_DOMAIN_CHECK(cudaStreamSynchronize(s));
  }
}

void CudaMemoryDomain::signal(uint64_t offset, uint64_t value, uint32_t op) {
  check_flag(offset, "proxy.cuda_memory");
  std::lock_guard<std::mutex> g(mu_);
  auto s = static_cast<cudaStream_t>(stream());
  auto* flag = reinterpret_cast<uint64_t*>(base_ + offset);
  if (op != 0) {  // add: read the current value (every earlier write of this proxy has completed)
    TANDEM_DOMAIN_CHECK(cudaMemcpyAsync(pinned_, flag, sizeof(uint64_t), cudaMemcpyDeviceToHost, s));
    TANDEM_DOMAIN_CHECK(cudaStreamSynchronize(s));
    value += *pinned_;
  }
  *pinned_ = value;
  TANDEM_DOMAIN_CHECK(cudaMemcpyAsync(flag, pinned_, sizeof(uint64_t), cudaMemcpyHostToDevice, s));
  TANDEM_DOMAIN_CHECK(cudaStreamSynchronize(s));
}

}  // namespace tandem::proxy
