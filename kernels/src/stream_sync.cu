// Stream-ordered flags between ranks (stream_sync.h): three one-block kernels on the device API.
#include "tandem/device.cuh"
#include "tandem/kernels/stream_sync.h"

namespace tandem::kernels::stream_sync {

namespace {

struct SignalArgs {
  DeviceComm comm;
  uint64_t* flag;
  const uint64_t* counter;
  int64_t offset;
  int count;
  int peers[kMaxFlags];
};

struct WaitArgs {
  DeviceComm comm;
  const uint64_t* counter;
  int64_t offset;
  int count;
  uint64_t* flags[kMaxFlags];
  int writers[kMaxFlags];
};

__global__ void advance_kernel(uint64_t* counter) {
  if (threadIdx.x == 0) *counter += 1;  // read by later kernels on this stream (and streams joined after it)
}

// One thread per peer: the signals leave in parallel.
__global__ void signal_kernel(SignalArgs a) {
  const int i = threadIdx.x;
  if (i >= a.count) return;
  const uint64_t value = *a.counter + static_cast<uint64_t>(a.offset);
  device::signal(a.comm, a.flag, value, device::SignalOp::kSet, a.peers[i]);
}

// One thread per flag; each wait is bounded (device::wait_until records a timeout and raises the abort flag).
__global__ void wait_kernel(WaitArgs a) {
  const int i = threadIdx.x;
  if (i < a.count) {
    const uint64_t value = *a.counter + static_cast<uint64_t>(a.offset);
    device::wait_until(a.comm, a.flags[i], device::Cmp::kGe, value, a.writers[i]);
  }
  // The acquire above is per thread; the kernel's end orders it before every later kernel of the stream.
}

// Grid-stride copy on SMs: 16-byte words when both ends allow, then the tail bytes. The diagnostic alternative
// to the copy engines (TANDEM_PIPELINE_COPY=sm): same stream order, no copy engine in the path.
__global__ void copy_kernel(unsigned char* dst, const unsigned char* src, size_t bytes) {
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t nthreads = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t words = 0;
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % 16 == 0) {
    words = bytes / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (size_t i = tid; i < words; i += nthreads) d[i] = s[i];
  }
  for (size_t i = words * 16 + tid; i < bytes; i += nthreads) dst[i] = src[i];
}

Status launched(std::string* why) {
  // cudaPeekAtLastError would also report an earlier, unrelated launch's error; the launch's own error is what
  // cudaGetLastError returns right after it, and launches report configuration errors synchronously.
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::kOk;
  if (why) *why = std::string("launch failed: ") + cudaGetErrorString(e);
  return Status::kCudaError;
}

Status bad(std::string* why, const char* w) {
  if (why) *why = w;
  return Status::kInvalidArgument;
}

}  // namespace

Status advance(uint64_t* counter, cudaStream_t stream, std::string* why) {
  if (counter == nullptr) return bad(why, "counter is null");
  advance_kernel<<<1, 32, 0, stream>>>(counter);
  return launched(why);
}

Status signal(const DeviceComm& comm, uint64_t* flag, const int* peers, int count, const uint64_t* counter,
              int64_t offset, cudaStream_t stream, std::string* why) {
  if (flag == nullptr || counter == nullptr) return bad(why, "flag and counter must be set");
  if (count < 0 || count > kMaxFlags) return bad(why, "at most kMaxFlags peers");
  if (count == 0) return Status::kOk;
  SignalArgs a{};
  a.comm = comm;
  a.flag = flag;
  a.counter = counter;
  a.offset = offset;
  a.count = count;
  for (int i = 0; i < count; ++i) {
    if (peers[i] < 0 || peers[i] >= comm.world) return bad(why, "peer out of range");
    a.peers[i] = peers[i];
  }
  signal_kernel<<<1, 64, 0, stream>>>(a);
  return launched(why);
}

Status wait(const DeviceComm& comm, uint64_t* const* flags, const int* writers, int count, const uint64_t* counter,
            int64_t offset, cudaStream_t stream, std::string* why) {
  if (counter == nullptr) return bad(why, "counter is null");
  if (count < 0 || count > kMaxFlags) return bad(why, "at most kMaxFlags flags");
  if (count == 0) return Status::kOk;
  WaitArgs a{};
  a.comm = comm;
  a.counter = counter;
  a.offset = offset;
  a.count = count;
  for (int i = 0; i < count; ++i) {
    if (flags[i] == nullptr) return bad(why, "null flag");
    a.flags[i] = flags[i];
    a.writers[i] = writers[i];
  }
  wait_kernel<<<1, 64, 0, stream>>>(a);
  return launched(why);
}

Status copy(void* dst, const void* src, size_t bytes, cudaStream_t stream, std::string* why) {
  if (bytes == 0) return Status::kOk;
  if (dst == nullptr || src == nullptr) return bad(why, "null address");
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream);
  if (e == cudaSuccess) return Status::kOk;
  if (why) *why = std::string("cudaMemcpyAsync: ") + cudaGetErrorString(e);
  return Status::kCudaError;
}

Status copy_on_sms(void* dst, const void* src, size_t bytes, int blocks, cudaStream_t stream, std::string* why) {
  if (bytes == 0) return Status::kOk;
  if (dst == nullptr || src == nullptr) return bad(why, "null address");
  if (blocks < 1 || blocks > 1024) return bad(why, "blocks must be in [1, 1024]");
  copy_kernel<<<blocks, 512, 0, stream>>>(static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src),
                                          bytes);
  return launched(why);
}

cudaError_t preload_kernels() {
  cudaFuncAttributes attr{};
  const cudaError_t e[] = {cudaFuncGetAttributes(&attr, advance_kernel), cudaFuncGetAttributes(&attr, signal_kernel),
                           cudaFuncGetAttributes(&attr, wait_kernel),
                           cudaFuncGetAttributes(&attr, copy_kernel)};
  for (cudaError_t x : e)
    if (x != cudaSuccess) return x;
  return cudaSuccess;
}

}  // namespace tandem::kernels::stream_sync
