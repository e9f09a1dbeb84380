// Worked example (docs/worked-example.md): all-gather of a float vector fused with an elementwise epilogue,
// in one kernel, using only tandem's public device API and host communicator.
//
//   out[r * n + i] = alpha * x_r[i] + beta      for every rank r and i < n
//
// Each block pushes its slice of the local x into row `rank` of every peer's symmetric gather buffer
// (put_signal: data, then +1 on arrivals[rank] at the peer), then waits for every row to be complete and
// applies the epilogue to its slice of each row. Flow control across launches: before overwriting a peer's
// row, a block waits until that peer has finished reading the previous launch (consumed[peer]).
//
// Run: python -m tandem.launch -n 4 -- ./allgather_epilogue     (FileBootstrap reads the launcher's env)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "tandem/device.cuh"
#include "tandem/transport/comm.h"

namespace td = tandem::device;

__global__ void allgather_epilogue(tandem::DeviceComm comm, const float* x, float* gather, uint64_t* arrivals,
                                   uint64_t* consumed, float* out, size_t n, float alpha, float beta,
                                   uint64_t epoch) {
  const size_t chunk = (n + gridDim.x - 1) / gridDim.x;
  const size_t begin = min(n, blockIdx.x * chunk);
  const size_t len = min(n, begin + chunk) - begin;
  const uint64_t per_launch = gridDim.x;  // every block of a rank signals once per launch

  // 1. Push my slice to every rank (start at rank+1 so that ranks do not all hit the same peer first).
  for (int k = 1; k <= comm.world; ++k) {
    const int peer = (comm.rank + k) % comm.world;
    __shared__ int failed;
    if (threadIdx.x == 0) {
      // The peer must have read launch epoch-1 out of its gather buffer before we overwrite our row there.
      failed = td::wait_until(comm, consumed + peer, td::Cmp::kGe, (epoch - 1) * per_launch, peer) !=
               tandem::Status::kOk;
    }
    __syncthreads();
    if (failed) return;
    td::put_signal<td::Group::kBlock>(comm, gather + comm.rank * n + begin, x + begin, len * sizeof(float),
                                      arrivals + comm.rank, 1, td::SignalOp::kAdd, peer);
  }
  // 2. Epilogue over my slice of every row once that row is complete.
  for (int k = 0; k < comm.world; ++k) {
    const int src = (comm.rank + k) % comm.world;
    __shared__ int failed;
    if (threadIdx.x == 0)
      failed = td::wait_until(comm, arrivals + src, td::Cmp::kGe, epoch * per_launch, src) != tandem::Status::kOk;
    __syncthreads();
    if (failed) return;
    const float* row = gather + src * n;
    for (size_t i = begin + threadIdx.x; i < begin + len; i += blockDim.x) out[src * n + i] = alpha * row[i] + beta;
  }
  // 3. Tell every rank that this block is done reading its rows of this launch.
  __syncthreads();
  if (threadIdx.x < comm.world) td::signal(comm, consumed + comm.rank, 1, td::SignalOp::kAdd, threadIdx.x);
}

__global__ void fill_input(float* x, size_t n, int rank) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] = static_cast<float>(rank * 1000 + static_cast<int>(i % 997));
}

#define CHECK_CUDA(x)                                                                            \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
      std::exit(3);                                                                              \
    }                                                                                            \
  } while (0)

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1000003;  // ragged on purpose
  const int launches = argc > 2 ? std::atoi(argv[2]) : 20;
  try {
    auto bootstrap = std::make_shared<tandem::FileBootstrap>(tandem::FileBootstrap::from_env());
    const char* dev = std::getenv("TANDEM_DEVICE");
    tandem::CommOptions opt;
    opt.device = dev ? std::atoi(dev) : 0;
    opt.heap_bytes = (bootstrap->world() * n * sizeof(float)) + (16u << 20);
    opt.timeout_s = 20;
    tandem::Communicator comm(bootstrap, opt);
    const int rank = comm.rank(), world = comm.world();

    auto* gather = static_cast<float*>(comm.alloc(world * n * sizeof(float)));
    auto* arrivals = static_cast<uint64_t*>(comm.alloc(world * sizeof(uint64_t)));
    auto* consumed = static_cast<uint64_t*>(comm.alloc(world * sizeof(uint64_t)));
    CHECK_CUDA(cudaMemset(arrivals, 0, world * sizeof(uint64_t)));
    CHECK_CUDA(cudaMemset(consumed, 0, world * sizeof(uint64_t)));
    float *x = nullptr, *out = nullptr;
    CHECK_CUDA(cudaMalloc(&x, n * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&out, world * n * sizeof(float)));
    fill_input<<<128, 256>>>(x, n, rank);
    CHECK_CUDA(cudaDeviceSynchronize());
    comm.host_barrier();

    // A persistent-style grid sized to the SMs this rank really has (its MPS share), capped for the example.
    const int blocks = std::min(comm.sm_count(), 32);
    std::vector<float> host(world * n);
    long long wrong = 0;
    cudaEvent_t t0, t1;
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    float last_ms = 0;
    for (int e = 1; e <= launches; ++e) {
      const float alpha = static_cast<float>(e), beta = -0.5f * e;
      CHECK_CUDA(cudaMemset(out, 0xFF, world * n * sizeof(float)));  // poison: NaN everywhere
      CHECK_CUDA(cudaEventRecord(t0));
      allgather_epilogue<<<blocks, 512>>>(comm.device_comm(), x, gather, arrivals, consumed, out, n, alpha, beta,
                                          static_cast<uint64_t>(e));
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaEventRecord(t1));
      CHECK_CUDA(cudaDeviceSynchronize());
      comm.check();  // throws tandem::Error naming rank, op and peer if a wait timed out
      CHECK_CUDA(cudaEventElapsedTime(&last_ms, t0, t1));
      CHECK_CUDA(cudaMemcpy(host.data(), out, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
      for (int r = 0; r < world; ++r)
        for (size_t i = 0; i < n; ++i) {
          const float expect = alpha * static_cast<float>(r * 1000 + static_cast<int>(i % 997)) + beta;
          wrong += host[r * n + i] != expect;
        }
    }
    std::printf("allgather_epilogue: rank %d world %d n %zu launches %d blocks %d heap %s wrong %lld last %.3f ms\n",
                rank, world, n, launches, blocks, comm.heap_kind(), wrong, last_ms);
    cudaFree(x);
    cudaFree(out);
    comm.destroy();
    return wrong == 0 ? 0 : 1;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
