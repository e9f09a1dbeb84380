// Worked example, second part (docs/worked-example.md): the same fused all-gather + epilogue as
// allgather_epilogue.cu, built on tandem's persistent-kernel runtime (tandem/kernels/runtime/persistent.cuh) the
// way tandem's own fused kernels are -- what a new fused kernel brings is its layout and its two role bodies:
//
//   out[r * n + i] = alpha * x_r[i] + beta      for every rank r and i < n
//
// * Layout: a control block (deriving from runtime::ControlHeader: the epoch protocol's words), the
//   symmetric gather buffer, and two flag arrays (arrivals, consumed).
// * Roles over the grid (runtime::dispatch_roles): the first `comm` blocks push this rank's x, slice by slice, into
//   row `rank` of every peer's gather buffer (put_signal: data, then +1 on arrivals[rank] there); the blocks after
//   them wait for each row and apply the epilogue to their slice of it, then tell every peer they are done
//   reading (+1 on consumed[rank] there). A comm block overwrites a peer's row only after every compute block of
//   that peer has read the previous launch (consumed[peer] >= (e - 1) x compute blocks).
// * Epochs on the device (runtime::current_epoch / finish_block): the host passes none, so the launch can be
//   captured in a CUDA graph and replayed as is. Flags only grow; nothing is reset.
// * Residency: compute blocks wait for this rank's comm blocks. The grid is at most the SMs this rank has (its MPS
//   share) with one block an SM, so every block is resident at once (MPS promises nothing beyond that).
//
// Run: python -m tandem.launch -n 4 -- ./allgather_epilogue_roles [n] [launches]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "tandem/device.cuh"
#include "tandem/kernels/runtime/persistent.cuh"
#include "tandem/transport/comm.h"

namespace td = tandem::device;
namespace rt = tandem::kernels::runtime;

struct Control : rt::ControlHeader {};  // the runtime's words (epoch, done_blocks); this op needs no flags of its own

struct Layout {
  Control* ctl;
  float* gather;       // symmetric: world x n
  uint64_t* arrivals;  // symmetric: [world], arrivals[src] += 1 per comm block of src per launch
  uint64_t* consumed;  // symmetric: [world], consumed[r] += 1 per compute block of r per launch
};

// [begin, end) of slice `i` of `parts` over n elements.
__device__ __forceinline__ void slice(size_t n, int parts, int i, size_t* begin, size_t* end) {
  const size_t chunk = (n + parts - 1) / parts;
  *begin = min(n, static_cast<size_t>(i) * chunk);
  *end = min(n, *begin + chunk);
}

__device__ __forceinline__ bool wait_block(const tandem::DeviceComm& comm, uint64_t* flag, uint64_t value, int peer) {
  __shared__ int failed;
  if (threadIdx.x == 0) failed = td::wait_until(comm, flag, td::Cmp::kGe, value, peer) != tandem::Status::kOk;
  __syncthreads();
  return !failed;  // a timeout is recorded in the communicator (comm.check() throws on the host)
}

__global__ void allgather_epilogue_roles(tandem::DeviceComm comm, Layout l, const float* x, float* out, size_t n,
                                         float alpha, float beta, int comm_blocks) {
  const uint64_t e = rt::current_epoch(l.ctl);
  const int compute_blocks = static_cast<int>(gridDim.x) - comm_blocks;
  rt::dispatch_roles(
      comm_blocks, true,
      [&](int c) {  // comm role: push slice c of x to every rank (start at rank + 1: not all on one peer first)
        size_t begin, end;
        slice(n, comm_blocks, c, &begin, &end);
        for (int k = 1; k <= comm.world; ++k) {
          const int peer = (comm.rank + k) % comm.world;
          if (!wait_block(comm, l.consumed + peer, (e - 1) * compute_blocks, peer)) return;
          td::put_signal<td::Group::kBlock>(comm, l.gather + comm.rank * n + begin, x + begin,
                                            (end - begin) * sizeof(float), l.arrivals + comm.rank, 1,
                                            td::SignalOp::kAdd, peer);
        }
      },
      [&] {  // compute role: the epilogue over slice k of every row once the row is complete
        const int k = static_cast<int>(blockIdx.x) - comm_blocks;
        size_t begin, end;
        slice(n, compute_blocks, k, &begin, &end);
        for (int j = 0; j < comm.world; ++j) {
          const int src = (comm.rank + j) % comm.world;
          if (!wait_block(comm, l.arrivals + src, e * comm_blocks, src)) return;
          const float* row = l.gather + src * n;
          for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) out[src * n + i] = alpha * row[i] + beta;
        }
        __syncthreads();  // this block is done reading every row of this launch
        if (threadIdx.x < comm.world) td::signal(comm, l.consumed + comm.rank, 1, td::SignalOp::kAdd, threadIdx.x);
      });
  rt::finish_block(l.ctl, gridDim.x, e, [] {});
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

    Layout l{};
    l.ctl = static_cast<Control*>(comm.alloc(sizeof(Control)));
    l.gather = static_cast<float*>(comm.alloc(world * n * sizeof(float)));
    l.arrivals = static_cast<uint64_t*>(comm.alloc(world * sizeof(uint64_t)));
    l.consumed = static_cast<uint64_t*>(comm.alloc(world * sizeof(uint64_t)));
    CHECK_CUDA(cudaMemset(l.ctl, 0, sizeof(Control)));
    CHECK_CUDA(cudaMemset(l.arrivals, 0, world * sizeof(uint64_t)));
    CHECK_CUDA(cudaMemset(l.consumed, 0, world * sizeof(uint64_t)));
    float *x = nullptr, *out = nullptr;
    CHECK_CUDA(cudaMalloc(&x, n * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&out, world * n * sizeof(float)));
    fill_input<<<128, 256>>>(x, n, rank);
    CHECK_CUDA(cudaDeviceSynchronize());
    comm.host_barrier();  // every rank's flags are zero before any peer signals them

    // One block an SM, at most the SMs this rank has (capped for the example): every block resident at once.
    const int blocks = std::max(2, std::min(comm.sm_count(), 32));
    const int comm_blocks = std::max(1, blocks / 4);
    std::vector<float> host(world * n);
    long long wrong = 0;
    for (int e = 1; e <= launches; ++e) {
      const float alpha = static_cast<float>(e), beta = -0.5f * e;
      CHECK_CUDA(cudaMemset(out, 0xFF, world * n * sizeof(float)));  // poison: NaN everywhere
      allgather_epilogue_roles<<<blocks, 512>>>(comm.device_comm(), l, x, out, n, alpha, beta, comm_blocks);
      CHECK_CUDA(cudaGetLastError());
      CHECK_CUDA(cudaDeviceSynchronize());
      comm.check();  // throws tandem::Error naming rank, op and peer if a wait timed out
      CHECK_CUDA(cudaMemcpy(host.data(), out, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
      for (int r = 0; r < world; ++r)
        for (size_t i = 0; i < n; ++i) {
          const float expect = alpha * static_cast<float>(r * 1000 + static_cast<int>(i % 997)) + beta;
          wrong += host[r * n + i] != expect;
        }
    }
    uint64_t epoch = 0;
    CHECK_CUDA(cudaMemcpy(&epoch, &l.ctl->epoch, sizeof(epoch), cudaMemcpyDeviceToHost));
    std::printf("allgather_epilogue_roles: rank %d world %d n %zu launches %d blocks %d comm %d epoch %llu wrong %lld\n",
                rank, world, n, launches, blocks, comm_blocks, static_cast<unsigned long long>(epoch), wrong);
    cudaFree(x);
    cudaFree(out);
    comm.destroy();
    return wrong == 0 && epoch == static_cast<uint64_t>(launches) ? 0 : 1;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
