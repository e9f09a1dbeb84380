// CudaMemoryDomain: the proxy's access to a GPU-resident symmetric heap (host code, CUDA runtime only).
//
// Add signals are a read-modify-write through two 8-byte copies under this domain's lock. A kernel doing a
// device atomic would be simpler, but it needs a free SM, and a persistent kernel that spins on this very flag
// holds all of them: the add would never run. The copy engines always can. Consequence (docs/memory-model.md):
// remote adds are atomic with respect to each other, not with respect to concurrent adds by local threads.
#include <cuda_runtime_api.h>

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
}

CudaMemoryDomain::~CudaMemoryDomain() {
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
}

void* CudaMemoryDomain::stream() {
  TANDEM_DOMAIN_CHECK(cudaSetDevice(device_));  // the current device is per thread
  return stream_;
}

void CudaMemoryDomain::read(uint64_t offset, void* dst, uint64_t n) {
  check_range(offset, n, "proxy.cuda_memory");
  std::lock_guard<std::mutex> g(mu_);
  auto s = static_cast<cudaStream_t>(stream());
  TANDEM_DOMAIN_CHECK(cudaMemcpyAsync(dst, base_ + offset, n, cudaMemcpyDeviceToHost, s));
  TANDEM_DOMAIN_CHECK(cudaStreamSynchronize(s));
}

void CudaMemoryDomain::write(uint64_t offset, const void* src, uint64_t n) {
  check_range(offset, n, "proxy.cuda_memory");
  std::lock_guard<std::mutex> g(mu_);
  auto s = static_cast<cudaStream_t>(stream());
  TANDEM_DOMAIN_CHECK(cudaMemcpyAsync(base_ + offset, src, n, cudaMemcpyHostToDevice, s));
  TANDEM_DOMAIN_CHECK(cudaStreamSynchronize(s));
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
