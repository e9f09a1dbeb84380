// Node-local IPC helpers (Linux): abstract-namespace unix sockets (a leading NUL, no file to clean up, gone
// with the process) and the per-node session name that keeps concurrent communicators apart.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
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

// ---------------------------------------------------------------------------------------------------------
// Who may connect. An abstract unix socket has no file permissions: any process of the network namespace can
// connect to it, whatever its uid. So every local listener of tandem (the fd exchange, the peer monitor)
//  * checks SO_PEERCRED: same effective uid as ours, and, when the peer shares our pid namespace, the pid
//    the claimed rank published in the store;
//  * reads a hello (magic, rank, job secret) within kLocalHandshake, then checks it in constant time;
// and a client checks the listener's SO_PEERCRED the same way before it sends the secret or trusts an fd.
constexpr uint32_t kLocalHelloMagic = 0x6c6e6454;  // "Tdnl"
constexpr std::chrono::milliseconds kLocalHandshake{2000};

struct LocalHello {
  uint32_t magic;
  int32_t rank;
  unsigned char secret[kJobSecretBytes];
};
static_assert(sizeof(LocalHello) == 8 + kJobSecretBytes, "no padding on the wire");

inline LocalHello make_local_hello(int rank, const std::string& secret) {
  LocalHello h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kLocalHelloMagic;
  h.rank = rank;
  std::memcpy(h.secret, secret.data(), std::min(secret.size(), sizeof(h.secret)));
  return h;
}

inline bool local_hello_valid(const LocalHello& h, const std::string& secret) {
  return h.magic == kLocalHelloMagic && secret.size() == kJobSecretBytes &&
         secret_equal(h.secret, secret.data(), kJobSecretBytes);
}

// "pid pid-namespace" of this process: what a rank publishes so that its peers can match SO_PEERCRED.
inline std::string local_identity() {
  char ns[128] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  return std::to_string(static_cast<long>(::getpid())) + " " + (n > 0 ? std::string(ns, static_cast<size_t>(n)) : "");
}

// Empty if the process at the other end of `fd` may be the rank whose published identity is `identity`
// (empty identity: uid only); else why not.
inline std::string check_peer_credentials(int fd, const std::string& identity) {
  ucred c{};
  socklen_t len = sizeof(c);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) return std::string("SO_PEERCRED: ") + std::strerror(errno);
  if (c.uid != ::geteuid())
    return "uid " + std::to_string(c.uid) + " is not ours (" + std::to_string(::geteuid()) + ")";
  if (identity.empty()) return "";
  const auto space = identity.find(' ');
  const long pid = std::atol(identity.substr(0, space).c_str());
  const std::string ns = space == std::string::npos ? "" : identity.substr(space + 1);
  const std::string mine = local_identity();
  const std::string my_ns = mine.substr(mine.find(' ') + 1);
  // Across pid namespaces the kernel reports another number (or 0): only the uid can be compared then.
  if (!ns.empty() && ns == my_ns && c.pid != 0 && static_cast<long>(c.pid) != pid)
    return "pid " + std::to_string(c.pid) + " is not the rank's (" + std::to_string(pid) + ")";
  return "";
}

// Read exactly n bytes before `deadline`; false on timeout, EOF or error (the caller refuses the peer).
inline bool read_exact_until(int fd, void* p, size_t n, std::chrono::steady_clock::time_point deadline) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pf{fd, POLLIN, 0};
    const int r = ::poll(&pf, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t k = ::recv(fd, c, n, MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// One line on stderr per refused connection (the first 16 of each listener; a flood is counted, not printed).
// Never prints the secret, only why the peer was refused.
inline void log_refused(const char* op, int rank, const std::string& why, int refused_so_far) {
  if (refused_so_far < 16)
    std::fprintf(stderr, "tandem: rank %d: %s: refused a connection: %s%s\n", rank, op, why.c_str(),
                 refused_so_far == 15 ? " (further refusals are counted, not logged)" : "");
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
