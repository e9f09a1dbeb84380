// tandem transport — the command format of the GPU -> CPU proxy queue (plain C++, shared with device code).
//
// Producers (GPU threads, or host threads) take a ticket, wait until the ring has room (back-pressure: the
// proxy publishes how far it has consumed), write the command body, then publish it by storing `seq = ticket
// + 1` last with release ordering. The proxy consumes tickets strictly in order, so commands to the same peer
// leave in the order of their tickets.
#pragma once

#include <cstdint>

namespace tandem::proxy {

enum class CommandOp : uint32_t {
  kPut = 1,        // bytes from src_offset (local heap) to dst_offset (peer heap)
  kPutSignal = 2,  // kPut, then the signal, applied after the data at the destination
  kSignal = 3,     // only the signal
};

struct alignas(64) Command {
  uint64_t seq;          // ticket + 1; 0 while the slot is not (yet) published
  uint32_t op;           // CommandOp
  int32_t peer;          // destination rank
  uint16_t channel;      // ordering domain (commands of one (peer, channel) stay in order)
  uint16_t flags;        // kFlagAck: the destination acknowledges this frame (set by the proxy)
  uint32_t signal_op;    // 0 = set, 1 = add (device::SignalOp)
  uint64_t src_offset;   // in this rank's symmetric heap
  uint64_t dst_offset;   // in the peer's symmetric heap
  uint64_t bytes;
  uint64_t sig_offset;   // in the peer's symmetric heap
  uint64_t sig_value;
};
constexpr uint16_t kFlagAck = 1;
static_assert(sizeof(Command) == 64, "one command per 64-byte line");

// Control block of one queue: `tail` is where producers take tickets, `head` how far the proxy has consumed
// (slots below it may be reused), `retired` how many commands are complete at their destination (quiet waits
// on it), `error` a Status set by the proxy when it stops on a failure.
struct alignas(64) QueueControl {
  uint64_t tail;
  uint64_t pad0[7];
  uint64_t head;
  uint64_t pad1[7];
  uint64_t retired;
  uint64_t pad2[7];
  int32_t error;
  int32_t error_peer;
  uint64_t pad3[7];
};

}  // namespace tandem::proxy
