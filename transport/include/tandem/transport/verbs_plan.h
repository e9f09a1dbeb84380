// tandem transport — RDMA verbs: turning proxy commands into work requests (pure logic, no libibverbs).
//
// The verbs backend splits in two (docs/transports.md): pyverbs owns the resources (device, PD, CQ, RC QPs,
// memory registration, INIT -> RTR -> RTS) and posts; this planner decides *what* to post, and is where the
// ordering and flow-control rules live, so they are unit-tested without a NIC:
//  * put: RDMA WRITEs of at most max_wr_bytes, heap offset -> registered address.
//  * put_signal / signal with kSet: the data WRITEs, then an 8-byte inline RDMA WRITE of the value to the flag
//    on the same QP (RC places a QP's writes in order, so the flag lands after the data).
//  * kAdd: an 8-byte ATOMIC_FETCH_AND_ADD on the flag (fenced), its old value into a local scratch word.
//  * (peer, channel) -> QP channel % qps_per_peer: commands of one channel share a QP and keep their order.
//  * batches of at most max_batch WRs per post; a WR is signaled every signal_every WRs per QP and at every
//    flush, and a QP never has more than sq_depth WRs outstanding (unsignaled ones included).
//  * completions are in order per QP: a signaled WR's completion retires every ticket whose last WR precedes it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "tandem/transport/proxy_command.h"

namespace tandem::verbs {

enum class WrOpcode : uint8_t { kRdmaWrite = 0, kRdmaWriteInline = 1, kAtomicFetchAdd = 2 };

struct Wr {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::kRdmaWrite;
  uint64_t local_addr = 0;   // kRdmaWrite: source; kAtomicFetchAdd: 8-byte result buffer
  uint32_t lkey = 0;
  uint32_t length = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t value = 0;        // inline payload (kRdmaWriteInline) or addend (kAtomicFetchAdd)
  bool signaled = false;
  bool fence = false;
};

struct LocalRegion {
  uint64_t base = 0;          // address of this rank's heap as registered
  uint32_t lkey = 0;
  uint64_t bytes = 0;
  uint64_t scratch_addr = 0;  // registered 8-byte word for atomic results
  uint32_t scratch_lkey = 0;
};

struct RemoteRegion {
  uint64_t base = 0;  // the peer's heap as the peer registered it
  uint32_t rkey = 0;
  uint64_t bytes = 0;
};

struct PlanOptions {
  uint32_t qps_per_peer = 4;
  uint32_t max_batch = 8;
  uint32_t signal_every = 16;
  uint32_t sq_depth = 2048;
  uint32_t max_wr_bytes = 1u << 30;
};

struct PostBatch {
  int peer = -1;
  uint32_t qp = 0;  // index within the peer's QPs
  std::vector<Wr> wrs;
};

class WrPlanner {
 public:
  WrPlanner(const LocalRegion& local, std::map<int, RemoteRegion> peers, const PlanOptions& options);

  // Append the WRs of command `ticket`. Throws tandem::Error (kInvalidArgument) for an unknown peer or a range
  // outside either heap.
  void add(const proxy::Command& c, uint64_t ticket);
  // Batches to post now: full ones (max_batch WRs), or everything pending when `flush`; never more than the
  // send queue can take (the rest waits for completions).
  std::vector<PostBatch> take(bool flush);
  // A signaled WR completed: the tickets it retires, ascending.
  std::vector<uint64_t> complete(uint64_t wr_id);
  uint32_t outstanding(int peer, uint32_t qp) const;
  static int wr_peer(uint64_t wr_id) { return static_cast<int>(wr_id >> 40); }
  static uint32_t wr_qp(uint64_t wr_id) { return static_cast<uint32_t>((wr_id >> 32) & 0xff); }

 private:
  struct Qp {
    std::vector<Wr> pending;             // built, not yet posted
    std::deque<std::pair<uint64_t, int64_t>> posted;  // (wr_id, ticket completed by this WR or -1)
    std::vector<int64_t> pending_ticket;  // parallel to `pending`
    uint32_t since_signal = 0;
    uint32_t seq = 0;
  };
  Qp& qp(int peer, uint32_t index);
  void emit(int peer, uint32_t q, Wr wr, int64_t ticket_done);

  LocalRegion local_;
  std::map<int, RemoteRegion> peers_;
  PlanOptions options_;
  std::map<std::pair<int, uint32_t>, Qp> qps_;
};

}  // namespace tandem::verbs
