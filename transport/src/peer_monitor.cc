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

sockaddr_un monitor_address(const std::string& session, int rank, socklen_t* len) {
  return abstract_unix_address("tandem.mon." + session + "." + std::to_string(rank), len);
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
  // The node leader names the session; every rank listens, then connects to every peer.
  const std::string key = tag + "/session/" + std::to_string(local_ranks[0]);
  std::string session;
  if (rank == local_ranks[0]) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%d.%llx", static_cast<int>(::getpid()),
                  static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count()));
    session = buf;
    bootstrap.set(key, session);
  } else {
    session = bootstrap.get(key);
  }
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) fail("socket", rank, -1);
  socklen_t len = 0;
  sockaddr_un addr = monitor_address(session, rank, &len);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0) fail("bind", rank, -1);
  if (::listen(listen_fd_, 256) != 0) fail("listen", rank, -1);
  if (::pipe2(wake_, O_CLOEXEC) != 0) fail("pipe", rank, -1);
  bootstrap.set(tag + "/listening/" + std::to_string(rank), "");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int peer : local_ranks) {
    if (peer == rank) continue;
    bootstrap.get(tag + "/listening/" + std::to_string(peer));
    sockaddr_un pa = monitor_address(session, peer, &len);
    for (;;) {
      const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (s < 0) fail("socket", rank, peer);
      if (::connect(s, reinterpret_cast<sockaddr*>(&pa), len) == 0) {
        outgoing_.push_back(s);
        outgoing_peer_.push_back(peer);
        break;
      }
      ::close(s);
      if (std::chrono::steady_clock::now() > deadline)
        throw Error(Status::kTimeout, "peer_monitor", rank, peer, "cannot connect to peer");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  thread_ = std::thread([this] { run(); });
}

PeerMonitor::~PeerMonitor() {
  stop_.store(true);
  if (wake_[1] >= 0) {
    const char c = 'x';
    (void)!::write(wake_[1], &c, 1);
  }
  if (thread_.joinable()) thread_.join();
  const char bye = 'B';
  for (int fd : accepted_) {
    (void)!::send(fd, &bye, 1, MSG_NOSIGNAL);
    ::close(fd);
  }
  for (int fd : outgoing_) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int fd : wake_)
    if (fd >= 0) ::close(fd);
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
