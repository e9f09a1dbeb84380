#include "peer_monitor.h"
#include "unix_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
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

// Unauthenticated connections held at once (each for at most kLocalHandshake); more are closed at once.
constexpr size_t kMaxPending = 16;

}  // namespace

PeerMonitor::PeerMonitor(Bootstrap& bootstrap, const std::string& tag, int rank,
                         const std::vector<int>& local_ranks, std::chrono::milliseconds timeout,
                         std::function<void(int)> on_exit, const std::string& secret)
    : rank_(rank), secret_(secret), local_ranks_(local_ranks), on_exit_(std::move(on_exit)) {
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
  for (const Pending& p : pending_) ::close(p.fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int fd : wake_)
    if (fd >= 0) ::close(fd);
  accepted_.clear();
  accepted_peer_.clear();
  outgoing_.clear();
  pending_.clear();
  listen_fd_ = wake_[0] = wake_[1] = -1;
}

void PeerMonitor::setup(Bootstrap& bootstrap, const std::string& tag, int rank, const std::vector<int>& local_ranks,
                        std::chrono::milliseconds timeout) {
  // Every rank of the node listens, publishes its pid, then connects to every peer and says who it is.
  const std::string session = node_session(bootstrap, tag, rank, local_ranks);
  listen_fd_ = listen_abstract_unix(monitor_name(session, rank));
  if (listen_fd_ < 0) fail("listen", rank, -1);
  if (::pipe2(wake_, O_CLOEXEC) != 0) fail("pipe", rank, -1);
  bootstrap.set(tag + "/listening/" + std::to_string(rank), local_identity());
  identity_.assign(local_ranks.size(), "");
  for (size_t i = 0; i < local_ranks.size(); ++i)
    if (local_ranks[i] != rank) identity_[i] = bootstrap.get(tag + "/listening/" + std::to_string(local_ranks[i]));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const LocalHello hello = make_local_hello(rank, secret_);
  for (size_t i = 0; i < local_ranks.size(); ++i) {
    const int peer = local_ranks[i];
    if (peer == rank) continue;
    const int s = connect_abstract_unix(monitor_name(session, peer), deadline);
    if (s < 0) {
      if (errno == ETIMEDOUT) throw Error(Status::kTimeout, "peer_monitor", rank, peer, "cannot connect to peer");
      fail("connect", rank, peer);
    }
    outgoing_.push_back(s);  // closed by close_all() if anything below throws
    outgoing_peer_.push_back(peer);
    // Our secret goes only to the process that published itself as `peer`.
    if (std::string why = check_peer_credentials(s, identity_[i]); !why.empty())
      throw Error(Status::kSystemError, "peer_monitor", rank, peer, "the listener is not that rank: " + why);
    if (::send(s, &hello, sizeof(hello), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(hello))) fail("send", rank, peer);
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

void PeerMonitor::refuse(int fd, const std::string& why) {
  // counted before the close: whoever sees the connection end (the refused process, a test) and then reads
  // refused() must find it counted (CI, 2026-12-06: a report read right after the last stray saw its close
  // missed one refusal)
  const int refused_so_far = refused_.fetch_add(1, std::memory_order_acq_rel);
  ::close(fd);
  log_refused("peer_monitor", rank_, why, refused_so_far);
}

void PeerMonitor::on_connection() {
  const int s = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (s < 0) return;
  if (std::string why = check_peer_credentials(s, ""); !why.empty()) return refuse(s, why);
  if (pending_.size() >= kMaxPending) return refuse(s, "too many connections without a hello");
  Pending p{};
  p.fd = s;
  p.deadline = std::chrono::steady_clock::now() + kLocalHandshake;
  pending_.push_back(p);
}

void PeerMonitor::on_hello_bytes(size_t i) {
  Pending& p = pending_[i];
  const ssize_t k = ::recv(p.fd, p.hello + p.got, sizeof(LocalHello) - p.got, MSG_DONTWAIT);
  if (k < 0 && (errno == EAGAIN || errno == EINTR)) return;
  const int fd = p.fd;
  if (k <= 0) {
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    return refuse(fd, "closed before its hello");
  }
  p.got += static_cast<size_t>(k);
  if (p.got < sizeof(LocalHello)) return;
  LocalHello h{};
  std::memcpy(&h, p.hello, sizeof(h));
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
  if (!local_hello_valid(h, secret_)) return refuse(fd, "bad hello or wrong job secret");
  const auto it = std::find(local_ranks_.begin(), local_ranks_.end(), h.rank);
  if (h.rank == rank_ || it == local_ranks_.end())
    return refuse(fd, "rank " + std::to_string(h.rank) + " is not a local peer");
  if (std::find(accepted_peer_.begin(), accepted_peer_.end(), h.rank) != accepted_peer_.end())
    return refuse(fd, "rank " + std::to_string(h.rank) + " is already connected");
  if (accepted_.size() + 1 >= local_ranks_.size()) return refuse(fd, "every local peer is already connected");
  if (std::string why = check_peer_credentials(fd, identity_[static_cast<size_t>(it - local_ranks_.begin())]);
      !why.empty())
    return refuse(fd, "claims rank " + std::to_string(h.rank) + " but " + why);
  accepted_.push_back(fd);
  accepted_peer_.push_back(h.rank);
  accepted_count_.fetch_add(1, std::memory_order_acq_rel);
}

void PeerMonitor::run() {
  std::vector<bool> watching(outgoing_.size(), true);
  while (!stop_.load()) {
    // Connections that did not complete their hello in time are refused.
    const auto now = std::chrono::steady_clock::now();
    int wait_ms = 1000;
    for (size_t i = 0; i < pending_.size();) {
      if (pending_[i].deadline <= now) {
        const int fd = pending_[i].fd;
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
        refuse(fd, "no hello within " + std::to_string(kLocalHandshake.count()) + " ms");
        continue;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(pending_[i].deadline - now).count();
      wait_ms = std::min<int>(wait_ms, static_cast<int>(left) + 1);
      ++i;
    }
    std::vector<pollfd> fds;
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    std::vector<size_t> which;
    for (size_t i = 0; i < outgoing_.size(); ++i) {
      if (!watching[i]) continue;
      fds.push_back({outgoing_[i], POLLIN, 0});
      which.push_back(i);
    }
    const size_t first_pending = fds.size();
    for (const Pending& p : pending_) fds.push_back({p.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), wait_ms) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    // Pending hellos first (indices shift as entries leave: walk backwards), then new connections.
    for (size_t k = pending_.size(); k-- > 0;)
      if (fds[first_pending + k].revents) on_hello_bytes(k);
    if (fds[1].revents & POLLIN) on_connection();
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
