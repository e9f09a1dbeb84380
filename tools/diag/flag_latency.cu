// Flag round-trip latency of the device API's signal / wait_until against hand-written references, in one
// process: two single-block kernels on two streams play rank 0 and rank 1, each with its own DeviceComm whose
// two "heaps" are plain cudaMalloc buffers on this GPU (peer entries carry the same-device bit, as under MPS).
// It isolates what each part of the API costs per call (the MPS bench cannot: a variant there is one build).
//   nvcc -std=c++20 -arch=sm_90a -O3 -Itransport/include tools/diag/flag_latency.cu -o /tmp/flag_latency
//   add -DTANDEM_DEVICE_UNCHECKED to compile the bounds checks out
#include <cuda_runtime.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "tandem/device/impl/put_impl.cuh"
#include "tandem/device/impl/signal_impl.cuh"
#include "tandem/device/impl/wait_impl.cuh"

using namespace tandem;
using device::Cmp;
using device::Order;
using device::SignalOp;

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

enum Variant : int {
  kApiOrdered = 0,      // signal + wait_until, Order::kOrdered
  kApiRelaxed,          // signal + wait_until, Order::kRelaxed
  kApiSignalRawWait,    // API relaxed signal, hand relaxed spin on the local flag
  kRawSignalApiWait,    // hand relaxed store to a pointer resolved once, API relaxed wait
  kPeerPtrEachCall,     // device::peer_ptr every iteration + relaxed store; hand spin
  kRaw,                 // hand relaxed store + spin, pointer resolved once
  kVolatile,            // volatile store + spin (no ordering: the floor)
  kApiTargetRelaxed,    // signal_target once, signal(target) + API wait, Order::kRelaxed
  kApiTargetOrdered,    // the same, Order::kOrdered
  kVariants
};
const char* kNames[kVariants] = {"api-ordered", "api-relaxed",   "api-signal+raw-wait", "raw-signal+api-wait",
                                 "peer_ptr-each-call", "raw-relaxed", "volatile",
                                 "api-target-relaxed", "api-target-ordered"};

__global__ void pingpong(DeviceComm comm, uint64_t* flag, int peer, int iters, uint64_t base, bool initiator,
                         int variant, int* status) {
  using namespace device::impl;
  uint64_t* remote = reinterpret_cast<uint64_t*>(device::peer_ptr(comm, flag, peer));
  const device::SignalTarget target = device::signal_target(comm, flag, peer);
  Status s = Status::kOk;
  for (int i = 1; i <= iters && s == Status::kOk; ++i) {
    const uint64_t v = base + static_cast<uint64_t>(i);
    auto send = [&] {
      switch (variant) {
        case kApiOrdered: return device::signal(comm, flag, v, SignalOp::kSet, peer, Order::kOrdered);
        case kApiRelaxed:
        case kApiSignalRawWait: return device::signal(comm, flag, v, SignalOp::kSet, peer, Order::kRelaxed);
        case kPeerPtrEachCall: st_relaxed_gpu(reinterpret_cast<uint64_t*>(device::peer_ptr(comm, flag, peer)), v);
          return Status::kOk;
        case kVolatile: *reinterpret_cast<volatile uint64_t*>(remote) = v; return Status::kOk;
        case kApiTargetRelaxed: return device::signal(comm, target, v, SignalOp::kSet, Order::kRelaxed);
        case kApiTargetOrdered: return device::signal(comm, target, v, SignalOp::kSet, Order::kOrdered);
        default: st_relaxed_gpu(remote, v); return Status::kOk;
      }
    };
    auto wait = [&] {
      switch (variant) {
        case kApiOrdered:
        case kApiTargetOrdered: return device::wait_until(comm, flag, Cmp::kGe, v, peer, Order::kOrdered);
        case kApiRelaxed:
        case kApiTargetRelaxed:
        case kRawSignalApiWait: return device::wait_until(comm, flag, Cmp::kGe, v, peer, Order::kRelaxed);
        case kVolatile:
          while (*reinterpret_cast<volatile uint64_t*>(flag) < v) {}
          return Status::kOk;
        default:
          while (ld_relaxed_gpu(flag) < v) {}
          return Status::kOk;
      }
    };
    if (initiator) {
      s = send();
      if (s == Status::kOk) s = wait();
    } else {
      s = wait();
      if (s == Status::kOk) s = send();
    }
  }
  if (s != Status::kOk) *status = static_cast<int>(s);
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20000;
  const int reps = 5;
  constexpr size_t kHeap = 2u << 20;
  char* heaps[2];
  for (auto& h : heaps) {
    CK(cudaMalloc(&h, kHeap));
    CK(cudaMemset(h, 0, kHeap));
  }
  DeviceComm comm[2];
  for (int r = 0; r < 2; ++r) {
    comm[r].rank = r;
    comm[r].world = 2;
    comm[r].heap_base = heaps[r];
    comm[r].heap_bytes = kHeap;
    comm[r].timeout_ns = 10'000'000'000ull;
    for (int p = 0; p < 2; ++p)
      comm[r].peer_heap_inline[p] = reinterpret_cast<uint64_t>(heaps[p]) | kPeerSameDeviceBit;
  }
  uint64_t* peer_heap;
  CK(cudaMalloc(&peer_heap, 2 * sizeof(uint64_t)));
  CK(cudaMemcpy(peer_heap, comm[0].peer_heap_inline, 2 * sizeof(uint64_t), cudaMemcpyHostToDevice));
  comm[0].peer_heap = comm[1].peer_heap = peer_heap;
  int* status;
  CK(cudaMalloc(&status, sizeof(int)));
  CK(cudaMemset(status, 0, sizeof(int)));
  cudaStream_t st[2];
  for (auto& s : st) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const size_t flag_off = 4096;
  uint64_t base = 0;
  std::printf("flag round trip, two single-block kernels on one GPU, %d round trips x %d reps (median)\n", iters, reps);
  for (int v = 0; v < kVariants; ++v) {
    std::vector<float> ms;
    for (int rep = 0; rep < reps + 1; ++rep) {
      CK(cudaEventRecord(e0, st[0]));
      for (int r = 1; r >= 0; --r)
        pingpong<<<1, 1, 0, st[r]>>>(comm[r], reinterpret_cast<uint64_t*>(heaps[r] + flag_off), 1 - r, iters,
                                     base, r == 0, v, status);
      CK(cudaEventRecord(e1, st[0]));
      CK(cudaDeviceSynchronize());
      base += iters;
      float t = 0;
      CK(cudaEventElapsedTime(&t, e0, e1));
      if (rep > 0) ms.push_back(t);  // the first is a warm-up
    }
    int h = 0;
    CK(cudaMemcpy(&h, status, sizeof(int), cudaMemcpyDeviceToHost));
    std::sort(ms.begin(), ms.end());
    std::printf("  %-22s %.3f us%s\n", kNames[v], ms[ms.size() / 2] * 1e3 / iters, h ? "  (status != 0)" : "");
  }
  return 0;
}
