#include "fd_passing.h"
#include "unix_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <thread>

#include "tandem/transport/status.h"

namespace tandem::detail {

namespace {

std::string socket_name(const std::string& session, int rank) {
  return "tandem." + session + "." + std::to_string(rank);
}

[[noreturn]] void sys_fail(const char* what, int rank, int peer) {
  throw Error(Status::kSystemError, "heap.fd_exchange", rank, peer,
              std::string(what) + ": " + std::strerror(errno));
}

void set_timeout(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// What travels with the descriptor: the server's rank under a magic, so the client can tell a reply of the
// rank it asked from anything else.
struct FdReply {
  uint32_t magic;
  int32_t rank;
};

void send_fd(int sock, int my_rank, int peer, int fd) {
  FdReply reply{kLocalHelloMagic, my_rank};
  msghdr msg{};
  iovec iov{&reply, sizeof(reply)};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  if (::sendmsg(sock, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(reply))) sys_fail("sendmsg", my_rank, peer);
}

int recv_fd(int sock, int my_rank, int expected_peer) {
  msghdr msg{};
  FdReply reply{};
  iovec iov{&reply, sizeof(reply)};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  if (n < 0) sys_fail("recvmsg", my_rank, expected_peer);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  int fd = -1;
  if (c != nullptr && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
      c->cmsg_len == CMSG_LEN(sizeof(int)))
    std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  if (n != static_cast<ssize_t>(sizeof(reply)) || reply.magic != kLocalHelloMagic || reply.rank != expected_peer ||
      fd < 0 || (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC))) {
    if (fd >= 0) ::close(fd);
    throw Error(Status::kSystemError, "heap.fd_exchange", my_rank, expected_peer,
                n == 0 ? "the peer closed the connection without sending its descriptor (it refused our hello: "
                         "different job secret or uid?)"
                       : "no valid descriptor received");
  }
  return fd;
}

}  // namespace

FdExchange::FdExchange(const std::string& session, int rank, std::chrono::milliseconds timeout)
    : session_(session), rank_(rank), timeout_(timeout) {
  listen_fd_ = listen_abstract_unix(socket_name(session_, rank_));
  if (listen_fd_ < 0) sys_fail("listen", rank, -1);
}

FdExchange::~FdExchange() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

// Empty if `s` is the peer it claims to be (then *peer is its rank); else why it is refused. Checks the uid
// before reading a byte, and reads the hello for at most kLocalHandshake.
std::string FdExchange::serve_one(int s, const std::vector<int>& local_ranks, const std::vector<int>& served,
                                  const std::string& secret, const std::map<int, std::string>& identities,
                                  std::chrono::steady_clock::time_point deadline, int* peer) {
  if (std::string why = check_peer_credentials(s, ""); !why.empty()) return why;
  LocalHello h{};
  const auto hs_deadline = std::min(deadline, std::chrono::steady_clock::now() + kLocalHandshake);
  if (!read_exact_until(s, &h, sizeof(h), hs_deadline))
    return "no hello within " + std::to_string(kLocalHandshake.count()) + " ms";
  if (!local_hello_valid(h, secret)) return "bad hello or wrong job secret";
  if (h.rank == rank_ || std::find(local_ranks.begin(), local_ranks.end(), h.rank) == local_ranks.end())
    return "rank " + std::to_string(h.rank) + " is not a local peer";
  if (std::find(served.begin(), served.end(), h.rank) != served.end())
    return "rank " + std::to_string(h.rank) + " was already served";
  const auto it = identities.find(h.rank);
  if (std::string why = check_peer_credentials(s, it == identities.end() ? "" : it->second); !why.empty())
    return "claims rank " + std::to_string(h.rank) + " but " + why;
  *peer = h.rank;
  return "";
}

std::map<int, int> FdExchange::run(const std::vector<int>& local_ranks, int my_fd, const std::string& secret,
                                   const std::map<int, std::string>& identities) {
  const int peers = static_cast<int>(local_ranks.size()) - 1;
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  // Serve our descriptor to every peer from a helper thread while this thread collects theirs. A failure on
  // either side is kept as it was thrown (status, peer, text) and rethrown once both are done.
  std::exception_ptr serve_error;
  std::thread server([&] {
    try {
      std::vector<int> served;
      while (static_cast<int>(served.size()) < peers) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                                std::chrono::steady_clock::now());
        pollfd p{listen_fd_, POLLIN, 0};
        if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0)
          throw Error(Status::kTimeout, "heap.fd_exchange", rank_, -1,
                      "peers did not connect in time: served " + std::to_string(served.size()) + " of " +
                          std::to_string(peers) + ", refused " + std::to_string(refused_));
        const int s = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (s < 0) {
          if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
          sys_fail("accept", rank_, -1);
        }
        int peer = -1;
        std::string why;
        try {
          why = serve_one(s, local_ranks, served, secret, identities, deadline, &peer);
          if (why.empty()) {
            set_timeout(s, timeout_);
            send_fd(s, rank_, peer, my_fd);
            served.push_back(peer);
          }
        } catch (...) {
          ::close(s);
          throw;
        }
        ::close(s);
        if (!why.empty()) log_refused("heap.fd_exchange", rank_, why, refused_++);
      }
    } catch (...) {
      serve_error = std::current_exception();
    }
  });
  std::map<int, int> out;
  std::exception_ptr fetch_error;
  try {
    const LocalHello hello = make_local_hello(rank_, secret);
    for (int peer : local_ranks) {
      if (peer == rank_) continue;
      const int s = connect_abstract_unix(socket_name(session_, peer), deadline);
      if (s < 0) {
        if (errno == ETIMEDOUT) throw Error(Status::kTimeout, "heap.fd_exchange", rank_, peer, "cannot connect to peer");
        sys_fail("connect", rank_, peer);
      }
      try {
        // The secret goes only to the process that published itself as `peer`, and only its fd is trusted.
        const auto it = identities.find(peer);
        if (std::string why = check_peer_credentials(s, it == identities.end() ? "" : it->second); !why.empty())
          throw Error(Status::kSystemError, "heap.fd_exchange", rank_, peer, "the listener is not that rank: " + why);
        set_timeout(s, timeout_);
        if (::send(s, &hello, sizeof(hello), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(hello)))
          sys_fail("send", rank_, peer);
        out[peer] = recv_fd(s, rank_, peer);
      } catch (...) {
        ::close(s);
        throw;
      }
      ::close(s);
    }
  } catch (...) {
    fetch_error = std::current_exception();
  }
  server.join();
  if (fetch_error || serve_error) {
    for (auto& [peer, fd] : out) ::close(fd);
    // Our own fetch failure names the peer we waited for; else the server's (which names none).
    try {
      std::rethrow_exception(fetch_error ? fetch_error : serve_error);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(Status::kSystemError, "heap.fd_exchange", rank_, -1, e.what());
    }
  }
  return out;
}

}  // namespace tandem::detail
