// Node-local IPC helpers (Linux): abstract-namespace unix sockets (a leading NUL, no file to clean up, gone
// with the process) and the per-node session name that keeps concurrent communicators apart.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tandem/transport/bootstrap.h"

namespace tandem::detail {

inline sockaddr_un abstract_unix_address(const std::string& name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(addr.sun_path) - 2);
  std::memcpy(addr.sun_path + 1, name.data(), n);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return addr;
}

// A listening socket on the abstract name, or -1 (errno set).
inline int listen_abstract_unix(const std::string& name) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  socklen_t len = 0;
  sockaddr_un addr = abstract_unix_address(name, &len);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 256) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

// Connect to the abstract name, retrying until `deadline` (the peer may not listen yet); -1 on failure
// (errno ETIMEDOUT once the deadline passed).
inline int connect_abstract_unix(const std::string& name, std::chrono::steady_clock::time_point deadline) {
  socklen_t len = 0;
  sockaddr_un addr = abstract_unix_address(name, &len);
  for (;;) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0) return fd;
    ::close(fd);
    if (std::chrono::steady_clock::now() > deadline) {
      errno = ETIMEDOUT;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// A name unique to this node and this exchange: the node leader (first of `node_ranks`) makes it, the
// others read it from the bootstrap. Ranks of other nodes never touch the key.
inline std::string node_session(Bootstrap& b, const std::string& tag, int rank, const std::vector<int>& node_ranks) {
  const std::string key = tag + "/session/" + std::to_string(node_ranks.front());
  if (rank != node_ranks.front()) return b.get(key);
  unsigned long long v = 0;
  if (FILE* f = std::fopen("/dev/urandom", "rb")) {
    if (std::fread(&v, sizeof(v), 1, f) != 1) v = 0;
    std::fclose(f);
  }
  v ^= static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%016llx.%d", v, static_cast<int>(::getpid()));
  b.set(key, buf);
  return buf;
}

}  // namespace tandem::detail
