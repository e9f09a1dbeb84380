// Bindings of the host-side proxy path (command queue + proxy thread + TCP backend) over host memory: what the
// CPU tests drive between processes in separate network namespaces.
#include <pybind11/stl.h>

#include <atomic>
#include <map>
#include <memory>
#include <thread>

#include "common.h"
#include "tandem/transport/proxy.h"

namespace tandem_py {

namespace {

using namespace tandem::proxy;

class ProxyEndpoint {
 public:
  ProxyEndpoint(const std::string& dir, int rank, int world, const std::string& host, py::buffer heap,
                uint32_t capacity, double timeout_s)
      : rank_(rank), timeout_(static_cast<int64_t>(timeout_s * 1000)) {
    py::buffer_info info = heap.request(true);
    heap_ref_ = heap;
    base_ = static_cast<char*>(info.ptr);
    bytes_ = static_cast<uint64_t>(info.size * info.itemsize);
    py::gil_scoped_release nogil;
    boot_ = std::make_unique<tandem::FileBootstrap>(dir, rank, world, std::chrono::milliseconds(timeout_ * 6));
    queue_ = std::make_unique<CommandQueue>(capacity, rank);
    std::vector<int> peers(world);
    for (int r = 0; r < world; ++r) peers[r] = r;
    TcpOptions o;
    o.listen_host = host;
    o.timeout = timeout_;
    o.secret = tandem::job_secret(*boot_, "proxy");  // rank 0 draws it; key "proxy/secret"
    service_ = std::make_unique<ProxyService>(*boot_, "proxy", rank, peers, *queue_,
                                              std::make_unique<HostMemoryDomain>(base_, bytes_), o);
    proxy_ = service_->proxy();
    backend_ = service_->backend();
    // The same test hook as the communicator's: this constructor fails with the proxy running, and the members
    // (service_ first: proxy thread, then backend threads) must come down without a use after free.
    if (fault_injected("TANDEM_TEST_FAIL_AFTER_PROXY", rank))
      throw tandem::Error(tandem::Status::kInternal, "proxy_endpoint.init", rank, -1,
                          "fault injected after the proxy started (TANDEM_TEST_FAIL_AFTER_PROXY)");
  }
  ~ProxyEndpoint() { close(); }

  uint64_t push(CommandOp op, int peer, uint64_t src, uint64_t dst, uint64_t n, uint64_t sig, uint64_t value,
                uint32_t sop) {
    Command c{};
    c.op = static_cast<uint32_t>(op);
    c.peer = peer;
    c.src_offset = src;
    c.dst_offset = dst;
    c.bytes = n;
    c.sig_offset = sig;
    c.sig_value = value;
    c.signal_op = sop;
    py::gil_scoped_release nogil;
    return queue_->push(c, timeout_);
  }

  void quiet() {
    py::gil_scoped_release nogil;
    queue_->wait_retired(queue_->tail(), timeout_);
  }

  // Host-side wait on a flag of this rank's heap (acquire), bounded by `timeout_s`. Returns the value seen.
  uint64_t wait_ge(uint64_t off, uint64_t value, double timeout_s) {
    py::gil_scoped_release nogil;
    auto& f = *reinterpret_cast<uint64_t*>(base_ + off);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    for (uint32_t i = 0;; ++i) {
      const uint64_t v = std::atomic_ref<uint64_t>(f).load(std::memory_order_acquire);
      if (v >= value) return v;
      if ((i & 1023) == 0) {
        backend_->check();
        if (std::chrono::steady_clock::now() > deadline)
          throw tandem::Error(tandem::Status::kTimeout, "proxy.wait", rank_, -1,
                              "flag at " + std::to_string(off) + " is " + std::to_string(v) + ", waited for " +
                                  std::to_string(value));
        std::this_thread::yield();
      }
    }
  }

  // Sender side of the ordering test: `count` put_signals of one 8-byte log entry each (entry j = j + 1 at
  // log_off + 8 j), every one adding 1 to the peer's counter.
  void stream_log(int peer, uint64_t log_off, uint64_t counter_off, uint64_t count) {
    py::gil_scoped_release nogil;
    for (uint64_t j = 0; j < count; ++j) {
      std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base_ + log_off + 8 * j)).store(j + 1);
      Command c{};
      c.op = static_cast<uint32_t>(CommandOp::kPutSignal);
      c.peer = peer;
      c.src_offset = c.dst_offset = log_off + 8 * j;
      c.bytes = 8;
      c.sig_offset = counter_off;
      c.sig_value = 1;
      c.signal_op = 1;
      queue_->push(c, timeout_);
    }
  }

  // Sender side with several peers, interleaved: round j sends entry j + 1 to every peer in turn, into this
  // rank's own log slice there (log_off + 8 (rank count + j)), adding 1 to the peer's counter[rank].
  void stream_log_multi(const std::vector<int>& peers, uint64_t log_off, uint64_t counter_off, uint64_t count) {
    py::gil_scoped_release nogil;
    for (uint64_t j = 0; j < count; ++j) {
      const uint64_t src = log_off + 8 * (rank_ * count + j);
      std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base_ + src)).store(j + 1);
      for (int peer : peers) {
        Command c{};
        c.op = static_cast<uint32_t>(CommandOp::kPutSignal);
        c.peer = peer;
        c.src_offset = c.dst_offset = src;
        c.bytes = 8;
        c.sig_offset = counter_off + 8 * static_cast<uint64_t>(rank_);
        c.sig_value = 1;
        c.signal_op = 1;
        queue_->push(c, timeout_);
      }
    }
  }

  // Receiver side: poll the counter until it reaches `count`; every time it reads c, the first c log entries
  // must all be there (in-order delivery, data before flag). Returns (violations, polls).
  std::pair<uint64_t, uint64_t> verify_log(uint64_t log_off, uint64_t counter_off, uint64_t count) {
    py::gil_scoped_release nogil;
    auto* log = reinterpret_cast<uint64_t*>(base_ + log_off);
    auto& counter = *reinterpret_cast<uint64_t*>(base_ + counter_off);
    uint64_t checked = 0, violations = 0, polls = 0;
    auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (checked < count) {
      const uint64_t c = std::atomic_ref<uint64_t>(counter).load(std::memory_order_acquire);
      ++polls;
      if (c > checked) {
        for (uint64_t j = checked; j < c && j < count; ++j)
          violations += std::atomic_ref<uint64_t>(log[j]).load(std::memory_order_relaxed) != j + 1;
        checked = c;
        deadline = std::chrono::steady_clock::now() + timeout_;
      } else if (std::chrono::steady_clock::now() > deadline) {
        throw tandem::Error(tandem::Status::kTimeout, "proxy.verify", rank_, -1,
                            "counter stuck at " + std::to_string(c) + " of " + std::to_string(count));
      } else {
        backend_->check();
      }
    }
    return {violations, polls};
  }

  void check() {
    if (backend_ == nullptr) throw tandem::Error(tandem::Status::kInvalidArgument, "proxy", rank_, -1, "endpoint closed");
    backend_->check();  // the root cause (a lost link) if there is one
    int peer = -1;
    std::string what;
    const auto s = proxy_->status(&peer, &what);
    if (s != tandem::Status::kOk) throw tandem::Error(s, "proxy", rank_, peer, "proxy stopped: " + what);
  }

  void close() {
    py::gil_scoped_release nogil;
    // Drain first: every command pushed so far reaches its destination before the proxy stops.
    if (proxy_ && proxy_->status() == tandem::Status::kOk) {
      try {
        queue_->wait_retired(queue_->tail(), timeout_);
      } catch (const tandem::Error&) {
      }
    }
    if (backend_ != nullptr) refused_at_close_ = backend_->refused();
    service_.reset();  // proxy thread, then backend threads
    proxy_ = nullptr;
    backend_ = nullptr;
  }

  uint64_t retired() const { return queue_->retired(); }
  uint64_t tail() const { return queue_->tail(); }
  int refused() const { return backend_ != nullptr ? backend_->refused() : refused_at_close_; }

 private:
  int rank_;
  std::chrono::milliseconds timeout_;
  py::object heap_ref_;
  char* base_ = nullptr;
  uint64_t bytes_ = 0;
  std::unique_ptr<tandem::FileBootstrap> boot_;
  std::unique_ptr<CommandQueue> queue_;
  std::unique_ptr<ProxyService> service_;  // declared after queue_: destroyed first (it drains queue_)
  Proxy* proxy_ = nullptr;                 // owned by service_
  TcpBackend* backend_ = nullptr;          // owned by service_
  int refused_at_close_ = 0;
};

const char* op_name(uint32_t op) {
  switch (static_cast<CommandOp>(op)) {
    case CommandOp::kPut: return "put";
    case CommandOp::kPutSignal: return "put_signal";
    case CommandOp::kSignal: return "signal";
  }
  return "unknown";
}

}  // namespace

uint32_t command_op_code(const std::string& op, const char* where, int peer) {
  static const std::map<std::string, CommandOp> ops{
      {"put", CommandOp::kPut}, {"put_signal", CommandOp::kPutSignal}, {"signal", CommandOp::kSignal}};
  const auto it = ops.find(op);
  if (it == ops.end())
    throw tandem::Error(tandem::Status::kInvalidArgument, where, -1, peer,
                        "op must be 'put', 'put_signal' or 'signal', got '" + op + "'");
  return static_cast<uint32_t>(it->second);
}

uint32_t signal_op_code(const std::string& signal_op, const char* where, int peer) {
  if (signal_op != "set" && signal_op != "add")
    throw tandem::Error(tandem::Status::kInvalidArgument, where, -1, peer,
                        "signal_op must be 'set' or 'add', got '" + signal_op + "'");
  return signal_op == "add" ? 1u : 0u;
}

void bind_proxy(py::module_& m) {
  // The command ring on its own: producers push, a consumer written in Python (the verbs proxy, whose QPs
  // pyverbs owns) peeks in ticket order, releases slots and publishes the retired watermark.
  py::class_<CommandQueue>(m, "CommandQueue", "Command ring in host memory (producer and consumer sides).")
      .def(py::init<uint32_t, int>(), py::arg("capacity"), py::arg("rank") = -1)
      .def(
          "push",
          [](CommandQueue& q, const std::string& op, int peer, uint64_t src, uint64_t dst, uint64_t n, uint64_t sig,
             uint64_t value, const std::string& signal_op, uint16_t channel, double timeout_s) {
            Command c{};
            c.op = command_op_code(op, "proxy.push", peer);
            c.peer = peer;
            c.channel = channel;
            c.src_offset = src;
            c.dst_offset = dst;
            c.bytes = n;
            c.sig_offset = sig;
            c.sig_value = value;
            c.signal_op = signal_op_code(signal_op, "proxy.push", peer);
            py::gil_scoped_release nogil;
            return q.push(c, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
          },
          py::arg("op"), py::arg("peer"), py::arg("src") = 0, py::arg("dst") = 0, py::arg("nbytes") = 0,
          py::arg("sig") = 0, py::arg("value") = 0, py::arg("signal_op") = "set", py::arg("channel") = 0,
          py::arg("timeout_s") = 10.0)
      .def(
          "peek",
          [](const CommandQueue& q, uint64_t ticket) -> py::object {
            Command c{};
            if (!q.peek(ticket, &c)) return py::none();
            py::dict d;
            d["op"] = op_name(c.op);
            d["peer"] = c.peer;
            d["channel"] = c.channel;
            d["signal_op"] = c.signal_op == 1 ? "add" : "set";
            d["src"] = c.src_offset;
            d["dst"] = c.dst_offset;
            d["bytes"] = c.bytes;
            d["sig"] = c.sig_offset;
            d["value"] = c.sig_value;
            return d;
          },
          py::arg("ticket"))
      .def("release_until", &CommandQueue::release_until, py::arg("head"))
      .def("retire_until", &CommandQueue::retire_until, py::arg("retired"))
      .def(
          "fail", [](CommandQueue& q, int status, int peer) { q.fail(static_cast<tandem::Status>(status), peer); },
          py::arg("status"), py::arg("peer"))
      .def(
          "wait_retired",
          [](const CommandQueue& q, uint64_t end, double timeout_s) {
            py::gil_scoped_release nogil;
            q.wait_retired(end, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
          },
          py::arg("ticket_end"), py::arg("timeout_s") = 10.0)
      .def_property_readonly("capacity", &CommandQueue::capacity)
      .def_property_readonly("retired", &CommandQueue::retired)
      .def_property_readonly("tail", &CommandQueue::tail);

  py::class_<ProxyEndpoint>(m, "ProxyEndpoint",
                            "One rank of the proxy path over host memory (tests, CPU-only ranks).")
      .def(py::init<const std::string&, int, int, const std::string&, py::buffer, uint32_t, double>(),
           py::arg("bootstrap_dir"), py::arg("rank"), py::arg("world"), py::arg("host"), py::arg("heap"),
           py::arg("capacity") = 1024, py::arg("timeout_s") = 10.0)
      .def(
          "put",
          [](ProxyEndpoint& e, int peer, uint64_t src, uint64_t dst, uint64_t n) {
            return e.push(CommandOp::kPut, peer, src, dst, n, 0, 0, 0);
          },
          py::arg("peer"), py::arg("src"), py::arg("dst"), py::arg("nbytes"))
      .def(
          "put_signal",
          [](ProxyEndpoint& e, int peer, uint64_t src, uint64_t dst, uint64_t n, uint64_t sig, uint64_t value,
             uint32_t op) { return e.push(CommandOp::kPutSignal, peer, src, dst, n, sig, value, op); },
          py::arg("peer"), py::arg("src"), py::arg("dst"), py::arg("nbytes"), py::arg("sig"), py::arg("value"),
          py::arg("op") = 0)
      .def(
          "signal",
          [](ProxyEndpoint& e, int peer, uint64_t sig, uint64_t value, uint32_t op) {
            return e.push(CommandOp::kSignal, peer, 0, 0, 0, sig, value, op);
          },
          py::arg("peer"), py::arg("sig"), py::arg("value"), py::arg("op") = 0)
      .def("quiet", &ProxyEndpoint::quiet)
      .def("wait_ge", &ProxyEndpoint::wait_ge, py::arg("offset"), py::arg("value"), py::arg("timeout_s"))
      .def("stream_log", &ProxyEndpoint::stream_log, py::arg("peer"), py::arg("log_offset"),
           py::arg("counter_offset"), py::arg("count"))
      .def("stream_log_multi", &ProxyEndpoint::stream_log_multi, py::arg("peers"), py::arg("log_offset"),
           py::arg("counter_offset"), py::arg("count"))
      .def("verify_log", &ProxyEndpoint::verify_log, py::arg("log_offset"), py::arg("counter_offset"),
           py::arg("count"))
      .def("check", &ProxyEndpoint::check)
      .def("close", &ProxyEndpoint::close)
      .def_property_readonly("retired", &ProxyEndpoint::retired)
      .def_property_readonly("tail", &ProxyEndpoint::tail)
      .def_property_readonly("refused", &ProxyEndpoint::refused,
                             "Connections the TCP listener refused during setup (stray, wrong secret, bad rank).");
}

}  // namespace tandem_py
