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

class PeerMonitor {
 public:
  // Collective over `local_ranks`. `on_exit(peer)` runs on the monitor thread when `peer` dies.
  PeerMonitor(Bootstrap& bootstrap, const std::string& tag, int rank, const std::vector<int>& local_ranks,
              std::chrono::milliseconds timeout, std::function<void(int)> on_exit);
  ~PeerMonitor();  // says goodbye to every peer and stops the thread
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;
  // First peer seen dying, or -1.
  int exited_peer() const { return exited_.load(std::memory_order_acquire); }

 private:
  void setup(Bootstrap& bootstrap, const std::string& tag, int rank, const std::vector<int>& local_ranks,
             std::chrono::milliseconds timeout);
  void close_all();
  void run();
  int rank_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::vector<int> outgoing_;       // our connection to each peer (EOF = that peer died)
  std::vector<int> outgoing_peer_;  // peer rank of outgoing_[i]
  std::vector<int> accepted_;       // peers' connections to us (we hold them open; 'B' on destroy)
  std::atomic<int> exited_{-1};
  std::atomic<bool> stop_{false};
  std::function<void(int)> on_exit_;
  std::thread thread_;
};

}  // namespace tandem::detail
