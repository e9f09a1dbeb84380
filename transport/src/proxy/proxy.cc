// The proxy thread: queue -> backend, acks -> retired watermark.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tandem/transport/proxy.h"

namespace tandem::proxy {

namespace {
constexpr uint64_t kChunkBytes = kMaxFramePayload;  // large puts leave as 4 MiB frames; the last one carries the signal
}

bool fault_injected(const char* name, int rank) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return false;
  const std::string s(v);
  if (s == "all") return true;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    if (s.substr(pos, comma - pos) == std::to_string(rank)) return true;
    pos = comma + 1;
  }
  return false;
}

ProxyService::ProxyService(Bootstrap& bootstrap, const std::string& tag, int rank, const std::vector<int>& peers,
                           CommandQueue& queue, std::unique_ptr<MemoryDomain> domain, const TcpOptions& options,
                           std::function<void()> on_error)
    : domain_(std::move(domain)) {
  try {
    proxy_ = std::make_unique<Proxy>(rank, queue, *domain_);
    backend_ = std::make_unique<TcpBackend>(bootstrap, tag, rank, peers, *domain_, options,
                                            [p = proxy_.get()](int peer, uint64_t t) { p->on_ack(peer, t); });
    proxy_->start(backend_.get(), std::move(on_error));
  } catch (...) {
    close();  // a throwing constructor runs no destructor
    throw;
  }
}

ProxyService::~ProxyService() { close(); }

void ProxyService::close() noexcept {
  if (proxy_) proxy_->stop();         // 1. no more calls into the backend
  if (backend_) backend_->shutdown(); // 2. no more acks into the proxy, no more writes into the domain
  backend_.reset();
  proxy_.reset();
  domain_.reset();
}

Proxy::Proxy(int rank, CommandQueue& queue, MemoryDomain& local) : rank_(rank), queue_(queue), local_(local) {
  acked_.assign(queue_.capacity(), 0);
}

Proxy::~Proxy() { stop(); }

void Proxy::start(Backend* backend, std::function<void()> on_error) {
  backend_ = backend;
  on_error_ = std::move(on_error);
  thread_ = std::thread([this] { run(); });
}

void Proxy::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void Proxy::on_ack(int, uint64_t ticket) {
  std::lock_guard<std::mutex> g(mu_);
  acked_[ticket & (acked_.size() - 1)] = ticket + 1;
  uint64_t r = retired_;
  while (acked_[r & (acked_.size() - 1)] == r + 1) ++r;
  if (r != retired_) {
    retired_ = r;
    queue_.retire_until(r);
  }
}

Status Proxy::status(int* peer, std::string* what) const {
  std::lock_guard<std::mutex> g(mu_);
  if (peer) *peer = error_peer_;
  if (what) *what = error_what_;
  return error_;
}

void Proxy::run() {
  std::vector<char> staging;
  uint64_t next = 0;
  const uint64_t window = queue_.capacity();
  uint32_t idle = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    Command cmd{};
    try {
      // Unacked commands are bounded by the ring's capacity (the ack window above has that many entries).
      if (next - queue_.retired() >= window || !queue_.peek(next, &cmd)) {
        if ((++idle & 255) == 0) backend_->check();  // a receive thread may have lost its link
        std::this_thread::yield();
        continue;
      }
      idle = 0;
      const auto op = static_cast<CommandOp>(cmd.op);
      if (op != CommandOp::kPut && op != CommandOp::kPutSignal && op != CommandOp::kSignal)
        throw Error(Status::kInvalidArgument, "proxy", rank_, cmd.peer,
                    "command " + std::to_string(next) + " has unknown op " + std::to_string(cmd.op));
      if (op == CommandOp::kSignal || cmd.bytes == 0) {
        Command c = cmd;
        c.op = static_cast<uint32_t>(op == CommandOp::kPut ? CommandOp::kPut : CommandOp::kSignal);
        c.flags = kFlagAck;
        backend_->send(c, next, nullptr);
      } else {
        for (uint64_t off = 0; off < cmd.bytes; off += kChunkBytes) {
          const uint64_t n = std::min(kChunkBytes, cmd.bytes - off);
          const bool last = off + n == cmd.bytes;
          staging.resize(n);
          local_.read(cmd.src_offset + off, staging.data(), n);
          Command c = cmd;
          c.src_offset += off;
          c.dst_offset += off;
          c.bytes = n;
          c.op = static_cast<uint32_t>(last ? op : CommandOp::kPut);
          c.flags = last ? kFlagAck : 0;
          backend_->send(c, next, staging.data());
        }
      }
      ++next;
      queue_.release_until(next);
    } catch (const Error& e) {
      std::lock_guard<std::mutex> g(mu_);
      error_ = e.status();
      error_peer_ = e.peer() >= 0 ? e.peer() : cmd.peer;
      error_what_ = e.what();
      queue_.fail(error_, error_peer_);
      if (on_error_) on_error_();
      return;
    }
  }
}

}  // namespace tandem::proxy
