// tandem — the device handle of a communicator.
//
// This header is plain C++ so that host code compiled by any C++ compiler can fill the struct; the device API
// (tandem/device/*.cuh) receives it by value as a kernel argument. No __device__ globals are involved, so
// consumer kernels need neither -rdc nor a device link step.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/transport/proxy_command.h"

// Functions shared by host and device code (the header stays plain C++ for host compilers).
#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif

namespace tandem {

// Status codes shared by host and device code. Values are stable (they cross the pybind11 boundary).
enum class Status : int32_t {
  kOk = 0,
  kTimeout = 1,         // a bounded wait expired
  kAborted = 2,         // the abort flag was raised (by the host, or by another wait that failed)
  kInvalidArgument = 3,
  kUnreachablePeer = 4, // no path to the peer (no NVLink/IPC mapping and no proxy)
  kCudaError = 5,
  kSystemError = 6,
  kBootstrapError = 7,
  kOutOfMemory = 8,
  kUnsupported = 9,
  kInternal = 10,
  kPeerExited = 11,     // a peer process of this node died (seen by the host's peer monitor)
};

// Which primitive reported a device-side error (recorded in ErrorRecord::op).
enum class DeviceOp : int32_t {
  kNone = 0,
  kWaitUntil = 1,
  kBarrier = 2,
  kPut = 3,
  kSignal = 4,
  kQuiet = 5,
  kProxy = 6,  // enqueueing a command for the CPU proxy (ring full for too long, or the proxy failed)
};

// First device-side error of a communicator. Lives in host-mapped pinned memory so the host can read it while
// a kernel still runs. `status` is written last (release) by the one thread that claimed the record.
struct ErrorRecord {
  volatile int32_t status;  // Status; kOk while no error
  int32_t rank;             // rank that observed the error
  int32_t op;               // DeviceOp
  int32_t peer;             // peer the wait depended on, -1 if unknown
  uint64_t expected;        // value waited for
  uint64_t observed;        // last value seen
  uint64_t elapsed_ns;      // how long the wait lasted
  int32_t block;            // blockIdx.x of the reporting thread
  int32_t thread;           // threadIdx.x of the reporting thread
};

// Layout of the reserved region at the start of every rank's symmetric heap (offsets in bytes from the heap
// base). The rest of the heap is handed out by the symmetric allocator.
struct ReservedLayout {
  static constexpr size_t kAlign = 128;  // flags sit on their own 128-byte lines
  // barrier_recv[p]: number of barriers rank p has completed with this rank (written by p, read here).
  // barrier_sent[p]: number of barriers this rank has entered with p (written and read only here).
  TANDEM_HOST_DEVICE static constexpr size_t barrier_recv_offset() { return 0; }
  TANDEM_HOST_DEVICE static constexpr size_t barrier_sent_offset(int world) { return round_up(sizeof(uint64_t) * world); }
  TANDEM_HOST_DEVICE static constexpr size_t error_claim_offset(int world) { return 2 * round_up(sizeof(uint64_t) * world); }
  TANDEM_HOST_DEVICE static constexpr size_t bytes(int world) { return error_claim_offset(world) + kAlign; }
  TANDEM_HOST_DEVICE static constexpr size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
};

// Everything a kernel needs to reach the other ranks. Trivially copyable; pass by value.
constexpr uint64_t kPeerSameDeviceBit = 1;

// Heap entries of the first kInlinePeerHeaps ranks travel inside DeviceComm itself. A kernel argument is read
// through the constant cache, which an acquire (it invalidates L1) leaves alone: resolving a peer address
// right after a wait then costs no L2 round trip (measured: 0.4 us of a 1.7 us flag round trip on the H200).
constexpr int kInlinePeerHeaps = 16;

struct DeviceComm {
  int32_t rank = 0;
  int32_t world = 1;
  char* heap_base = nullptr;               // this rank's heap, local address
  uint64_t heap_bytes = 0;                 // bytes per rank (same on every rank)
  const uint64_t* peer_heap = nullptr;     // device array [world]: local address of each peer's heap, 0 = no
                                           // load/store path (the peer is on another node). Bit 0 set: the
                                           // peer runs on this same GPU (MPS), so .gpu-scope ordering suffices
                                           // (heaps are 2 MiB aligned, the bit is free).
  volatile int32_t* abort_flag = nullptr;  // host-mapped; nonzero stops every spin loop
  ErrorRecord* error = nullptr;            // host-mapped
  uint64_t timeout_ns = 0;                 // default bound of every wait; 0 = wait forever (still abortable)

  // Proxy path to peers with no load/store path (other nodes). All null when the communicator has none.
  proxy::Command* proxy_slots = nullptr;       // host-mapped ring the CPU proxy drains
  proxy::QueueControl* proxy_ctl = nullptr;    // host-mapped: head (consumed), retired (complete), error
  unsigned long long* proxy_tail = nullptr;    // device memory: next ticket (GPU atomics stay on the GPU)
  uint32_t proxy_capacity = 0;                 // power of two

  uint64_t peer_heap_inline[kInlinePeerHeaps] = {};  // copy of peer_heap[0, min(world, kInlinePeerHeaps))
};

}  // namespace tandem
