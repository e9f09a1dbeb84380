#include "fd_passing.h"
#include "unix_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

void send_fd(int sock, int my_rank, int fd) {
  msghdr msg{};
  iovec iov{&my_rank, sizeof(my_rank)};
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
  if (::sendmsg(sock, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(my_rank))) sys_fail("sendmsg", my_rank, -1);
}

int recv_fd(int sock, int my_rank, int expected_peer) {
  msghdr msg{};
  int peer = -1;
  iovec iov{&peer, sizeof(peer)};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  if (::recvmsg(sock, &msg, 0) != static_cast<ssize_t>(sizeof(peer))) sys_fail("recvmsg", my_rank, expected_peer);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS || peer != expected_peer)
    throw Error(Status::kSystemError, "heap.fd_exchange", my_rank, expected_peer, "no descriptor received");
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
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

std::map<int, int> FdExchange::run(const std::vector<int>& local_ranks, int my_fd) {
  const int peers = static_cast<int>(local_ranks.size()) - 1;
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  // Serve our descriptor to every peer from a helper thread while this thread collects theirs.
  std::string serve_error;
  std::thread server([&] {
    try {
      for (int served = 0; served < peers; ++served) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                                std::chrono::steady_clock::now());
        pollfd p{listen_fd_, POLLIN, 0};
        if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0)
          throw Error(Status::kTimeout, "heap.fd_exchange", rank_, -1, "peers did not connect in time");
        const int s = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (s < 0) sys_fail("accept", rank_, -1);
        set_timeout(s, timeout_);
        try {
          send_fd(s, rank_, my_fd);
        } catch (...) {
          ::close(s);
          throw;
        }
        ::close(s);
      }
    } catch (const std::exception& e) {
      serve_error = e.what();
    }
  });
  std::map<int, int> out;
  std::string fetch_error;
  try {
    for (int peer : local_ranks) {
      if (peer == rank_) continue;
      const int s = connect_abstract_unix(socket_name(session_, peer), deadline);
      if (s < 0) {
        if (errno == ETIMEDOUT) throw Error(Status::kTimeout, "heap.fd_exchange", rank_, peer, "cannot connect to peer");
        sys_fail("connect", rank_, peer);
      }
      set_timeout(s, timeout_);
      try {
        out[peer] = recv_fd(s, rank_, peer);
      } catch (...) {
        ::close(s);
        throw;
      }
      ::close(s);
    }
  } catch (const std::exception& e) {
    fetch_error = e.what();
  }
  server.join();
  if (!fetch_error.empty() || !serve_error.empty()) {
    for (auto& [peer, fd] : out) ::close(fd);
    throw Error(Status::kSystemError, "heap.fd_exchange", rank_, -1,
                fetch_error.empty() ? serve_error : fetch_error);
  }
  return out;
}

}  // namespace tandem::detail
