#include "tandem/transport/comm.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <cstdio>

#include "driver_api.h"
#include "heap.h"
#include "peer_monitor.h"
#include "tandem/transport/allocator.h"
#include "tandem/transport/proxy.h"

namespace tandem {

namespace {

std::atomic<uint64_t> g_comm_counter{0};

std::string host_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(host) + "/" + boot;
}

std::string format_seconds(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g s", static_cast<double>(ns) * 1e-9);
  return buf;
}

}  // namespace

std::string DeviceError::message() const {
  std::string s;
  switch (status) {
    case Status::kTimeout:
      s = "waited " + format_seconds(elapsed_ns) + " for a flag to reach " + std::to_string(expected) +
          ", last saw " + std::to_string(observed);
      break;
    case Status::kInvalidArgument: {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(observed));
      s = std::string("symmetric address ") + buf + " (+" + std::to_string(expected) +
          " bytes) or rank out of range";
      break;
    }
    case Status::kUnreachablePeer:
      s = "no load/store path to the peer (another node; the proxy path is not enabled)";
      break;
    default:
      break;
  }
  s += " (block " + std::to_string(block) + ", thread " + std::to_string(thread) + ")";
  return s;
}

Communicator::Communicator(std::shared_ptr<Bootstrap> bootstrap, const CommOptions& options)
    : bootstrap_(std::move(bootstrap)), options_(options) {
  if (!bootstrap_) throw Error(Status::kInvalidArgument, "communicator.init", -1, -1, "no bootstrap");
  rank_ = bootstrap_->rank();
  world_ = bootstrap_->world();
  if (world_ <= 0 || rank_ < 0 || rank_ >= world_)
    throw Error(Status::kInvalidArgument, "communicator.init", rank_, -1, "bad rank/world");
  if (options_.heap_bytes < ReservedLayout::bytes(world_) + 4096)
    throw Error(Status::kInvalidArgument, "communicator.init", rank_, -1, "heap_bytes too small");
  if (options_.timeout_s <= 0)
    throw Error(Status::kInvalidArgument, "communicator.init", rank_, -1, "timeout_s must be positive");
  prefix_ = "tandem/comm" + std::to_string(g_comm_counter.fetch_add(1));
  // A throwing constructor runs no destructor, and the members alone would come down in the wrong order
  // (e.g. with the proxy thread still running): on any failure, release everything of this rank here.
  try {
    setup();
  } catch (...) {
    abort();  // a proxy thread or monitor callback still running sees the flag, not freed memory
    release_local();
    throw;
  }
}

void Communicator::setup() {
  if (options_.device >= 0) TANDEM_CUDA_CHECK(cudaSetDevice(options_.device), "communicator.init", rank_);
  TANDEM_CUDA_CHECK(cudaGetDevice(&device_), "communicator.init", rank_);
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_),
                    "communicator.init", rank_);

  detect_topology();
  // Only this job's ranks know it: the fd exchange, the peer monitor and the TCP proxy refuse anyone else.
  const std::string secret = job_secret(*bootstrap_, prefix_);

  // Heap backend: chosen collectively so that every rank of a node runs the same exchange. The heap size is
  // compared in the same round: symmetric offsets mean nothing between heaps of different sizes.
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000));
  bool want_vmm = options_.heap != HeapKind::kIpc && vmm_heap_supported(device_);
  if (options_.heap == HeapKind::kVmm && !want_vmm)
    throw Error(Status::kUnsupported, "heap.vmm", rank_, -1,
                "cuMem VMM with POSIX fd handles is not available on this device/driver");
  const auto votes =
      bootstrap_->all_gather(next_tag("heapkind"), std::string(want_vmm ? "1" : "0") + " " + std::to_string(options_.heap_bytes));
  for (int r = 0; r < world_; ++r) {
    const auto& v = votes[r];
    want_vmm = want_vmm && v.rfind("1 ", 0) == 0;
    const std::string theirs = v.size() > 2 ? v.substr(2) : "?";
    if (theirs != std::to_string(options_.heap_bytes))
      throw Error(Status::kInvalidArgument, "communicator.init", rank_, r,
                  "heap_bytes is " + std::to_string(options_.heap_bytes) + " on rank " + std::to_string(rank_) +
                      " but " + theirs + " on rank " + std::to_string(r) + ": every rank must ask for the same size");
  }
  HeapSetup setup{bootstrap_.get(), next_tag("heap"), rank_, world_, local_ranks_, device_,
                  options_.heap_bytes, timeout, secret};
  heap_ = want_vmm ? make_vmm_heap(setup) : make_ipc_heap(setup);

  const uint64_t reserved = ReservedLayout::bytes(world_);
  allocator_ = std::make_unique<RangeAllocator>(reserved, heap_->bytes());

  peer_heap_host_.assign(world_, 0);
  for (int r = 0; r < world_; ++r) {
    peer_heap_host_[r] = reinterpret_cast<uint64_t>(heap_->peer_base(r));
    if (peer_heap_host_[r] & kPeerSameDeviceBit)
      throw Error(Status::kInternal, "communicator.init", rank_, r, "peer heap not aligned");
    if (peer_heap_host_[r] != 0 && same_device_[r]) peer_heap_host_[r] |= kPeerSameDeviceBit;
  }
  TANDEM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&peer_heap_dev_), sizeof(uint64_t) * world_), "communicator.init", rank_);
  TANDEM_CUDA_CHECK(cudaMemcpy(peer_heap_dev_, peer_heap_host_.data(), sizeof(uint64_t) * world_,
                               cudaMemcpyHostToDevice),
                    "communicator.init", rank_);

  TANDEM_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&abort_host_), sizeof(int32_t), cudaHostAllocMapped),
                    "communicator.init", rank_);
  TANDEM_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&error_host_), sizeof(ErrorRecord), cudaHostAllocMapped),
                    "communicator.init", rank_);
  *abort_host_ = 0;
  std::memset(error_host_, 0, sizeof(ErrorRecord));
  void* abort_dev = nullptr;
  void* error_dev = nullptr;
  TANDEM_CUDA_CHECK(cudaHostGetDevicePointer(&abort_dev, abort_host_, 0), "communicator.init", rank_);
  TANDEM_CUDA_CHECK(cudaHostGetDevicePointer(&error_dev, error_host_, 0), "communicator.init", rank_);

  device_comm_.rank = rank_;
  device_comm_.world = world_;
  device_comm_.heap_base = heap_->local_base();
  device_comm_.heap_bytes = heap_->bytes();
  device_comm_.peer_heap = peer_heap_dev_;
  for (int r = 0; r < world_ && r < kInlinePeerHeaps; ++r) device_comm_.peer_heap_inline[r] = peer_heap_host_[r];
  device_comm_.abort_flag = static_cast<volatile int32_t*>(abort_dev);
  device_comm_.error = static_cast<ErrorRecord*>(error_dev);
  device_comm_.timeout_ns = static_cast<uint64_t>(options_.timeout_s * 1e9);

  if (num_nodes_ > 1) setup_proxy(timeout, secret);
  if (proxy::fault_injected("TANDEM_TEST_FAIL_AFTER_PROXY", rank_))  // tests of the failure path below
    throw Error(Status::kInternal, "communicator.init", rank_, -1,
                "fault injected after the proxy started (TANDEM_TEST_FAIL_AFTER_PROXY)");

  // A local peer that dies raises our abort flag at once: no device wait has to run into its timeout, and no
  // kernel of ours goes on storing into memory its death may have released (MPS frees a dead client's).
  monitor_ = std::make_unique<detail::PeerMonitor>(*bootstrap_, next_tag("monitor"), rank_, local_ranks_, timeout,
                                                   [this](int) { abort(); }, secret);

  // Every heap is zeroed and mapped before any rank may write into a peer's.
  host_barrier();
}

ScopedDevice::ScopedDevice(int device) {
  if (device < 0) return;
  const auto& api = detail::driver_api();
  CUcontext ctx = nullptr;
  if (api.cuCtxGetCurrent != nullptr && api.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx == nullptr) {
    // A thread without a context (a finalizer's, say): take ours, and leave none behind. "Restoring" its default
    // device 0 would create a context on GPU 0 (cudaSetDevice does since CUDA 12) in a rank that runs elsewhere.
    if (cudaSetDevice(device) == cudaSuccess) clear_after_ = true;
    return;
  }
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current == device) return;
  if (cudaSetDevice(device) == cudaSuccess) previous_ = current;
}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0) {
    cudaSetDevice(previous_);
  } else if (clear_after_) {
    const auto& api = detail::driver_api();
    if (api.cuCtxSetCurrent != nullptr) api.cuCtxSetCurrent(nullptr);
  }
}

Communicator::~Communicator() {
  try {
    destroy();
  } catch (...) {
  }
}

std::string Communicator::next_tag(const char* what) {
  return prefix_ + "/" + what + std::to_string(tag_counter_++);
}

void Communicator::detect_topology() {
  cudaDeviceProp prop{};
  TANDEM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_), "communicator.topology", rank_);
  const std::string uuid(reinterpret_cast<const char*>(prop.uuid.bytes), sizeof(prop.uuid.bytes));
  const std::string me = host_identity();
  const auto hosts = bootstrap_->all_gather(next_tag("host"), me);
  const auto gpus = bootstrap_->all_gather(next_tag("gpu"), uuid);
  same_device_.assign(world_, false);
  for (int r = 0; r < world_; ++r) same_device_[r] = hosts[r] == me && gpus[r] == uuid;
  spans_hosts_ = false;
  for (int r = 0; r < world_; ++r) spans_hosts_ = spans_hosts_ || hosts[r] != me;
  std::map<std::string, int> node_of_host;
  std::vector<int> node(world_);
  for (int r = 0; r < world_; ++r) {
    auto it = node_of_host.emplace(hosts[r], static_cast<int>(node_of_host.size())).first;
    node[r] = it->second;
  }
  if (options_.ranks_per_node > 0) {
    const int rpn = options_.ranks_per_node;
    if (world_ % rpn != 0)
      throw Error(Status::kInvalidArgument, "communicator.topology", rank_, -1,
                  "world " + std::to_string(world_) + " is not a multiple of ranks_per_node " + std::to_string(rpn));
    for (int r = 0; r < world_; ++r) {
      if (hosts[r] != hosts[r / rpn * rpn])
        throw Error(Status::kInvalidArgument, "communicator.topology", rank_, r,
                    "emulated node groups ranks of different hosts");
    }
    for (int r = 0; r < world_; ++r) node[r] = r / rpn;
  }
  node_ = node[rank_];
  node_of_rank_ = node;
  num_nodes_ = 1 + *std::max_element(node.begin(), node.end());
  local_ranks_.clear();
  for (int r = 0; r < world_; ++r)
    if (node[r] == node_) local_ranks_.push_back(r);
  // This node's peers on other GPUs get their heaps mapped here (load/store over NVLink or PCIe): their GPU must
  // be visible to this process and reachable peer to peer, or the import fails later with a bare CUDA error.
  int count = 0;
  TANDEM_CUDA_CHECK(cudaGetDeviceCount(&count), "communicator.topology", rank_);
  std::vector<std::string> visible(count);
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    TANDEM_CUDA_CHECK(cudaGetDeviceProperties(&p, d), "communicator.topology", rank_);
    visible[d] = std::string(reinterpret_cast<const char*>(p.uuid.bytes), sizeof(p.uuid.bytes));
  }
  // Ranks sharing a GPU while others sit idle is a placement mistake (every rank took the current device: no
  // LOCAL_RANK or TANDEM_DEVICE), not MPS by design: say so once, from the lowest such rank.
  int sharing = 0;
  for (int r : local_ranks_) sharing += gpus[r] == uuid ? 1 : 0;
  if (sharing > 1 && count >= static_cast<int>(local_ranks_.size()) && rank_ == *std::find_if(
          local_ranks_.begin(), local_ranks_.end(), [&](int r) { return gpus[r] == uuid; }))
    std::fprintf(stderr,
                 "tandem: rank %d: warning: %d ranks of this host share one GPU (device %d) while %d GPUs are "
                 "visible; if that is not meant (MPS), give each rank its GPU: LOCAL_RANK or TANDEM_DEVICE, or "
                 "Communicator(device=...)\n",
                 rank_, sharing, device_, count);
  for (int r : local_ranks_) {
    if (gpus[r] == uuid) continue;
    const auto it = std::find(visible.begin(), visible.end(), gpus[r]);
    if (it == visible.end())
      throw Error(Status::kUnreachablePeer, "communicator.topology", rank_, r,
                  "rank " + std::to_string(r) + "'s GPU on this host is not visible to this process "
                  "(CUDA_VISIBLE_DEVICES?): tandem maps the memory of a node's ranks directly, so every rank must "
                  "see every GPU of its node (or set TANDEM_RANKS_PER_NODE so that such ranks are separate nodes)");
    int can = 0;
    TANDEM_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device_, static_cast<int>(it - visible.begin())),
                      "communicator.topology", rank_);
    if (!can)
      throw Error(Status::kUnreachablePeer, "communicator.topology", rank_, r,
                  "no peer-to-peer path from this GPU (device " + std::to_string(device_) + ") to rank " +
                      std::to_string(r) + "'s (device " + std::to_string(it - visible.begin()) +
                      "): the ranks of a node must reach each other's memory (NVLink or PCIe P2P); set "
                      "TANDEM_RANKS_PER_NODE to make them separate nodes (proxy path)");
  }
}

int Communicator::uniform_ranks_per_node() const {
  if (num_nodes_ < 1 || world_ % num_nodes_) return 0;
  const int l = world_ / num_nodes_;
  for (int r = 0; r < world_; ++r)
    if (node_of_rank_[r] != r / l) return 0;
  return l;
}

int Communicator::local_rank() const {
  for (size_t i = 0; i < local_ranks_.size(); ++i)
    if (local_ranks_[i] == rank_) return static_cast<int>(i);
  return -1;
}

const char* Communicator::heap_kind() const { return heap_ ? heap_->kind() : "none"; }
void* Communicator::heap_base() const { return heap_ ? heap_->local_base() : nullptr; }
uint64_t Communicator::heap_bytes() const { return heap_ ? heap_->bytes() : 0; }
uint64_t Communicator::heap_bytes_in_use() const { return allocator_ ? allocator_->bytes_in_use() : 0; }

void Communicator::require_live(const char* op) const {
  if (destroyed_ || !heap_) throw Error(Status::kInvalidArgument, op, rank_, -1, "communicator destroyed");
}

void* Communicator::alloc(uint64_t bytes, uint64_t align, bool verify) {
  require_live("heap.alloc");
  if (align < 16 || (align & (align - 1)) != 0)
    throw Error(Status::kInvalidArgument, "heap.alloc", rank_, -1, "align must be a power of two >= 16");
  const auto off = allocator_->allocate(bytes, align);
  if (!off)
    throw Error(Status::kOutOfMemory, "heap.alloc", rank_, -1,
                "symmetric heap exhausted: asked " + std::to_string(bytes) + " bytes, largest free range " +
                    std::to_string(allocator_->largest_free()) + " of " + std::to_string(heap_->bytes()) +
                    " (raise heap_bytes)");
  if (verify && world_ > 1) {
    // Offset and size: equal offsets with different sizes would still let a rank write past a peer's buffer.
    const std::string mine = std::to_string(*off) + " " + std::to_string(bytes);
    const auto all = bootstrap_->all_gather(next_tag("alloc"), mine);
    for (int r = 0; r < world_; ++r) {
      if (all[r] != mine) {
        allocator_->release(*off);
        const auto sp = all[r].find(' ');
        const std::string their_off = all[r].substr(0, sp);
        const std::string their_bytes = sp == std::string::npos ? "?" : all[r].substr(sp + 1);
        throw Error(Status::kInvalidArgument, "heap.alloc", rank_, r,
                    "symmetric allocation of " + std::to_string(bytes) + " bytes at offset " + std::to_string(*off) +
                        " on rank " + std::to_string(rank_) + " but of " + their_bytes + " bytes at offset " +
                        their_off + " on rank " + std::to_string(r) +
                        ": ranks allocated different sizes, or allocated or freed out of step");
      }
    }
  }
  return heap_->local_base() + *off;
}

void Communicator::free(void* ptr) {
  if (ptr == nullptr || destroyed_) return;
  const char* p = static_cast<const char*>(ptr);
  const char* base = heap_->local_base();
  if (p < base || p >= base + heap_->bytes() ||
      !allocator_->release(static_cast<uint64_t>(p - base)))
    throw Error(Status::kInvalidArgument, "heap.free", rank_, -1, "pointer is not a live symmetric allocation");
}

void* Communicator::peer_ptr(const void* sym, int peer) const {
  require_live("peer_ptr");
  if (peer < 0 || peer >= world_) throw Error(Status::kInvalidArgument, "peer_ptr", rank_, peer, "no such rank");
  const char* p = static_cast<const char*>(sym);
  const char* base = heap_->local_base();
  if (p < base || p >= base + heap_->bytes())
    throw Error(Status::kInvalidArgument, "peer_ptr", rank_, peer, "address is not in the symmetric heap");
  char* pb = heap_->peer_base(peer);
  return pb == nullptr ? nullptr : pb + (p - base);
}

void Communicator::abort() {
  if (abort_host_ != nullptr) {
    *reinterpret_cast<volatile int32_t*>(abort_host_) = 1;
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
}

bool Communicator::aborted() const {
  return abort_host_ != nullptr && *reinterpret_cast<volatile int32_t*>(abort_host_) != 0;
}

std::optional<DeviceError> Communicator::async_error() const {
  if (error_host_ == nullptr) return std::nullopt;
  const int32_t status = error_host_->status;
  if (status == 0) return std::nullopt;
  std::atomic_thread_fence(std::memory_order_acquire);
  DeviceError e{static_cast<Status>(status),
                static_cast<DeviceOp>(error_host_->op),
                error_host_->rank,
                error_host_->peer,
                error_host_->expected,
                error_host_->observed,
                error_host_->elapsed_ns,
                error_host_->block,
                error_host_->thread};
  return e;
}

void Communicator::setup_proxy(std::chrono::milliseconds timeout, const std::string& secret) {
  using namespace proxy;
  const uint32_t cap = options_.proxy_capacity;
  if (cap == 0 || (cap & (cap - 1)) != 0)
    throw Error(Status::kInvalidArgument, "communicator.proxy", rank_, -1, "proxy_capacity must be a power of two");
  TANDEM_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&ring_host_), sizeof(Command) * cap, cudaHostAllocMapped),
                    "communicator.proxy", rank_);
  TANDEM_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&ctl_host_), sizeof(QueueControl), cudaHostAllocMapped),
                    "communicator.proxy", rank_);
  std::memset(static_cast<void*>(ring_host_), 0, sizeof(Command) * cap);
  std::memset(static_cast<void*>(ctl_host_), 0, sizeof(QueueControl));
  TANDEM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&tail_dev_), sizeof(unsigned long long)), "communicator.proxy",
                    rank_);
  TANDEM_CUDA_CHECK(cudaMemset(tail_dev_, 0, sizeof(unsigned long long)), "communicator.proxy", rank_);
  void* ring_dev = nullptr;
  void* ctl_dev = nullptr;
  TANDEM_CUDA_CHECK(cudaHostGetDevicePointer(&ring_dev, ring_host_, 0), "communicator.proxy", rank_);
  TANDEM_CUDA_CHECK(cudaHostGetDevicePointer(&ctl_dev, ctl_host_, 0), "communicator.proxy", rank_);

  queue_ = std::make_unique<CommandQueue>(cap, rank_, ring_host_, ctl_host_);
  // Kernels see the queue only once something drains it.
  const auto publish_to_device = [&] {
    device_comm_.proxy_slots = static_cast<Command*>(ring_dev);
    device_comm_.proxy_ctl = static_cast<QueueControl*>(ctl_dev);
    device_comm_.proxy_tail = tail_dev_;
    device_comm_.proxy_capacity = cap;
  };
  if (options_.external_proxy) {  // the caller drains queue_ (command_queue())
    publish_to_device();
    return;
  }
  std::vector<int> peers;
  for (int r = 0; r < world_; ++r)
    if (r == rank_ || node_of_rank_[r] != node_) peers.push_back(r);
  TcpOptions o;
  o.listen_host = options_.proxy_host;
  if (o.listen_host.empty()) {
    const char* env = std::getenv("TANDEM_PROXY_HOST");
    if (env != nullptr && *env != 0) {
      o.listen_host = env;
    } else if (!spans_hosts_) {
      o.listen_host = "127.0.0.1";  // emulated nodes: every peer is on this host
    } else {
      // Peers on other hosts cannot reach loopback: take this host's routable address, or say so now rather
      // than after the connect timeout.
      std::string why;
      o.listen_host = routable_ipv4(&why);
      if (o.listen_host.empty())
        throw Error(Status::kInvalidArgument, "communicator.proxy", rank_, -1,
                    "ranks of this job run on other hosts, and no address for this rank's proxy was given or found: " +
                        why + "; set TANDEM_PROXY_HOST (or proxy_host=) to an IPv4 address of this host that the "
                        "other hosts reach");
    }
  }
  o.timeout = timeout;
  o.secret = secret;
  service_ = std::make_unique<ProxyService>(
      *bootstrap_, next_tag("proxy"), rank_, peers, *queue_,
      std::make_unique<CudaMemoryDomain>(heap_->local_base(), heap_->bytes(), device_), o, [this] { abort(); });
  publish_to_device();
}

void Communicator::teardown_proxy() {
  service_.reset();  // proxy thread, then backend threads, then the domain (ProxyService::close)
  queue_.reset();
  if (ring_host_ != nullptr) cudaFreeHost(ring_host_);
  if (ctl_host_ != nullptr) cudaFreeHost(ctl_host_);
  if (tail_dev_ != nullptr) cudaFree(tail_dev_);
  ring_host_ = nullptr;
  ctl_host_ = nullptr;
  tail_dev_ = nullptr;
}

const char* Communicator::proxy_backend() const {
  if (service_) return service_->backend()->name();
  return queue_ ? "external" : "none";
}

int Communicator::export_heap_dmabuf(std::string* why) const {
  require_live("export_heap_dmabuf");
  const auto& api = detail::driver_api();
  if (api.cuMemGetHandleForAddressRange == nullptr) {
    if (why) *why = "the CUDA driver has no cuMemGetHandleForAddressRange";
    return -1;
  }
  int fd = -1;
  const CUresult r = api.cuMemGetHandleForAddressRange(
      &fd, static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(heap_->local_base())), heap_->bytes(),
      CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (r != CUDA_SUCCESS) {
    if (why) *why = "cuMemGetHandleForAddressRange(DMA_BUF_FD) failed with CUresult " + std::to_string(static_cast<int>(r));
    return -1;
  }
  return fd;
}

int Communicator::exited_peer() const { return monitor_ ? monitor_->exited_peer() : -1; }

std::optional<ErrorInfo> Communicator::first_error() const noexcept {
  try {
    auto make = [this](Status st, std::string op, int rank, int peer, const std::string& detail) {
      return ErrorInfo{st, op, rank, peer, detail, format_error_message(st, op, rank, peer, detail)};
    };
    if (const int p = exited_peer(); p >= 0)
      return make(Status::kPeerExited, "peer_exit", rank_, p,
                  "peer process exited without destroying its communicator; device waits were aborted");
    if (service_) {
      int peer = -1;
      std::string what;
      if (const Status s = service_->proxy()->status(&peer, &what); s != Status::kOk)
        return make(s, "proxy", rank_, peer, "the proxy stopped: " + what);
    }
    if (auto e = async_error()) return make(e->status, device_op_name(e->op), e->rank, e->peer, e->message());
    if (aborted()) return make(Status::kAborted, "communicator", rank_, -1, "the communicator was aborted");
  } catch (...) {  // allocation failure while formatting: report without detail
    return ErrorInfo{Status::kInternal, "check", rank_, -1, "", "tandem: error while reporting an error"};
  }
  return std::nullopt;
}

void Communicator::check() const {
  if (auto e = first_error()) throw Error(e->status, e->op, e->rank, e->peer, e->detail);
}

void Communicator::host_barrier() {
  require_live("host_barrier");
  bootstrap_->barrier(next_tag("barrier"));
}

void Communicator::destroy() {
  if (destroyed_) return;
  destroyed_ = true;
  ScopedDevice on_our_device(device_);  // destroy() may run on any thread (finalizers)
  cudaDeviceSynchronize();  // every wait is bounded, so this returns
  // Teardown is collective only where it must be, and never after a failure (a peer may be gone):
  //  * VMM heap: every importer holds its own reference to our physical memory, so releasing ours can neither
  //    fault a peer nor hand the memory to someone else while a peer still writes. Nothing to wait for.
  //  * cudaIpc heap: the export dies with cudaFree, so meet the peers first.
  //  * proxy: deliver what our GPU enqueued, then meet the remote peers (they may still be sending to us)
  //    before the proxy stops.
  if (service_ && !aborted() && !async_error() && service_->proxy()->status() == Status::kOk) {
    unsigned long long issued = 0;
    if (cudaMemcpy(&issued, tail_dev_, sizeof(issued), cudaMemcpyDeviceToHost) == cudaSuccess) {
      try {
        queue_->wait_retired(issued, std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000)));
      } catch (const Error&) {
      }
    }
  }
  if ((service_ || std::string(heap_kind()) == "ipc") && !aborted() && !async_error()) {
    try {  // a store failure here only means a peer left first; teardown goes on
      bootstrap_->barrier(next_tag("barrier"));
    } catch (...) {
    }
  }
  release_local();
}

// In dependency order: the proxy (its thread calls abort(), so before abort_host_) and the monitor (its
// callback too), then the heap the proxy's domain points into, then the rest.
void Communicator::release_local() noexcept {
  ScopedDevice on_our_device(device_);
  teardown_proxy();
  monitor_.reset();  // says goodbye: peers do not mistake this for a crash
  heap_.reset();
  allocator_.reset();
  if (peer_heap_dev_ != nullptr) cudaFree(peer_heap_dev_);
  if (abort_host_ != nullptr) cudaFreeHost(abort_host_);
  if (error_host_ != nullptr) cudaFreeHost(error_host_);
  peer_heap_dev_ = nullptr;
  abort_host_ = nullptr;
  error_host_ = nullptr;
  device_comm_ = DeviceComm{};
}

}  // namespace tandem
