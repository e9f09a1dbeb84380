// TCP backend of the proxy path.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>

#include "tandem/transport/proxy.h"
#include "../unix_socket.h"

namespace tandem::proxy {

namespace {

constexpr uint32_t kMagic = 0x746e6450;  // "Pdnt"
enum FrameKind : uint32_t { kData = 1, kAck = 2, kHeartbeat = 3, kBye = 4, kHello = 5 };

struct FrameHeader {
  uint32_t magic;
  uint32_t kind;
  uint64_t ticket;
  Command cmd;  // 64-aligned: 48 bytes of padding before it
};

// Every header that leaves this process is built here: zeroed first, padding included, so no stack or heap
// bytes of ours ever reach the wire.
FrameHeader make_header(FrameKind kind, uint64_t ticket, const Command* cmd = nullptr) {
  FrameHeader h;
  std::memset(static_cast<void*>(&h), 0, sizeof(h));
  h.magic = kMagic;
  h.kind = kind;
  h.ticket = ticket;
  if (cmd != nullptr) std::memcpy(static_cast<void*>(&h.cmd), cmd, sizeof(Command));
  return h;
}

// The first bytes on a new connection: who connects, with the job secret.
struct Hello {
  uint32_t magic;
  uint32_t kind;  // kHello
  uint64_t rank;
  unsigned char secret[kJobSecretBytes];
};
static_assert(sizeof(Hello) == 16 + kJobSecretBytes, "no padding on the wire");
constexpr std::chrono::milliseconds kHelloTimeout{2000};  // a connection that says nothing is dropped after this

[[noreturn]] void sys_fail(const char* what, int rank, int peer) {
  throw Error(errno == ETIMEDOUT || errno == EAGAIN ? Status::kTimeout : Status::kSystemError, "proxy.tcp", rank,
              peer, std::string(what) + ": " + std::strerror(errno));
}

void set_socket_options(int fd, std::chrono::milliseconds timeout) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  // A send blocked on a dead link fails after this long instead of hanging (data unacknowledged by the peer).
  unsigned int user_timeout = static_cast<unsigned int>(timeout.count());
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  int buf = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

void write_all(int fd, const void* p, size_t n, int rank, int peer) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      sys_fail("send", rank, peer);
    }
    c += k;
    n -= static_cast<size_t>(k);
  }
}

// Header and payload in as few syscalls as the kernel allows.
void writev_all(int fd, iovec* iov, int cnt, int rank, int peer) {
  while (cnt > 0) {
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(cnt);
    ssize_t k = ::sendmsg(fd, &m, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      sys_fail("sendmsg", rank, peer);
    }
    while (cnt > 0 && static_cast<size_t>(k) >= iov->iov_len) {
      k -= static_cast<ssize_t>(iov->iov_len);
      ++iov;
      --cnt;
    }
    if (cnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + k;
      iov->iov_len -= static_cast<size_t>(k);
    }
  }
}

// Read exactly n bytes; between bytes, give up after `timeout` without progress. Returns false on orderly EOF
// before the first byte.
// `wake_fd` becomes readable when the backend shuts down: a blocked read then ends at once.
bool read_all(int fd, int wake_fd, void* p, size_t n, std::chrono::milliseconds timeout, int rank, int peer,
              const std::atomic<bool>& stopping) {
  char* c = static_cast<char*>(p);
  size_t got = 0;
  while (got < n) {
    pollfd pf[2] = {{fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int r = ::poll(pf, 2, static_cast<int>(timeout.count()));
    if (stopping.load()) throw Error(Status::kAborted, "proxy.tcp", rank, peer, "shutting down");
    if (r == 0) throw Error(Status::kTimeout, "proxy.tcp", rank, peer,
                            "no traffic from peer for " + std::to_string(timeout.count()) + " ms (link lost?)");
    if (r < 0) {
      if (errno == EINTR) continue;
      sys_fail("poll", rank, peer);
    }
    const ssize_t k = ::recv(fd, c + got, n - got, 0);
    if (k == 0) {
      if (got == 0) return false;
      throw Error(Status::kSystemError, "proxy.tcp", rank, peer, "connection closed mid-frame");
    }
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      sys_fail("recv", rank, peer);
    }
    got += static_cast<size_t>(k);
  }
  return true;
}

// Buffered frame reader: one recv() brings in many small frames; large payloads bypass the buffer.
class FrameReader {
 public:
  FrameReader(int fd, int wake_fd, std::chrono::milliseconds timeout, int rank, int peer,
              const std::atomic<bool>& stopping)
      : fd_(fd), wake_fd_(wake_fd), timeout_(timeout), rank_(rank), peer_(peer), stopping_(stopping), buf_(1 << 20) {}
  bool buffered() const { return end_ > begin_; }
  // Exactly n bytes into dst. Returns false only on an orderly EOF before the first byte of a frame.
  bool read(void* dst, size_t n, bool frame_start) {
    char* d = static_cast<char*>(dst);
    while (n > 0) {
      if (begin_ == end_) {
        if (n >= buf_.size() / 2) {  // large payload: straight into place
          if (read_all(fd_, wake_fd_, d, n, timeout_, rank_, peer_, stopping_)) return true;
          if (frame_start) return false;
          throw Error(Status::kSystemError, "proxy.tcp", rank_, peer_, "connection closed mid-frame");
        }
        if (!fill()) {
          if (frame_start) return false;
          throw Error(Status::kSystemError, "proxy.tcp", rank_, peer_, "connection closed mid-frame");
        }
      }
      const size_t k = std::min(n, end_ - begin_);
      std::memcpy(d, buf_.data() + begin_, k);
      begin_ += k;
      d += k;
      n -= k;
      frame_start = false;
    }
    return true;
  }

 private:
  bool fill() {
    begin_ = end_ = 0;
    pollfd pf[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    for (;;) {
      const int r = ::poll(pf, 2, static_cast<int>(timeout_.count()));
      if (stopping_.load()) throw Error(Status::kAborted, "proxy.tcp", rank_, peer_, "shutting down");
      if (r == 0)
        throw Error(Status::kTimeout, "proxy.tcp", rank_, peer_,
                    "no traffic from peer for " + std::to_string(timeout_.count()) + " ms (link lost?)");
      if (r < 0) {
        if (errno == EINTR) continue;
        sys_fail("poll", rank_, peer_);
      }
      const ssize_t k = ::recv(fd_, buf_.data(), buf_.size(), 0);
      if (k == 0) return false;
      if (k < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        sys_fail("recv", rank_, peer_);
      }
      end_ = static_cast<size_t>(k);
      return true;
    }
  }
  int fd_, wake_fd_;
  std::chrono::milliseconds timeout_;
  int rank_, peer_;
  const std::atomic<bool>& stopping_;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
};

constexpr uint64_t kMaxPendingAcks = 64;  // acks are cumulative; at most this many frames wait for one

std::pair<std::string, uint16_t> split_address(const std::string& a) {
  const auto colon = a.rfind(':');
  return {a.substr(0, colon), static_cast<uint16_t>(std::stoi(a.substr(colon + 1)))};
}

}  // namespace

struct TcpBackend::Link {
  int peer = -1;
  int fd = -1;
  std::mutex send_mu;
  std::mutex ack_mu;
  std::deque<uint64_t> awaiting_ack;  // tickets of frames sent with kFlagAck, in send order
  std::atomic<int64_t> last_send_ns{0};
  std::atomic<bool> closed{false};
  // Frames received and applied, not yet acknowledged. Counted as each frame is applied (not batched), so
  // that shutdown() can send every ack owed once the receive thread has stopped: a peer's quiet() may be
  // waiting for it (ack_loop sends them during the run).
  std::atomic<uint64_t> acks_owed{0};
};

std::string routable_ipv4(std::string* why) {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) {
    if (why) *why = std::string("getifaddrs: ") + std::strerror(errno);
    return "";
  }
  static const char* const kSkipped[] = {"docker", "br-", "virbr", "veth", "cni", "flannel"};
  std::string found, seen;
  for (ifaddrs* a = all; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    const std::string name = a->ifa_name != nullptr ? a->ifa_name : "";
    char host[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, host, sizeof(host));
    seen += (seen.empty() ? "" : ", ") + name + " " + host;
    if ((a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    bool skip = false;
    for (const char* prefix : kSkipped) skip = skip || name.rfind(prefix, 0) == 0;
    if (!skip) found = host;
  }
  ::freeifaddrs(all);
  if (found.empty() && why) *why = "no IPv4 interface that is up and not loopback or a bridge (seen: " +
                                   (seen.empty() ? std::string("none") : seen) + ")";
  return found;
}

TcpBackend::TcpBackend(Bootstrap& bootstrap, const std::string& tag, int rank, const std::vector<int>& peers,
                       MemoryDomain& local, const TcpOptions& options, Ack on_ack)
    : rank_(rank), local_(local), options_(options), on_ack_(std::move(on_ack)) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) sys_fail("eventfd", rank, -1);
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lfd < 0) sys_fail("socket", rank, -1);
  int one = 1;
  ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(options_.listen_port);
  if (::inet_pton(AF_INET, options_.listen_host.c_str(), &addr.sin_addr) != 1) {
    ::close(lfd);
    throw Error(Status::kInvalidArgument, "proxy.tcp", rank, -1, "listen_host must be an IPv4 address");
  }
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(lfd, 128) != 0) {
    const int e = errno;
    ::close(lfd);
    errno = e;
    sys_fail("bind/listen", rank, -1);
  }
  socklen_t alen = sizeof(addr);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &alen);
  bootstrap.set(tag + "/tcp/" + std::to_string(rank), options_.listen_host + ":" + std::to_string(ntohs(addr.sin_port)));

  // The lower rank of each pair connects; the higher accepts.
  int expect_accepts = 0;
  for (int p : peers) {
    if (p == rank) continue;
    auto link = std::make_unique<Link>();
    link->peer = p;
    if (p < rank) ++expect_accepts;
    links_.push_back(std::move(link));
  }
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  try {
    // Highest peer first. Any order works (every listener exists before its address is published, and a
    // connect completes in the listener's backlog); this one lets a peer's listener see its lower peers
    // arrive while a middle rank is still starting (tests/cpu/test_security.py places strays there).
    for (auto it = links_.rbegin(); it != links_.rend(); ++it) {
      auto& link = *it;
      if (link->peer < rank) continue;
      const auto [host, port] = split_address(bootstrap.get(tag + "/tcp/" + std::to_string(link->peer)));
      sockaddr_in pa{};
      pa.sin_family = AF_INET;
      pa.sin_port = htons(port);
      ::inet_pton(AF_INET, host.c_str(), &pa.sin_addr);
      for (;;) {
        const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0) sys_fail("socket", rank, link->peer);
        if (::connect(s, reinterpret_cast<sockaddr*>(&pa), sizeof(pa)) == 0) {
          link->fd = s;
          break;
        }
        ::close(s);
        if (std::chrono::steady_clock::now() > deadline)
          throw Error(Status::kTimeout, "proxy.tcp.connect", rank, link->peer, "cannot connect to " + host);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      set_socket_options(link->fd, options_.timeout);
      Hello hello;
      std::memset(&hello, 0, sizeof(hello));
      hello.magic = kMagic;
      hello.kind = kHello;
      hello.rank = static_cast<uint64_t>(rank);
      std::memcpy(hello.secret, options_.secret.data(), std::min(options_.secret.size(), sizeof(hello.secret)));
      write_all(link->fd, &hello, sizeof(hello), rank, link->peer);
    }
    // Until every lower-ranked peer is here: a connection that is not one of them is refused and the wait
    // goes on, so a stray can delay setup by at most kHelloTimeout each, never take a peer's place.
    for (int accepted = 0; accepted < expect_accepts;) {
      pollfd pf{lfd, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || ::poll(&pf, 1, static_cast<int>(left.count())) <= 0)
        throw Error(Status::kTimeout, "proxy.tcp.accept", rank, -1,
                    "peers did not connect in time: " + std::to_string(accepted) + " of " +
                        std::to_string(expect_accepts) + " came, " + std::to_string(refused_) + " refused");
      const int s = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (s < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
        sys_fail("accept", rank, -1);
      }
      Link* link = nullptr;
      const std::string why = authenticate(s, deadline, &link);
      if (!why.empty()) {
        ::close(s);
        detail::log_refused("proxy.tcp.accept", rank, why, refused_++);
        continue;
      }
      set_socket_options(s, options_.timeout);
      link->fd = s;
      ++accepted;
    }
  } catch (...) {
    ::close(lfd);
    for (auto& l : links_)
      if (l->fd >= 0) ::close(l->fd);
    ::close(wake_fd_);
    wake_fd_ = -1;
    throw;
  }
  ::close(lfd);
  for (auto& l : links_) threads_.emplace_back([this, link = l.get()] { receive_loop(link); });
  threads_.emplace_back([this] { ack_loop(); });
  threads_.emplace_back([this] { heartbeat_loop(); });
}

TcpBackend::~TcpBackend() { shutdown(); }

// Empty if `s` is an expected peer (then *link is its link); else why it is refused. Reads the hello for at
// most kHelloTimeout and nothing after it.
std::string TcpBackend::authenticate(int s, std::chrono::steady_clock::time_point deadline, Link** link) {
  std::string from = "?";
  sockaddr_in a{};
  socklen_t alen = sizeof(a);
  if (::getpeername(s, reinterpret_cast<sockaddr*>(&a), &alen) == 0) {
    char host[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof(host));
    from = std::string(host) + ":" + std::to_string(ntohs(a.sin_port));
  }
  Hello hello{};
  const auto hs_deadline = std::min(deadline, std::chrono::steady_clock::now() + kHelloTimeout);
  if (!detail::read_exact_until(s, &hello, sizeof(hello), hs_deadline))
    return "from " + from + ": no hello within " + std::to_string(kHelloTimeout.count()) + " ms";
  if (hello.magic != kMagic || hello.kind != kHello) return "from " + from + ": bad hello";
  if (options_.secret.size() != kJobSecretBytes || !secret_equal(hello.secret, options_.secret.data(), kJobSecretBytes))
    return "from " + from + ": wrong job secret";
  const int peer = hello.rank < static_cast<uint64_t>(rank_) ? static_cast<int>(hello.rank) : -1;
  Link* l = peer >= 0 ? link_for(peer) : nullptr;
  if (l == nullptr)  // out of range, this rank itself, a higher rank (we connect to those) or not a remote peer
    return "from " + from + ": rank " + std::to_string(hello.rank) + " is not a remote peer that connects here";
  if (l->fd >= 0) return "from " + from + ": rank " + std::to_string(peer) + " is already connected";
  *link = l;
  return "";
}

// A frame is checked whole before anything is allocated, read or written: a corrupt or hostile peer fails the
// link (and the job, naming it) instead of overrunning the heap or allocating 2^63 bytes.
void TcpBackend::check_frame(const Command& c, int peer) const {
  const auto op = static_cast<CommandOp>(c.op);
  if (op != CommandOp::kPut && op != CommandOp::kPutSignal && op != CommandOp::kSignal)
    throw Error(Status::kSystemError, "proxy.tcp", rank_, peer, "frame with unknown op " + std::to_string(c.op));
  if (c.peer != rank_)
    throw Error(Status::kSystemError, "proxy.tcp", rank_, peer,
                "frame addressed to rank " + std::to_string(c.peer) + " arrived here");
  const uint64_t heap = local_.bytes();
  if (op != CommandOp::kSignal && c.bytes > 0) {
    if (c.bytes > kMaxFramePayload)
      throw Error(Status::kSystemError, "proxy.tcp", rank_, peer,
                  "frame of " + std::to_string(c.bytes) + " payload bytes exceeds the cap of " +
                      std::to_string(kMaxFramePayload));
    if (c.dst_offset > heap || c.bytes > heap - c.dst_offset)
      throw Error(Status::kInvalidArgument, "proxy.tcp", rank_, peer,
                  "frame writes [" + std::to_string(c.dst_offset) + ", +" + std::to_string(c.bytes) +
                      ") outside this rank's heap of " + std::to_string(heap) + " bytes");
  }
  if (op != CommandOp::kPut) {
    if (c.sig_offset > heap || heap - c.sig_offset < sizeof(uint64_t) || c.sig_offset % sizeof(uint64_t) != 0 ||
        c.signal_op > 1)
      throw Error(Status::kInvalidArgument, "proxy.tcp", rank_, peer,
                  "frame signals flag " + std::to_string(c.sig_offset) + " (op " + std::to_string(c.signal_op) +
                      "): not an aligned flag inside this rank's heap of " + std::to_string(heap) + " bytes");
  }
}

TcpBackend::Link* TcpBackend::link_for(int peer) {
  for (auto& l : links_)
    if (l->peer == peer) return l.get();
  return nullptr;
}

void TcpBackend::fail(const Error& e) {
  std::lock_guard<std::mutex> g(error_mu_);
  if (!error_) error_ = std::make_unique<Error>(e);
}

void TcpBackend::check() {
  std::lock_guard<std::mutex> g(error_mu_);
  if (error_) throw Error(*error_);
}

void TcpBackend::send(const Command& cmd, uint64_t ticket, const void* data) {
  check();
  Link* link = link_for(cmd.peer);
  if (link == nullptr || link->fd < 0)
    throw Error(Status::kUnreachablePeer, "proxy.tcp.send", rank_, cmd.peer, "no connection to this peer");
  if (data != nullptr && cmd.bytes > kMaxFramePayload)  // the receiver would refuse it
    throw Error(Status::kInvalidArgument, "proxy.tcp.send", rank_, cmd.peer,
                "frame of " + std::to_string(cmd.bytes) + " bytes exceeds the cap of " + std::to_string(kMaxFramePayload));
  const FrameHeader h = make_header(kData, ticket, &cmd);
  std::lock_guard<std::mutex> g(link->send_mu);
  if (cmd.flags & kFlagAck) {  // registered before the frame leaves, so its ack cannot overtake it
    std::lock_guard<std::mutex> a(link->ack_mu);
    link->awaiting_ack.push_back(ticket);
  }
  try {
    iovec iov[2] = {{const_cast<FrameHeader*>(&h), sizeof(h)}, {const_cast<void*>(data), data != nullptr ? cmd.bytes : 0}};
    writev_all(link->fd, iov, data != nullptr && cmd.bytes > 0 ? 2 : 1, rank_, cmd.peer);
  } catch (const Error& e) {
    fail(e);
    throw;
  }
  link->last_send_ns.store(std::chrono::steady_clock::now().time_since_epoch().count());
}

void TcpBackend::receive_loop(Link* link) {
  std::vector<char> buf;
  FrameReader reader(link->fd, wake_fd_, options_.timeout, rank_, link->peer, stopping_);
  uint64_t unannounced = 0;  // acks owed that ack_loop has not been woken for
  try {
    for (;;) {
      // One cumulative ack once the input is drained (or enough frames wait), not one per frame.
      // (Sent by ack_loop: this thread never writes to the socket, so it never stops reading.)
      if (unannounced > 0 && (!reader.buffered() || unannounced >= kMaxPendingAcks)) {
        unannounced = 0;
        {
          std::lock_guard<std::mutex> g(acks_mu_);
          acks_due_ = true;
        }
        acks_cv_.notify_one();
      }
      FrameHeader h{};
      if (!reader.read(&h, sizeof(h), true)) {
        if (!link->closed.load() && !stopping_.load())
          throw Error(Status::kSystemError, "proxy.tcp", rank_, link->peer, "peer closed the connection without bye");
        return;
      }
      if (h.magic != kMagic) throw Error(Status::kSystemError, "proxy.tcp", rank_, link->peer, "corrupt frame");
      switch (h.kind) {
        case kData: {
          const Command& c = h.cmd;
          const auto op = static_cast<CommandOp>(c.op);
          check_frame(c, link->peer);  // before the payload is allocated or read
          if (c.bytes > 0 && op != CommandOp::kSignal) {
            buf.resize(c.bytes);
            reader.read(buf.data(), c.bytes, false);
            local_.write(c.dst_offset, buf.data(), c.bytes);  // data first ...
          }
          if (op == CommandOp::kPutSignal || op == CommandOp::kSignal)
            local_.signal(c.sig_offset, c.sig_value, c.signal_op);  // ... then the flag (release)
          if (c.flags & kFlagAck) {
            link->acks_owed.fetch_add(1);
            ++unannounced;
          }
          break;
        }
        case kAck: {
          std::vector<uint64_t> done;
          {
            std::lock_guard<std::mutex> a(link->ack_mu);
            for (uint64_t i = 0; i < h.ticket; ++i) {
              if (link->awaiting_ack.empty())
                throw Error(Status::kSystemError, "proxy.tcp", rank_, link->peer, "ack for a frame never sent");
              done.push_back(link->awaiting_ack.front());
              link->awaiting_ack.pop_front();
            }
          }
          if (on_ack_)
            for (uint64_t t : done) on_ack_(link->peer, t);
          break;
        }
        case kHeartbeat:
          break;
        case kBye: {
          // The peer sends every ack it owes before its bye (shutdown()), so frames still unacknowledged here
          // were never applied there: whoever waits for them must fail now, not at its timeout.
          link->closed.store(true);
          size_t lost = 0;
          {
            std::lock_guard<std::mutex> a(link->ack_mu);
            lost = link->awaiting_ack.size();
          }
          if (lost > 0 && !stopping_.load())
            fail(Error(Status::kUnreachablePeer, "proxy.tcp", rank_, link->peer,
                       "peer closed the connection with " + std::to_string(lost) +
                           " frame(s) of ours unacknowledged (it shut down before they arrived)"));
          return;
        }
        default:
          throw Error(Status::kSystemError, "proxy.tcp", rank_, link->peer, "unknown frame kind");
      }
    }
  } catch (const Error& e) {
    if (!stopping_.load()) fail(e);
  } catch (const std::exception& e) {  // e.g. bad_alloc: an exception leaving a thread would end the process
    if (!stopping_.load()) fail(Error(Status::kInternal, "proxy.tcp", rank_, link->peer, e.what()));
  }
}

void TcpBackend::ack_loop() {
  // Test hook: an ack thread that runs late, as on a machine with more busy threads than cores.
  const bool late = fault_injected("TANDEM_TEST_LATE_ACKS", rank_);
  std::unique_lock<std::mutex> lk(acks_mu_);
  while (!stopping_.load()) {
    acks_cv_.wait_for(lk, std::chrono::milliseconds(50), [&] { return acks_due_ || stopping_.load(); });
    acks_due_ = false;
    lk.unlock();
    if (late) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (auto& l : links_) {
      const uint64_t n = l->acks_owed.exchange(0);
      if (n == 0 || l->closed.load()) continue;
      const FrameHeader ack = make_header(kAck, n);
      try {
        std::lock_guard<std::mutex> g(l->send_mu);  // may wait for a data frame; the peer keeps reading
        write_all(l->fd, &ack, sizeof(ack), rank_, l->peer);
        l->last_send_ns.store(std::chrono::steady_clock::now().time_since_epoch().count());
      } catch (const Error& e) {
        if (!stopping_.load()) fail(e);
      }
    }
    lk.lock();
  }
}

void TcpBackend::heartbeat_loop() {
  const auto period = std::max(std::chrono::milliseconds(10), options_.timeout / 4);
  while (!stopping_.load()) {
    std::this_thread::sleep_for(std::min(period, std::chrono::milliseconds(50)));
    const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    for (auto& l : links_) {
      if (l->closed.load() || now - l->last_send_ns.load() < std::chrono::nanoseconds(period).count()) continue;
      std::unique_lock<std::mutex> g(l->send_mu, std::try_to_lock);
      if (!g.owns_lock()) continue;  // a data send is in progress: that is traffic too
      const FrameHeader hb = make_header(kHeartbeat, 0);
      try {
        write_all(l->fd, &hb, sizeof(hb), rank_, l->peer);
        l->last_send_ns.store(now);
      } catch (const Error& e) {
        fail(e);
      }
    }
  }
}

// Orderly close: stop every thread first (the eventfd wakes the receive threads out of poll), then send each
// peer the acks still owed and a bye, in that order on the same stream. A peer still inside quiet() thus gets
// the acks for every frame this rank applied, even when this rank closes the moment its own work is done
// (CI caught the old order, bye first and acks lost with the ack thread, as a peer's quiet() timeout).
void TcpBackend::shutdown() {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> g(acks_mu_);
    acks_due_ = true;
  }
  acks_cv_.notify_all();
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  for (auto& l : links_) {
    if (l->fd < 0) continue;
    std::lock_guard<std::mutex> g(l->send_mu);
    try {
      if (!l->closed.load()) {  // a peer that said bye reads no more
        const uint64_t owed = l->acks_owed.exchange(0);
        if (owed > 0) {
          const FrameHeader ack = make_header(kAck, owed);
          write_all(l->fd, &ack, sizeof(ack), rank_, l->peer);
        }
      }
      const FrameHeader bye = make_header(kBye, 0);
      write_all(l->fd, &bye, sizeof(bye), rank_, l->peer);
    } catch (...) {  // the peer is gone already: nothing left to tell it
    }
  }
  for (auto& l : links_)
    if (l->fd >= 0) {
      ::shutdown(l->fd, SHUT_RDWR);
      ::close(l->fd);
    }
  if (wake_fd_ >= 0) ::close(wake_fd_);
  wake_fd_ = -1;
}

}  // namespace tandem::proxy
