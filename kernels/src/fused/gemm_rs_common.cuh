// GEMM+RS/AR (gemm_rs_sm90.cu), what its roles share: the kernel's parameters (RsParams), its modes and limits,
// the timeline slots, the chunk order, and the flags that tell a chunk's reducer that a partial is complete
// (announce_chunk; publish_piece_prefix for pieces with tile claims). The protocol is at the top of
// gemm_rs_sm90.cu. Included by that file only: the definitions have its internal linkage.
#pragma once

#include "../gemm/sm90_config.hpp"
#include "tp_common.cuh"

// TANDEM_RS_STREAM_LOADS (CMake option, off): the reductions in pieces and the joined reduction read the peers'
// partials with the streaming hint (roles::load16, evict-first in L2), leaving the L2 to the GEMM role's operand
// tiles; the whole-chunk, cross-node and one-shot reductions read plainly either way. A build option, not a
// run-time knob, so that the default build's kernels are unchanged (a run-time choice spilled more registers).
#ifndef TANDEM_RS_STREAM_LOADS
#define TANDEM_RS_STREAM_LOADS 0
#endif

namespace tandem::kernels::tp {

inline constexpr bool kRsStreamLoads = TANDEM_RS_STREAM_LOADS != 0;

namespace {

using namespace detail;

constexpr int kMaxFusedRsWorld = 8;  // chunk GEMM parameter sets travel in the kernel argument
// The joined reduction's items: about this many 16-byte vectors (128 KiB of output, W x that read), so that a
// claim and its barriers stay small against the item's memory time.
constexpr int64_t kJoinItemVectors = 8192;

enum class RsMode : int { kFused = 0, kReduceOnly = 1, kWaitReady = 2 };

template <class GemmKernel>
struct RsParams {
  typename GemmKernel::Params gemm[kMaxFusedRsWorld];
  tandem::DeviceComm comm;
  Control* ctl;
  const char* partial;  // symmetric: M x N, row-major
  float* acc;           // local: (M / W) x N fp32
  char* out;            // (M / W) x N: RS the user's output; AR this rank's chunk of the partial buffer
  char* gather_out;     // AR: the user's M x N output (rows of chunk c at c * chunk_elems); RS: null
  int64_t chunk_elems;  // (M / W) * N
  int64_t chunk_rows;   // M / W
  int reduce_rows_y;  // blocks with blockIdx.y below this reduce; the GEMM's follow (fused)
  int gemm_blocks;
  int reduce_blocks;
  RsMode mode;
  bool one_shot;        // AR one-shot: every rank reduces every row itself (in the owners' order)
  int ranks_per_node;   // L; world / L nodes
  char* recv;           // symmetric, N > 1: node partials of my rows, slot n = node n's (N x chunk)
  NodeFlags* node_flags;
  bool common_order;    // diagnostic (TANDEM_RS_ORDER=common): chunks 0, 1, ... on every rank
  bool fused_one_pass;  // diagnostic (TANDEM_RS_REDUCE=onepass): the fused reduction waits for all, one pass
  runtime::Timeline timeline;  // diagnostic (TANDEM_TP_TRACE=1); slots below
  // Pieces (one node, two-shot; 1 = whole chunks): every chunk's GEMM in `pieces` pieces of piece_rows rows (the
  // scheduler's piece_len), computed by every rank in the order piece 0 of chunks 0, 1, ..., then piece 1, ...;
  // piece j of chunk o is announced by piece_arrive[r] = rows_flag(e, its last row + 1) on o (the last piece also
  // by arrive[r] = e, as a whole chunk is), and o reduces it in one pass.
  int pieces;
  int piece_rows;
  int32_t* piece_of_block;  // workspace: kMaxGemmBlocks entries
  // Tile claims (default; TANDEM_TP_CLAIM=0 off): the GEMM's clusters claim tiles from shared counters, so a chunk
  // (piece) is complete when its tiles are (counted in units: tiles_of_block), not when every GEMM block has passed it.
  gemm::TileClaims* claims;  // null: the static persistent stride
  int64_t chunk_tiles;       // the scheduler's work tiles of a chunk (blocks_per_problem)
  int64_t piece_tiles;       // ... of a piece (pieces)
  int late_cluster;          // TANDEM_TP_LATE (tests): GEMM clusters from this row start late_us late
  uint32_t late_us;
  // Joined reduction (TANDEM_RS_JOIN=1; pieces with claims): this rank's rows in join_items items a piece, claimed
  // by the reduce blocks and by GEMM blocks done with their GEMM (run_joined).
  bool join;
  int join_items;
  // Ticket mode's end phase: the last end_waiters blocks to reach it wait for the reduced chunks; the others copy
  // the slices they can claim of chunks already reduced and leave, so that they hold no SM while waiting (0: every
  // block waits and copies a fixed share of each chunk).
  int end_waiters;
  // Ticket mode: the owner's sums land in its output directly; the tiles another rank reduced are in the staging,
  // flagged here (this rank's heap, [tile] of its chunk in 128x256 tiles), and the end copies only those.
  uint32_t* ticket_staged;
  int32_t ticket_tiles_m, ticket_tiles_n;
};

// Timeline slots (runtime::Timeline). GEMM blocks: 0 start; step s: 1+3s chunk free (waits done), 2+3s chunk
// computed, 3+3s its stores complete. Reduce blocks: 0 start; source s acquired 1+2s, added 2+2s (one pass:
// 1 all acquired, 2 reduced); AR gather 40 start, 41 end. Every block: 46 before the end-of-launch protocol.
constexpr int kSlotGatherStart = 40, kSlotGatherEnd = 41, kSlotEnd = 46;

// The chunk the GEMM computes at step s: other nodes first (node n+1, ...; local index 0 .. L-1), then this node's
// chunks l+1, l+2, ..., l (one node: r+1, r+2, ..., r).
__host__ __device__ __forceinline__ int rs_chunk_at(const Topology& t, int s, bool common_order) {
  if (common_order && t.N == 1) return s;
  const int remote = (t.N - 1) * t.L;
  if (s < remote) return t.rank_of(t.node_at(1 + s / t.L), s % t.L);
  return t.rank_of(t.node, t.local_at(1 + s - remote));
}

// Tell the reducer of chunk o that this rank's partial of it is complete: its owner on this node, else this
// node's representative of o.
template <class P>
__device__ __forceinline__ void announce_chunk(const P& p, const Topology& t, int o, uint64_t e) {
  using namespace tandem::device;
  if (t.node_of(o) == t.node) {
    (void)signal(p.comm, &p.ctl->arrive[p.comm.rank], e, SignalOp::kSet, o);
  } else {
    (void)signal(p.comm, &p.ctl->node_arrive[t.node_of(o) * t.L + t.local], e, SignalOp::kSet,
                 t.rank_of(t.node, t.local_of(o)));
  }
}

// Pieces with tile claims: clusters run ahead into later calls while a slow one still holds a tile of an earlier
// piece, so the pieces of a chunk can complete out of order. piece_arrive counts rows, a prefix of the chunk,
// so it may only grow over complete pieces: each completer (thread 0 of the block whose tiles completed piece j
// of chunk o) marks its piece, and the one whose mark extends the contiguous prefix signals it, under a local
// lock so that two such signals land in the order they were made (causality orders the two stores to the
// owner's flag: the later, larger value wins). The last prefix also announces the whole chunk and clears the
// chunk's marks for the next launch.
template <class P>
__device__ __forceinline__ void publish_piece_prefix(const P& p, const Topology& t, int o, int j, uint64_t e) {
  using namespace tandem::device;
  Control* ctl = p.ctl;
  const uint64_t bit = 1ull << j;
  const uint64_t mask = runtime::atom_or_acq_rel_gpu(&ctl->piece_done[o], bit) | bit;
  const int prefix = __ffsll(static_cast<long long>(~mask)) - 1;  // trailing ones (pieces <= kMaxPieces < 64)
  if (j >= prefix) return;  // an earlier piece is missing: its completer publishes this one too
  if (!runtime::lock_local(&ctl->piece_lock[o], p.comm)) return;
  if (static_cast<uint64_t>(prefix) > local_load(&ctl->piece_signaled[o])) {
    const int64_t rows = static_cast<int64_t>(prefix) * p.piece_rows;
    const bool last = prefix >= p.pieces;
    (void)signal(p.comm, &ctl->piece_arrive[p.comm.rank], rows_flag(e, last ? p.chunk_rows : rows), SignalOp::kSet, o);
    if (last) {
      announce_chunk(p, t, o, e);  // an owner reducing whole chunks waits for this
      local_store(&ctl->piece_done[o], 0);
      local_store(&ctl->piece_signaled[o], 0);
    } else {
      local_store(&ctl->piece_signaled[o], static_cast<uint64_t>(prefix));
    }
  }
  runtime::unlock_local(&ctl->piece_lock[o]);
}

}  // namespace

}  // namespace tandem::kernels::tp
