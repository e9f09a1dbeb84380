// Liveness of the other processes of this node. Every rank keeps one unix-socket connection to every local
// peer; the kernel closes a process's sockets when it dies (kill -9 included), so a peer's death shows up
// here within milliseconds, long before any device timeout. A clean destroy says goodbye first ('B'), which
// is not a failure.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tandem/transport/bootstrap.h"

namespace tandem::detail {

// Who is served: only a connection from a process of our uid (and, where pids compare, the pid its claimed
// rank published) that sends the job secret and a local peer's rank within kLocalHandshake; at most one per
// peer and local_ranks - 1 in all. Anything else is closed and counted (unix_socket.h); it never counts as a
// peer, so a stray can neither hold a peer's place nor, by going away, look like a peer's death.
class PeerMonitor {
 public:
  // Collective over `local_ranks`. `on_exit(peer)` runs on the monitor thread when `peer` dies. `secret`: the
  // job secret (job_secret()).
  PeerMonitor(Bootstrap& bootstrap, const std::string& tag, int rank, const std::vector<int>& local_ranks,
              std::chrono::milliseconds timeout, std::function<void(int)> on_exit, const std::string& secret);
  ~PeerMonitor();  // says goodbye to every peer and stops the thread
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;
  // First peer seen dying, or -1.
  int exited_peer() const { return exited_.load(std::memory_order_acquire); }
  // Peers' connections authenticated so far / connections refused so far.
  int accepted() const { return accepted_count_.load(std::memory_order_acquire); }
  int refused() const { return refused_.load(std::memory_order_acquire); }

 private:
  struct Pending {  // a connection whose hello is not complete yet
    int fd;
    std::chrono::steady_clock::time_point deadline;
    size_t got;
    unsigned char hello[64];
  };
  void setup(Bootstrap& bootstrap, const std::string& tag, int rank, const std::vector<int>& local_ranks,
             std::chrono::milliseconds timeout);
  void close_all();
  void run();
  void on_connection();
  void on_hello_bytes(size_t i);
  void refuse(int fd, const std::string& why);
  int rank_;
  std::string secret_;
  std::vector<int> local_ranks_;
  std::vector<std::string> identity_;  // what each local rank published (local_identity()), by index in local_ranks_
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::vector<int> outgoing_;       // our connection to each peer (EOF = that peer died)
  std::vector<int> outgoing_peer_;  // peer rank of outgoing_[i]
  std::vector<int> accepted_;       // peers' connections to us (we hold them open; 'B' on destroy)
  std::vector<int> accepted_peer_;  // peer rank of accepted_[i]
  std::vector<Pending> pending_;    // at most kMaxPending
  std::atomic<int> accepted_count_{0};
  std::atomic<int> refused_{0};
  std::atomic<int> exited_{-1};
  std::atomic<bool> stop_{false};
  std::function<void(int)> on_exit_;
  std::thread thread_;
};

}  // namespace tandem::detail
