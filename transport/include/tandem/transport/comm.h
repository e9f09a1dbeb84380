// tandem transport — the host communicator: ranks, topology, symmetric heap, device handle, errors.
#pragma once

#include <cstddef>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/transport/bootstrap.h"
#include "tandem/transport/device_comm.h"
#include "tandem/transport/status.h"

namespace tandem {

enum class HeapKind : int32_t {
  kAuto = 0,  // cuMem VMM exported as POSIX fds; cudaIpc if the driver cannot
  kVmm = 1,   // cuMem VMM only
  kIpc = 2,   // cudaMalloc + cudaIpc handles only
};

struct CommOptions {
  uint64_t heap_bytes = 256ull << 20;  // symmetric heap per rank
  double timeout_s = 30.0;             // default bound of every device wait and of the setup exchanges
  int device = -1;                     // CUDA device; -1 = the current device
  HeapKind heap = HeapKind::kAuto;
  int ranks_per_node = 0;              // >0: emulate nodes of this many consecutive ranks (0 = by host)
  // Proxy path to other nodes (used when there is more than one node).
  uint32_t proxy_capacity = 4096;      // commands in flight per rank (power of two)
  std::string proxy_host;              // IPv4 address peers reach this rank's proxy at; empty: TANDEM_PROXY_HOST,
                                       // else 127.0.0.1 (emulated nodes on one host)
  // true: make the command queue (and the device's view of it) but start no proxy thread or backend: the
  // caller drains command_queue() itself (the Python verbs proxy, whose QPs pyverbs owns).
  bool external_proxy = false;
};

// Host-side view of the first device error (a copy of the ErrorRecord).
struct DeviceError {
  Status status;
  DeviceOp op;
  int rank;
  int peer;
  uint64_t expected;
  uint64_t observed;
  uint64_t elapsed_ns;
  int block;
  int thread;
  std::string message() const;
};

class SymmetricHeap;
namespace detail {
class PeerMonitor;
}
namespace proxy {
class CommandQueue;
class ProxyService;
struct Command;
struct QueueControl;
}  // namespace proxy

// Makes `device` the calling thread's current CUDA device for the scope, and restores the previous one after.
// CUDA calls go to the thread's current device, and a communicator's teardown or a launch can run on any thread
// (a tensor's finalizer, a torch.cuda.device(...) block): with one rank per GPU, rank k's work must not land on
// GPU 0. A no-op when `device` is already current (every rank on one GPU, MPS).
class ScopedDevice {
 public:
  explicit ScopedDevice(int device);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = -1;         // -1: nothing to restore
  bool clear_after_ = false;  // the thread had no current context: leave it without one
};

class Communicator {
 public:
  // Collective over all ranks of `bootstrap`.
  Communicator(std::shared_ptr<Bootstrap> bootstrap, const CommOptions& options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  int node() const { return node_; }
  int num_nodes() const { return num_nodes_; }
  // Ranks that share this rank's node (load/store reachable), ascending; includes this rank.
  const std::vector<int>& local_ranks() const { return local_ranks_; }
  int local_rank() const;
  // L if the nodes are groups of L consecutive ranks (node of rank r = r / L, the layout of emulated nodes and of
  // the usual launchers), else 0: the hierarchical schedules of the TP kernels need it.
  int uniform_ranks_per_node() const;
  int device() const { return device_; }
  // Multiprocessors this rank's context may use (under MPS the active-thread share, not the chip's count).
  int sm_count() const { return sm_count_; }
  const char* heap_kind() const;
  const CommOptions& options() const { return options_; }

  // Symmetric allocation: collective, same sizes in the same order on every rank; returns the local address.
  // With `verify`, the ranks compare offsets and sizes through the bootstrap and throw if they differ.
  // After destroy(), every method except destroy(), free() (a no-op then) and the plain getters throws
  // tandem::Error (kInvalidArgument, "communicator destroyed").
  void* alloc(uint64_t bytes, uint64_t align = 256, bool verify = true);
  void free(void* ptr);
  void* heap_base() const;
  uint64_t heap_bytes() const;
  uint64_t heap_bytes_in_use() const;
  // True if `peer` runs on this rank's GPU (several ranks per GPU under MPS).
  bool peer_on_same_device(int peer) const { return peer >= 0 && peer < world_ && same_device_[peer]; }
  // Host-side address of symmetric address `sym` in `peer`'s heap (nullptr if not load/store reachable).
  void* peer_ptr(const void* sym, int peer) const;

  // Handle for kernels (pass by value).
  DeviceComm device_comm() const { return device_comm_; }

  // Abort: raise the flag every device spin loop polls. Sticky; the communicator is unusable afterwards.
  void abort();
  bool aborted() const;
  // First device error recorded so far, without synchronizing (kernels may still be running).
  std::optional<DeviceError> async_error() const;
  // Throw tandem::Error if a device error was recorded or a peer process of this node died (kPeerExited:
  // its death raised the abort flag, so every device wait of this rank stopped).
  void check() const;
  // What check() would throw, as data (never throws).
  std::optional<ErrorInfo> first_error() const noexcept;
  // Rank of the first local peer seen dying, or -1.
  int exited_peer() const;
  // True if peers on other nodes are reached through the CPU proxy (name: "tcp").
  bool has_proxy() const { return service_ != nullptr || (options_.external_proxy && queue_ != nullptr); }
  const char* proxy_backend() const;  // "tcp", "external" or "none"
  // The queue the device enqueues proxy commands into (null without proxy peers). With external_proxy the
  // caller must drain it (release and retire tickets) for as long as kernels may use proxy peers.
  proxy::CommandQueue* command_queue() const { return queue_.get(); }
  // A dmabuf fd over this rank's heap (caller closes it), for RDMA registration; -1 with the reason in *why
  // when the driver or the heap kind (cudaIpc) cannot give one.
  int export_heap_dmabuf(std::string* why) const;

  // Host-side barrier over the bootstrap (no GPU work).
  void host_barrier();
  // Synchronize the device and tear everything down (also done by the destructor). Safe after abort.
  void destroy();

 private:
  void setup();  // the constructor's work (the constructor releases what it made if this throws)
  void detect_topology();
  void setup_proxy(std::chrono::milliseconds timeout, const std::string& secret);
  void teardown_proxy();
  void release_local() noexcept;        // free everything of this rank, no collective step (also on failed setup)
  void require_live(const char* op) const;  // throw if destroyed
  std::string next_tag(const char* what);

  std::shared_ptr<Bootstrap> bootstrap_;
  CommOptions options_;
  int rank_ = 0, world_ = 1, node_ = 0, num_nodes_ = 1, device_ = 0, sm_count_ = 0;
  uint64_t tag_counter_ = 0;
  std::string prefix_;
  std::vector<int> local_ranks_;
  std::unique_ptr<SymmetricHeap> heap_;
  std::unique_ptr<detail::PeerMonitor> monitor_;
  std::unique_ptr<class RangeAllocator> allocator_;
  uint64_t* peer_heap_dev_ = nullptr;
  std::vector<uint64_t> peer_heap_host_;
  std::vector<bool> same_device_;  // peer r runs on this process's GPU (MPS)
  bool spans_hosts_ = false;       // some rank runs on another host (not only emulated nodes)
  std::vector<int> node_of_rank_;
  // Proxy path (other nodes).
  proxy::Command* ring_host_ = nullptr;
  proxy::QueueControl* ctl_host_ = nullptr;
  unsigned long long* tail_dev_ = nullptr;
  std::unique_ptr<proxy::CommandQueue> queue_;
  std::unique_ptr<proxy::ProxyService> service_;  // memory domain, proxy thread, TCP backend (safe teardown order)
  int32_t* abort_host_ = nullptr;
  ErrorRecord* error_host_ = nullptr;
  DeviceComm device_comm_{};
  bool destroyed_ = false;
};

}  // namespace tandem
