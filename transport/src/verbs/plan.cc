#include "tandem/transport/verbs_plan.h"

#include <algorithm>

#include "tandem/transport/status.h"

namespace tandem::verbs {

namespace {
[[noreturn]] void bad(int peer, const std::string& what) {
  throw Error(Status::kInvalidArgument, "verbs.plan", -1, peer, what);
}
}  // namespace

WrPlanner::WrPlanner(const LocalRegion& local, std::map<int, RemoteRegion> peers, const PlanOptions& options)
    : local_(local), peers_(std::move(peers)), options_(options) {
  if (options_.qps_per_peer == 0 || options_.qps_per_peer > 255 || options_.max_batch == 0 ||
      options_.signal_every == 0 || options_.sq_depth < 2 * options_.signal_every || options_.max_wr_bytes == 0)
    bad(-1, "plan options out of range (sq_depth must hold two signal intervals)");
}

WrPlanner::Qp& WrPlanner::qp(int peer, uint32_t index) { return qps_[{peer, index}]; }

void WrPlanner::emit(int peer, uint32_t q, Wr wr, int64_t ticket_done) {
  Qp& s = qp(peer, q);
  wr.wr_id = (static_cast<uint64_t>(peer) << 40) | (static_cast<uint64_t>(q) << 32) | s.seq++;
  s.pending.push_back(wr);
  s.pending_ticket.push_back(ticket_done);
}

void WrPlanner::add(const proxy::Command& c, uint64_t ticket) {
  auto it = peers_.find(c.peer);
  if (it == peers_.end()) bad(c.peer, "no registered memory for this peer");
  const RemoteRegion& remote = it->second;
  const uint32_t q = c.channel % options_.qps_per_peer;
  const auto op = static_cast<proxy::CommandOp>(c.op);
  const bool has_data = op != proxy::CommandOp::kSignal && c.bytes > 0;
  const bool has_signal = op != proxy::CommandOp::kPut;
  if (has_data && (c.src_offset > local_.bytes || c.bytes > local_.bytes - c.src_offset))
    bad(c.peer, "source range outside this rank's registered heap");
  if (has_data && (c.dst_offset > remote.bytes || c.bytes > remote.bytes - c.dst_offset))
    bad(c.peer, "destination range outside the peer's registered heap");
  if (has_signal && (c.sig_offset % 8 != 0 || c.sig_offset + 8 > remote.bytes))
    bad(c.peer, "flag outside the peer's heap or not 8-byte aligned");

  if (has_data) {
    for (uint64_t off = 0; off < c.bytes; off += options_.max_wr_bytes) {
      const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(options_.max_wr_bytes, c.bytes - off));
      Wr w;
      w.opcode = WrOpcode::kRdmaWrite;
      w.local_addr = local_.base + c.src_offset + off;
      w.lkey = local_.lkey;
      w.length = n;
      w.remote_addr = remote.base + c.dst_offset + off;
      w.rkey = remote.rkey;
      const bool last = off + n >= c.bytes && !has_signal;
      emit(c.peer, q, w, last ? static_cast<int64_t>(ticket) : -1);
    }
  }
  if (has_signal) {
    Wr w;
    w.remote_addr = remote.base + c.sig_offset;
    w.rkey = remote.rkey;
    w.length = 8;
    w.value = c.sig_value;
    if (c.signal_op == 0) {
      w.opcode = WrOpcode::kRdmaWriteInline;
    } else {
      w.opcode = WrOpcode::kAtomicFetchAdd;
      w.local_addr = local_.scratch_addr;
      w.lkey = local_.scratch_lkey;
      w.fence = true;
    }
    emit(c.peer, q, w, static_cast<int64_t>(ticket));
  }
  if (!has_data && !has_signal) {  // an empty put still completes its ticket: a zero-length write
    Wr w;
    w.remote_addr = remote.base;
    w.rkey = remote.rkey;
    emit(c.peer, q, w, static_cast<int64_t>(ticket));
  }
}

std::vector<PostBatch> WrPlanner::take(bool flush) {
  std::vector<PostBatch> out;
  for (auto& [key, s] : qps_) {
    size_t i = 0;
    while (i < s.pending.size()) {
      const size_t room = options_.sq_depth - std::min<size_t>(options_.sq_depth, s.posted.size());
      size_t n = std::min<size_t>({s.pending.size() - i, options_.max_batch, room});
      if (n == 0) break;
      if (n < options_.max_batch && !flush) break;  // wait for a full batch unless flushing
      PostBatch b;
      b.peer = key.first;
      b.qp = key.second;
      for (size_t k = 0; k < n; ++k) {
        Wr w = s.pending[i + k];
        const bool last_of_flush = flush && i + k + 1 == s.pending.size();
        const bool near_full = s.posted.size() + k + 1 >= options_.sq_depth;
        if (++s.since_signal >= options_.signal_every || last_of_flush || near_full) {
          w.signaled = true;
          s.since_signal = 0;
        }
        b.wrs.push_back(w);
      }
      for (size_t k = 0; k < n; ++k) s.posted.emplace_back(b.wrs[k].wr_id, s.pending_ticket[i + k]);
      i += n;
      out.push_back(std::move(b));
    }
    s.pending.erase(s.pending.begin(), s.pending.begin() + static_cast<std::ptrdiff_t>(i));
    s.pending_ticket.erase(s.pending_ticket.begin(), s.pending_ticket.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return out;
}

std::vector<uint64_t> WrPlanner::complete(uint64_t wr_id) {
  auto it = qps_.find({wr_peer(wr_id), wr_qp(wr_id)});
  if (it == qps_.end()) bad(wr_peer(wr_id), "completion for an unknown QP");
  Qp& s = it->second;
  std::vector<uint64_t> retired;
  // In-order completion per QP: everything up to and including wr_id is done.
  while (!s.posted.empty()) {
    const auto [id, ticket] = s.posted.front();
    s.posted.pop_front();
    if (ticket >= 0) retired.push_back(static_cast<uint64_t>(ticket));
    if (id == wr_id) return retired;
  }
  bad(wr_peer(wr_id), "completion for a WR that was not posted");
}

uint32_t WrPlanner::outstanding(int peer, uint32_t q) const {
  auto it = qps_.find({peer, q});
  return it == qps_.end() ? 0 : static_cast<uint32_t>(it->second.posted.size());
}

}  // namespace tandem::verbs
