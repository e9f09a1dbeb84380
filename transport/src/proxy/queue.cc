// Command queue and host memory domain of the proxy path.
#include <atomic>
#include <cstring>
#include <thread>

#include "tandem/transport/proxy.h"

namespace tandem::proxy {

namespace {

template <class T>
std::atomic_ref<T> ref(T& v) {
  return std::atomic_ref<T>(v);
}

}  // namespace

void MemoryDomain::check_range(uint64_t offset, uint64_t n, const char* op) const {
  if (offset > bytes() || n > bytes() - offset)
    throw Error(Status::kInvalidArgument, op, -1, -1,
                "range [" + std::to_string(offset) + ", +" + std::to_string(n) + ") outside the heap of " +
                    std::to_string(bytes()) + " bytes");
}

void MemoryDomain::check_flag(uint64_t offset, const char* op) const {
  check_range(offset, sizeof(uint64_t), op);
  if (offset % alignof(uint64_t) != 0)
    throw Error(Status::kInvalidArgument, op, -1, -1, "flag offset not 8-byte aligned");
}

void HostMemoryDomain::read(uint64_t offset, void* dst, uint64_t n) {
  check_range(offset, n, "proxy.memory");
  std::memcpy(dst, base_ + offset, n);
}

void HostMemoryDomain::write(uint64_t offset, const void* src, uint64_t n) {
  check_range(offset, n, "proxy.memory");
  std::memcpy(base_ + offset, src, n);
}

void HostMemoryDomain::signal(uint64_t offset, uint64_t value, uint32_t op) {
  check_flag(offset, "proxy.memory");
  auto& flag = *reinterpret_cast<uint64_t*>(base_ + offset);
  if (op == 0) ref(flag).store(value, std::memory_order_release);
  else ref(flag).fetch_add(value, std::memory_order_release);
}

CommandQueue::CommandQueue(uint32_t capacity, int rank, Command* slots, QueueControl* control)
    : capacity_(capacity), rank_(rank), slots_(slots), control_(control) {
  if (capacity == 0 || (capacity & (capacity - 1)) != 0)
    throw Error(Status::kInvalidArgument, "proxy.queue", -1, -1, "capacity must be a power of two");
  if (slots_ == nullptr) {
    owns_ = true;
    slots_ = new Command[capacity_]();
    control_ = new QueueControl();
  }
}

CommandQueue::~CommandQueue() {
  if (owns_) {
    delete[] slots_;
    delete control_;
  }
}

uint64_t CommandQueue::push(const Command& c, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Back-pressure: the slot of ticket t is free once the proxy has consumed t - capacity. A ticket is taken
  // (tail advanced) only when its slot is already free, so no wait follows the reservation: a producer that
  // gives up holds no ticket, and the proxy, which consumes strictly in ticket order, never waits forever for
  // a slot that nobody will publish.
  uint64_t ticket = ref(control_->tail).load(std::memory_order_relaxed);
  for (uint32_t spins = 0;; ++spins) {
    if (ref(control_->error).load(std::memory_order_acquire) != 0)
      throw Error(Status::kAborted, "proxy.push", rank_, ref(control_->error_peer).load(), "the proxy stopped on an error");
    if (ticket - ref(control_->head).load(std::memory_order_acquire) < capacity_) {
      if (ref(control_->tail).compare_exchange_weak(ticket, ticket + 1, std::memory_order_relaxed)) break;
      continue;  // another producer took it (`ticket` now holds the current tail)
    }
    if (spins > 64) std::this_thread::yield();
    if ((spins & 1023) == 0 && std::chrono::steady_clock::now() > deadline)
      throw Error(Status::kTimeout, "proxy.push", rank_, c.peer,
                  "command queue stayed full for " + std::to_string(timeout.count()) + " ms (command not enqueued)");
    ticket = ref(control_->tail).load(std::memory_order_relaxed);
  }
  Command& slot = slots_[ticket & (capacity_ - 1)];
  Command body = c;
  body.seq = 0;
  std::memcpy(reinterpret_cast<char*>(&slot) + sizeof(uint64_t), reinterpret_cast<const char*>(&body) + sizeof(uint64_t),
              sizeof(Command) - sizeof(uint64_t));
  ref(slot.seq).store(ticket + 1, std::memory_order_release);  // publish: header last
  return ticket;
}

bool CommandQueue::peek(uint64_t ticket, Command* out) const {
  Command& slot = slots_[ticket & (capacity_ - 1)];
  if (ref(slot.seq).load(std::memory_order_acquire) != ticket + 1) return false;
  std::memcpy(out, &slot, sizeof(Command));
  return true;
}

void CommandQueue::release_until(uint64_t head) { ref(control_->head).store(head, std::memory_order_release); }
void CommandQueue::retire_until(uint64_t retired) { ref(control_->retired).store(retired, std::memory_order_release); }
void CommandQueue::fail(Status status, int peer) {
  ref(control_->error_peer).store(peer);
  ref(control_->error).store(static_cast<int32_t>(status), std::memory_order_release);
}
uint64_t CommandQueue::retired() const { return ref(control_->retired).load(std::memory_order_acquire); }
uint64_t CommandQueue::tail() const { return ref(control_->tail).load(std::memory_order_acquire); }

void CommandQueue::wait_retired(uint64_t ticket_end, std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (uint32_t spins = 0; retired() < ticket_end; ++spins) {
    if (ref(control_->error).load(std::memory_order_acquire) != 0)
      throw Error(Status::kAborted, "proxy.quiet", rank_, ref(control_->error_peer).load(), "the proxy stopped on an error");
    if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
    if ((spins & 255) == 0 && std::chrono::steady_clock::now() > deadline)
      throw Error(Status::kTimeout, "proxy.quiet", rank_, -1,
                  "commands not complete: retired " + std::to_string(retired()) + " of " + std::to_string(ticket_end));
  }
}

}  // namespace tandem::proxy
