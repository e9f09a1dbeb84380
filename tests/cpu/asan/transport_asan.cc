// CPU-only driver of the transport's failure paths, built with -fsanitize=address,undefined by
// tests/cpu/test_transport_lifetimes.py against the proxy/queue/TCP/monitor/bootstrap sources (no GPU, no
// Python). Each scenario runs its ranks as forked processes over a FileBootstrap and 127.0.0.1 / abstract unix
// sockets; a rank exits 0 only if what it saw is what the scenario expects, and any sanitizer report makes it
// exit non-zero.
//
// usage: transport_asan SCENARIO DIR   (fault_after_proxy | unsafe_order | hostile_frame | queue_timeout |
//                                        monitor_strays)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "peer_monitor.h"
#include "tandem/transport/bootstrap.h"
#include "tandem/transport/proxy.h"
#include "unix_socket.h"

using namespace tandem;
using namespace tandem::proxy;

namespace {

#define EXPECT(cond)                                                          \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #cond); \
      std::_Exit(3);                                                          \
    }                                                                         \
  } while (0)

Command put(int peer, uint64_t src, uint64_t dst, uint64_t n) {
  Command c{};
  c.op = static_cast<uint32_t>(CommandOp::kPut);
  c.peer = peer;
  c.src_offset = src;
  c.dst_offset = dst;
  c.bytes = n;
  return c;
}

// Like the communicator and the Python endpoint: a queue, then the service; throws once the proxy runs, with
// commands in flight.
struct Owner {
  std::vector<char> heap;
  CommandQueue queue;
  std::unique_ptr<ProxyService> service;
  Owner(Bootstrap& boot, int rank) : heap(8 << 20), queue(64, rank) {
    TcpOptions o;
    o.timeout = std::chrono::milliseconds(5000);
    o.secret = job_secret(boot, "proxy");
    service = std::make_unique<ProxyService>(boot, "proxy", rank, std::vector<int>{0, 1}, queue,
                                             std::make_unique<HostMemoryDomain>(heap.data(), heap.size()), o);
    for (int i = 0; i < 32; ++i) queue.push(put(1 - rank, 0, 0, 256 << 10), std::chrono::milliseconds(5000));
    if (fault_injected("TANDEM_TEST_FAIL_AFTER_PROXY", rank))
      throw Error(Status::kInternal, "owner.init", rank, -1, "fault injected after the proxy started");
  }
};

// The order members alone give: backend destroyed under the running proxy thread. A negative control: ASan must
// report it, or the scenario above proves nothing.
struct UnsafeOwner {
  std::vector<char> heap;
  CommandQueue queue;
  std::unique_ptr<HostMemoryDomain> domain;
  std::unique_ptr<Proxy> proxy;
  std::unique_ptr<TcpBackend> backend;
  UnsafeOwner(Bootstrap& boot, int rank) : heap(1 << 20), queue(64, rank) {
    TcpOptions o;
    o.timeout = std::chrono::milliseconds(5000);
    o.secret = job_secret(boot, "proxy");
    domain = std::make_unique<HostMemoryDomain>(heap.data(), heap.size());
    proxy = std::make_unique<Proxy>(rank, queue, *domain);
    backend = std::make_unique<TcpBackend>(boot, "proxy", rank, std::vector<int>{0, 1}, *domain, o,
                                           [p = proxy.get()](int peer, uint64_t t) { p->on_ack(peer, t); });
    proxy->start(backend.get());
    // What member destruction does (backend_ before proxy_), with the window held open and a command for the
    // proxy thread to hand to the freed backend (a loaded 2-core machine may not reach its idle-time check()).
    backend.reset();
    queue.push(put(1 - rank, 0, 0, 64), std::chrono::milliseconds(1000));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    throw Error(Status::kInternal, "owner.init", rank, -1, "fault");
  }
};

int fault_after_proxy(const std::string& dir, int rank, bool unsafe) {
  FileBootstrap boot(dir, rank, 2, std::chrono::seconds(30));
  try {
    if (unsafe) UnsafeOwner o(boot, rank);
    else Owner o(boot, rank);
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    EXPECT(std::string(e.what()).find("fault") != std::string::npos);
    return 0;
  }
  return 4;
}

int hostile_frame(const std::string& dir, int rank) {
  FileBootstrap boot(dir, rank, 2, std::chrono::seconds(30));
  if (rank == 1) {  // the victim
    std::vector<char> heap(1 << 20, 0);
    CommandQueue queue(64, rank);
    TcpOptions o;
    o.timeout = std::chrono::milliseconds(5000);
    o.secret = job_secret(boot, "proxy");
    ProxyService svc(boot, "proxy", rank, {0, 1}, queue, std::make_unique<HostMemoryDomain>(heap.data(), heap.size()), o);
    for (int i = 0; i < 400; ++i) {
      try {
        svc.backend()->check();
      } catch (const Error& e) {
        EXPECT(std::string(e.what()).find("exceeds the cap") != std::string::npos);
        for (char c : heap) EXPECT(c == 0);
        return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return 5;
  }
  // rank 0, hostile: the right secret (it draws it), then a frame announcing 2^63 bytes
  const std::string secret = job_secret(boot, "proxy");
  const std::string addr = boot.get("proxy/tcp/1");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1))));
  ::inet_pton(AF_INET, addr.substr(0, addr.rfind(':')).c_str(), &a.sin_addr);
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT(::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  unsigned char hello[48] = {};
  const uint32_t magic = 0x746e6450, kind = 5;
  const uint64_t r = 0;
  std::memcpy(hello, &magic, 4);
  std::memcpy(hello + 4, &kind, 4);
  std::memcpy(hello + 8, &r, 8);
  std::memcpy(hello + 16, secret.data(), 32);
  EXPECT(::send(s, hello, sizeof(hello), 0) == sizeof(hello));
  unsigned char frame[128] = {};
  const uint32_t data_kind = 1, op = 1;
  const int32_t peer = 1;
  const uint64_t huge = 1ull << 63;
  std::memcpy(frame, &magic, 4);
  std::memcpy(frame + 4, &data_kind, 4);
  std::memcpy(frame + 64 + 8, &op, 4);
  std::memcpy(frame + 64 + 12, &peer, 4);
  std::memcpy(frame + 64 + 40, &huge, 8);
  EXPECT(::send(s, frame, sizeof(frame), 0) == sizeof(frame));
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ::close(s);
  return 0;
}

int queue_timeout() {
  CommandQueue q(2, 0);
  q.push(put(1, 0, 0, 8), std::chrono::milliseconds(100));
  q.push(put(1, 0, 0, 8), std::chrono::milliseconds(100));
  bool timed_out = false;
  try {
    q.push(put(1, 0, 0, 8), std::chrono::milliseconds(100));
  } catch (const Error& e) {
    timed_out = e.status() == Status::kTimeout;
  }
  EXPECT(timed_out && q.tail() == 2);
  Command c{};
  EXPECT(q.peek(0, &c) && q.peek(1, &c));
  q.release_until(2);
  EXPECT(q.push(put(1, 0, 0, 24), std::chrono::milliseconds(100)) == 2);
  EXPECT(q.peek(2, &c) && c.bytes == 24);
  return 0;
}

int monitor_strays(const std::string& dir, int rank) {
  FileBootstrap boot(dir, rank, 2, std::chrono::seconds(30));
  const std::string secret = job_secret(boot, "monitor");
  if (rank == 1) {  // also plays the stray once both monitors are up
    detail::PeerMonitor m(boot, "monitor", rank, {0, 1}, std::chrono::milliseconds(5000), nullptr, secret);
    const std::string session = boot.get("monitor/session/0");
    std::vector<int> socks;
    for (int i = 0; i < 40; ++i) {
      const int s = detail::connect_abstract_unix("tandem.mon." + session + ".0",
                                                  std::chrono::steady_clock::now() + std::chrono::seconds(5));
      EXPECT(s >= 0);
      if (i % 3 == 1) {  // a wrong secret, or half a hello
        auto h = detail::make_local_hello(1, std::string(32, 'x'));
        (void)!::send(s, &h, i % 2 ? sizeof(h) : 10, MSG_NOSIGNAL);
      }
      socks.push_back(s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(3000));
    for (int s : socks) ::close(s);
    boot.set("monitor/strays_done", "");
    EXPECT(m.exited_peer() == -1);
    boot.get("monitor/checked");
    return 0;
  }
  detail::PeerMonitor m(boot, "monitor", rank, {0, 1}, std::chrono::milliseconds(5000), nullptr, secret);
  boot.get("monitor/strays_done");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT(m.accepted() == 1 && m.refused() == 40 && m.exited_peer() == -1);
  boot.set("monitor/checked", "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string scenario = argv[1], dir = argv[2];
  if (scenario == "queue_timeout") return queue_timeout();
  std::vector<pid_t> kids;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int rc = 2;
      if (scenario == "fault_after_proxy") rc = fault_after_proxy(dir, rank, false);
      else if (scenario == "unsafe_order") rc = fault_after_proxy(dir, rank, true);
      else if (scenario == "hostile_frame") rc = hostile_frame(dir, rank);
      else if (scenario == "monitor_strays") rc = monitor_strays(dir, rank);
      std::exit(rc);  // runs LeakSanitizer too
    }
    kids.push_back(pid);
  }
  int rc = 0;
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}
