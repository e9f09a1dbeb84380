// tandem transport — the inter-node path on the host: command queue, proxy thread, backends.
//
//   GPU/host producers --(CommandQueue, host memory)--> Proxy thread --(Backend: TCP | verbs)--> peer's Proxy
//   --> peer's MemoryDomain (its symmetric heap: GPU memory through CUDA copies, or host memory in tests)
//
// The remote side applies each command's data before its signal, so a waiter that sees the signal sees the
// data. Completion (the destination applied the command) comes back as an ack and advances `retired`.
#pragma once

#include <atomic>
#include <condition_variable>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tandem/transport/bootstrap.h"
#include "tandem/transport/proxy_command.h"
#include "tandem/transport/status.h"

namespace tandem::proxy {

// Where a rank's symmetric heap lives, as seen by its proxy.
class MemoryDomain {
 public:
  virtual ~MemoryDomain() = default;
  virtual uint64_t bytes() const = 0;
  virtual void read(uint64_t offset, void* dst, uint64_t n) = 0;         // heap -> host buffer
  virtual void write(uint64_t offset, const void* src, uint64_t n) = 0;  // host buffer -> heap, complete on return
  // Signal after every earlier write is visible (release): set or add a 64-bit flag.
  virtual void signal(uint64_t offset, uint64_t value, uint32_t op) = 0;

 protected:
  // Throw kInvalidArgument (naming `op`) unless [offset, offset + n) lies in the heap / the flag is 8-aligned.
  void check_range(uint64_t offset, uint64_t n, const char* op) const;
  void check_flag(uint64_t offset, const char* op) const;
};

// Host memory (tests, CPU-only ranks): plain copies, flags with release atomics.
class HostMemoryDomain final : public MemoryDomain {
 public:
  HostMemoryDomain(void* base, uint64_t bytes) : base_(static_cast<char*>(base)), bytes_(bytes) {}
  uint64_t bytes() const override { return bytes_; }
  void read(uint64_t offset, void* dst, uint64_t n) override;
  void write(uint64_t offset, const void* src, uint64_t n) override;
  void signal(uint64_t offset, uint64_t value, uint32_t op) override;

 private:
  char* base_;
  uint64_t bytes_;
};

// GPU memory (a rank's symmetric heap): CUDA copies on a private stream, completed before returning; a set
// signal is an 8-byte copy after the data, an add a read-modify-write of two 8-byte copies under a lock (no
// kernel: a persistent kernel waiting on the flag may hold every SM).
class CudaMemoryDomain final : public MemoryDomain {
 public:
  CudaMemoryDomain(void* base, uint64_t bytes, int device);
  ~CudaMemoryDomain() override;
  uint64_t bytes() const override { return bytes_; }
  void read(uint64_t offset, void* dst, uint64_t n) override;
  void write(uint64_t offset, const void* src, uint64_t n) override;
  void signal(uint64_t offset, uint64_t value, uint32_t op) override;

 private:
  void* stream();
  char* base_;
  uint64_t bytes_;
  int device_;
  std::mutex mu_;             // the proxy thread and the receive threads share the stream (and bounce_)
  static constexpr uint64_t kBounceBytes = 4ull << 20;  // one frame (kMaxFramePayload)
  char* bounce_ = nullptr;    // pinned staging of read/write (cuda_domain.cc says why)
  bool pageable_ = false;     // test hook TANDEM_TEST_PROXY_PAGEABLE_COPIES: no bounce buffer
  void* stream_ = nullptr;    // cudaStream_t
  uint64_t* pinned_ = nullptr;  // staging word for set signals
};

// Ring of commands in host memory (pinned and device-mapped when GPU producers use it).
class CommandQueue {
 public:
  // `capacity` a power of two. With `slots`/`control` null the queue allocates ordinary host memory.
  CommandQueue(uint32_t capacity, int rank = -1, Command* slots = nullptr, QueueControl* control = nullptr);
  ~CommandQueue();
  uint32_t capacity() const { return capacity_; }
  Command* slots() const { return slots_; }
  QueueControl* control() const { return control_; }

  // Host producer: take a ticket, wait for room (back-pressure, bounded by `timeout`), publish. Returns the
  // ticket. Throws kTimeout if the ring stays full, kAborted if the proxy stopped on an error.
  uint64_t push(const Command& c, std::chrono::milliseconds timeout);
  // Consumer (the proxy): the command of ticket `head` if published.
  bool peek(uint64_t ticket, Command* out) const;
  void release_until(uint64_t head);  // slots below `head` may be reused
  void retire_until(uint64_t retired);
  // The consumer stopped on a failure: producers and quiet raise kAborted naming `peer` from now on.
  void fail(Status status, int peer);
  uint64_t retired() const;
  uint64_t tail() const;
  // Host-side quiet: wait until every command pushed so far is complete at its destination.
  void wait_retired(uint64_t ticket_end, std::chrono::milliseconds timeout) const;

 private:
  uint32_t capacity_;
  int rank_;
  Command* slots_;
  QueueControl* control_;
  bool owns_ = false;
};

// A transport between this rank's proxy and its peers' proxies.
class Backend {
 public:
  using Ack = std::function<void(int peer, uint64_t ticket)>;
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Send one command with its payload (`data` holds cmd.bytes bytes for puts). May block for flow control.
  virtual void send(const Command& cmd, uint64_t ticket, const void* data) = 0;
  // Raise the first failure seen by the backend's threads (link lost, peer silent), if any.
  virtual void check() = 0;
  virtual void shutdown() = 0;
};

// Largest payload of one frame: the proxy cuts larger puts into frames of this size, and a receiver refuses
// (fails the link on) any frame that announces more, before it allocates or reads anything.
constexpr uint64_t kMaxFramePayload = 4ull << 20;

// The address the proxy listens on when none is given and the job spans hosts: the IPv4 address of this host's
// first interface that is up and is not loopback or a container/VM bridge (docker*, br-*, virbr*, veth*, cni*,
// flannel*), in the kernel's interface order. Empty if there is none; `why` then says what was seen.
std::string routable_ipv4(std::string* why = nullptr);

struct TcpOptions {
  std::string listen_host = "127.0.0.1";  // this rank's address (an interface the peers can reach)
  uint16_t listen_port = 0;               // 0 = any
  std::chrono::milliseconds timeout{10000};  // link dead after this long without traffic or progress
  std::string secret;  // the job secret (job_secret()); a connection whose hello lacks it is refused
};

// TCP: one persistent connection per peer pair (the lower rank connects). Frames: a Command header, then its
// payload; the receiver applies data, then the signal, then acks. Heartbeats every timeout/4 keep an idle link
// distinguishable from a dead one; TCP_USER_TIMEOUT bounds a blocked send.
//
// Who can connect: the listener is open only during setup, and takes a connection as rank r's only if its
// hello (read within a few seconds) carries the job secret and r is a remote peer of lower rank that has not
// connected yet. Anything else is closed and counted (refused()); setup goes on until every expected peer
// came or the timeout passed. Every frame is checked before it is applied: payload at most kMaxFramePayload,
// destination and flag inside this rank's heap.
class TcpBackend final : public Backend {
 public:
  TcpBackend(Bootstrap& bootstrap, const std::string& tag, int rank, const std::vector<int>& peers,
             MemoryDomain& local, const TcpOptions& options, Ack on_ack);
  ~TcpBackend() override;
  const char* name() const override { return "tcp"; }
  void send(const Command& cmd, uint64_t ticket, const void* data) override;
  void check() override;
  void shutdown() override;
  // Connections refused during setup (no/bad hello, wrong secret, unknown or duplicate rank).
  int refused() const { return refused_; }

 private:
  struct Link;
  void receive_loop(Link* link);
  void ack_loop();
  void heartbeat_loop();
  void fail(const Error& e);
  Link* link_for(int peer);
  std::string authenticate(int s, std::chrono::steady_clock::time_point deadline, Link** link);
  void check_frame(const Command& c, int peer) const;

  int rank_;
  int refused_ = 0;
  MemoryDomain& local_;
  TcpOptions options_;
  Ack on_ack_;
  std::vector<std::unique_ptr<Link>> links_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
  int wake_fd_ = -1;  // eventfd, written once by shutdown(): ends every receive thread's poll at once
  // Acks leave from their own thread: a receive thread that wrote them itself could block on a full socket
  // while the peer's receive thread blocks the same way (both sides sending large frames): a deadlock, seen on
  // the H200 with 2 emulated nodes x 2 ranks. Receive threads only read and apply, so every write completes.
  std::mutex acks_mu_;
  std::condition_variable acks_cv_;
  bool acks_due_ = false;
  std::mutex error_mu_;
  std::unique_ptr<Error> error_;  // first failure, rethrown by check()
};

// The proxy: drains one queue in ticket order, reads each command's payload from the local memory domain,
// hands it to the backend, and advances `retired` as acks come back (in ticket order).
class Proxy {
 public:
  Proxy(int rank, CommandQueue& queue, MemoryDomain& local);
  ~Proxy();
  // `on_error` runs on the proxy thread when it stops on a failure (the communicator raises its abort flag).
  void start(Backend* backend, std::function<void()> on_error = nullptr);
  void stop();
  // Called by the backend when `peer` acknowledged `ticket`.
  void on_ack(int peer, uint64_t ticket);
  // First error (status, peer, message) or kOk.
  Status status(int* peer = nullptr, std::string* what = nullptr) const;
  uint64_t retired() const { return queue_.retired(); }

 private:
  void run();
  int rank_;
  CommandQueue& queue_;
  MemoryDomain& local_;
  Backend* backend_ = nullptr;
  std::function<void()> on_error_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<uint64_t> acked_;  // bitmap-free window: ticket -> acked flag, indexed mod capacity
  uint64_t retired_ = 0;
  Status error_ = Status::kOk;
  int error_peer_ = -1;
  std::string error_what_;
};

// The proxy path of one rank (memory domain, proxy thread, TCP backend) as one unit that always comes down in
// a safe order, also when its own constructor or its owner's fails half-way: the proxy thread stops first (it
// calls the backend), then the backend's threads (they call the proxy's on_ack and write into the domain),
// then the objects themselves. Members alone would be destroyed backend first, under a running proxy thread.
class ProxyService {
 public:
  // Starts the proxy on `queue` (which must outlive this). `on_error` as for Proxy::start.
  ProxyService(Bootstrap& bootstrap, const std::string& tag, int rank, const std::vector<int>& peers,
               CommandQueue& queue, std::unique_ptr<MemoryDomain> domain, const TcpOptions& options,
               std::function<void()> on_error = nullptr);
  ~ProxyService();
  ProxyService(const ProxyService&) = delete;
  ProxyService& operator=(const ProxyService&) = delete;
  // Stop the proxy, shut the backend down, free both (idempotent; what the destructor does).
  void close() noexcept;
  Proxy* proxy() const { return proxy_.get(); }
  TcpBackend* backend() const { return backend_.get(); }

 private:
  std::unique_ptr<MemoryDomain> domain_;
  std::unique_ptr<Proxy> proxy_;
  std::unique_ptr<TcpBackend> backend_;
};

// Test-only fault injection: true if environment variable `name` is "all", or a comma-separated list of ranks
// that holds `rank`. Used by TANDEM_TEST_FAIL_AFTER_PROXY (fail a constructor once the proxy runs) and
// TANDEM_TEST_LATE_ACKS (the TCP ack thread sleeps 200 ms before each round of acks).
// TANDEM_TEST_PROXY_PAGEABLE_COPIES ("all"): CudaMemoryDomain copies without its pinned bounce buffer.
bool fault_injected(const char* name, int rank);

}  // namespace tandem::proxy
