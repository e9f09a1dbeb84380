#include "peer_monitor.h"
#include "unix_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "tandem/transport/status.h"

namespace tandem::detail {

namespace {

std::string monitor_name(const std::string& session, int rank) {
  return "tandem.mon." + session + "." + std::to_string(rank);
}

[[noreturn]] void fail(const char* what, int rank, int peer) {
  throw Error(Status::kSystemError, "peer_monitor", rank, peer, std::string(what) + ": " + std::strerror(errno));
}

}  // namespace

PeerMonitor::PeerMonitor(Bootstrap& bootstrap, const std::string& tag, int rank,
                         const std::vector<int>& local_ranks, std::chrono::milliseconds timeout,
                         std::function<void(int)> on_exit)
    : rank_(rank), on_exit_(std::move(on_exit)) {
  if (local_ranks.size() <= 1) return;
  try {
    setup(bootstrap, tag, rank, local_ranks, timeout);
  } catch (...) {
    close_all();  // a throwing constructor runs no destructor
    throw;
  }
  thread_ = std::thread([this] { run(); });
}

void PeerMonitor::close_all() {
  for (int fd : accepted_) ::close(fd);
  for (int fd : outgoing_) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int fd : wake_)
    if (fd >= 0) ::close(fd);
  accepted_.clear();
  outgoing_.clear();
  listen_fd_ = wake_[0] = wake_[1] = -1;
}

void PeerMonitor::setup(Bootstrap& bootstrap, const std::string& tag, int rank, const std::vector<int>& local_ranks,
                        std::chrono::milliseconds timeout) {
  // Every rank of the node listens, then connects to every peer.
  const std::string session = node_session(bootstrap, tag, rank, local_ranks);
  listen_fd_ = listen_abstract_unix(monitor_name(session, rank));
  if (listen_fd_ < 0) fail("listen", rank, -1);
  if (::pipe2(wake_, O_CLOEXEC) != 0) fail("pipe", rank, -1);
  bootstrap.set(tag + "/listening/" + std::to_string(rank), "");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int peer : local_ranks) {
    if (peer == rank) continue;
    bootstrap.get(tag + "/listening/" + std::to_string(peer));
    const int s = connect_abstract_unix(monitor_name(session, peer), deadline);
    if (s < 0) {
      if (errno == ETIMEDOUT) throw Error(Status::kTimeout, "peer_monitor", rank, peer, "cannot connect to peer");
      fail("connect", rank, peer);
    }
    outgoing_.push_back(s);
    outgoing_peer_.push_back(peer);
  }
}

PeerMonitor::~PeerMonitor() {
  stop_.store(true);
  if (wake_[1] >= 0) {
    const char c = 'x';
    (void)!::write(wake_[1], &c, 1);
  }
  if (thread_.joinable()) thread_.join();
  const char bye = 'B';
  for (int fd : accepted_) (void)!::send(fd, &bye, 1, MSG_NOSIGNAL);
  close_all();
}

void PeerMonitor::run() {
  std::vector<bool> watching(outgoing_.size(), true);
  while (!stop_.load()) {
    std::vector<pollfd> fds;
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    std::vector<size_t> which;
    for (size_t i = 0; i < outgoing_.size(); ++i) {
      if (!watching[i]) continue;
      fds.push_back({outgoing_[i], POLLIN, 0});
      which.push_back(i);
    }
    if (::poll(fds.data(), fds.size(), 1000) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      const int s = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (s >= 0) accepted_.push_back(s);
    }
    for (size_t k = 0; k < which.size(); ++k) {
      if (!fds[k + 2].revents) continue;
      const size_t i = which[k];
      char c = 0;
      const ssize_t n = ::recv(outgoing_[i], &c, 1, MSG_DONTWAIT);
      if (n == 1 && c == 'B') {
        watching[i] = false;  // the peer destroyed its communicator cleanly
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      watching[i] = false;
      int expected = -1;
      if (exited_.compare_exchange_strong(expected, outgoing_peer_[i], std::memory_order_acq_rel) && on_exit_)
        on_exit_(outgoing_peer_[i]);
    }
  }
}

}  // namespace tandem::detail
