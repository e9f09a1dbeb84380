// tandem kernels (private) — what the fused TP kernels share: their workspace control block (Control), the
// node topology and flags of the cross-node paths, the role constants and the adapters' common check. The epoch
// protocol, the "last block" counters and the clustered launch are the persistent-kernel runtime's
// (kernels/include/tandem/kernels/runtime/persistent.cuh), used here by the names below.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "tandem/kernels/runtime/persistent.cuh"
#include "tandem/kernels/runtime/trace.cuh"
#include "tandem/device.cuh"
#include "tandem/kernels/fused/tp_gemm.h"
#include "tandem/kernels/gemm/gemm.h"

namespace tandem::kernels::tp::detail {

using runtime::kMaxWorld;  // the runtime's world limit: Control's and NodeFlags' per-rank arrays below
constexpr int kStageBytes = 96 * 1024;  // TMA bulk staging of a comm block (multiple of 16 * kBulkStages)
// GEMM blocks waiting for a chunk sleep this long between polls. Measured (H200, world 2, 4096x4096x8192 per
// rank, 4 copy blocks): 0 ns 10.97 ms, 256 ns 4.20 ms, 2000 ns 2.04 ms fused vs 3.24 ms unfused (docs/results.md).
constexpr uint32_t kDefaultPollSleepNs = 2000;
// Comm-role waits (one thread a block, dozens of blocks a rank) sleep this long between polls: back-to-back
// polls of one L2 line slow down the GEMM blocks of the same GPU that write it.
constexpr uint32_t kRolePollNs = 500;
// The unfused collectives (all-gather, reduction) run alone on at most this many SMs of a rank: the per-rank
// rate stops growing past it on the H200 under MPS (tandem bench roles), and fewer blocks than the rank's SMs
// leave room for the other ranks' kernels on a shared GPU.
constexpr int kMaxCollectiveBlocks = 16;

// At the start of the workspace, 4 KiB. Arrays are indexed by rank.
struct alignas(128) Control : runtime::ControlHeader {  // epoch, done_blocks: the runtime's line
  uint64_t reduce_done;            // local: AR reduce blocks done with this rank's rows
  uint64_t reduce_claim;           // local: the joined reduction's next unclaimed item (reset by the last block)
  uint64_t reduce_items_done;      // local: the joined reduction's items done (last_of_units)
  uint64_t one_shot_tiles;         // local, tile claims: AR one-shot tiles stored, every chunk (last_of_units)
  uint64_t ring_step[8];           // RS ring, one word a step (kMaxFusedRsWorld): ring_step[s] = e when the right
                                   // neighbour's running sum of step s is stored. A word a step, not one word for
                                   // every step: with tile claims the block completing step s may signal after the
                                   // one completing s + 1, and one word would go back to step s
  uint64_t ticket_reduced;         // RS/AR ticket mode, at a chunk's owner: tiles of its chunk reduced this launch
                                   // (any rank's last arriver counts; the completer resets it: ticket_scheduler.hpp)
  uint64_t ticket_end_arrivals;    // local, ticket mode: blocks that reached the end phase this launch (reset by the
                                   // last block): the last end_waiters of them wait for the reduced chunks
  uint64_t pad1[2];
  uint64_t local_count[kMaxWorld]; // local: AG blocks done sending to peer p / RS GEMM blocks done with chunk o
  uint64_t arrive[kMaxWorld];      // AG: chunk of rank r landed here; RS: rank r's partial of my rows is complete
  uint64_t ready[kMaxWorld];       // AG: rank p finished reading its gathered A of that epoch;
                                   // RS: rank o finished reading my partial of its rows
                                   // (AR: and my reduced rows)
  uint64_t reduced[kMaxWorld];     // AR: rank q's reduced rows (its partial chunk q) are complete
  // Across nodes (nodes of L consecutive ranks; the rank of each node with local index l is the node's
  // representative for every chunk whose owner has local index l):
  uint64_t node_arrive[kMaxWorld]; // RS/AR at a representative: [n_o * L + j] = local rank j's partial of chunk
                                   // (n_o, my local index) is complete
  uint64_t forward_count[kMaxWorld]; // local: AG blocks done republishing chunk c to this node's ranks
  uint64_t piece_arrive[kMaxWorld];  // RS/AR, one node: rows_flag(e, rows) = rank r's partial of my rows is
                                     // complete up to row `rows` (pieces: after each piece; whole chunks: at
                                     // the end of the chunk)
  // Pieces with tile claims (pieces of a chunk may complete out of order), per chunk o (the fused RS takes at
  // most 8 ranks): the pieces stored (a bit each), the prefix signalled to o, and the lock that orders the
  // prefix signals (publish_piece_prefix).
  uint64_t piece_done[8];
  uint64_t piece_signaled[8];
  uint64_t piece_lock[8];
  uint64_t ticket_copy_claim[8];   // local, ticket mode: chunk d's next unclaimed slice of the end copy (reset by
                                   // the last block)
};
static_assert(sizeof(Control) <= 4096, "control block must fit its 4 KiB");
constexpr size_t kControlBytes = 4096;
// Piece flags count rows: epoch e, the partial complete up to row `rows` of the chunk (rows < 2^32). Monotonic
// within a launch (rows grow) and across launches (e dominates), and independent of how a rank cut its chunk
// into pieces: an owner that cut its rows otherwise (another TANDEM_RS_PIECES, another SM count) waits for the
// rows it reads, never for a piece number.
constexpr int kMaxPieces = 8;
__host__ __device__ constexpr uint64_t rows_flag(uint64_t e, int64_t rows) {
  return (e << 32) | static_cast<uint64_t>(rows);
}
// The fused GEMM's per-block piece table (ArrivalSchedule::piece_of_block), in the workspace.
constexpr int kMaxGemmBlocks = 256;
// The fused GEMM roles' tile claims (gemm::TileClaims), in the workspace: on by default, on one node and across
// nodes (H200, 2026-12-05: world 4, 16384x8192x4096, GEMM+RS 7.70 -> 6.09 ms, in pieces 5.17 -> 4.42, AG+GEMM
// 8.77 -> 8.09; the emulated-nodes tests passed with them on an H100); TANDEM_TP_CLAIM=0 gives the static
// persistent stride.
constexpr size_t kClaimBytes = (sizeof(gemm::TileClaims) + 255) & ~size_t(255);
bool tile_claims_enabled();

// Node layout of a TP op: W ranks in N = W / L nodes of L consecutive ranks (rank = node * L + local). One node
// (L = W) is the load/store case; with N > 1 peers of other nodes are reached through the proxy, and every
// cross-node transfer goes between ranks of the same local index (one per node and chunk: the hierarchical
// schedule of docs/fused-kernels.md).
struct Topology {
  int L = 1, N = 1, node = 0, local = 0;
  __host__ __device__ static Topology of(int rank, int world, int ranks_per_node) {
    Topology t;
    t.L = ranks_per_node > 0 && ranks_per_node <= world ? ranks_per_node : world;
    t.N = world / t.L;
    t.node = rank / t.L;
    t.local = rank % t.L;
    return t;
  }
  __host__ __device__ int rank_of(int node_, int local_) const { return node_ * L + local_; }
  __host__ __device__ int node_of(int rank) const { return rank / L; }
  __host__ __device__ int local_of(int rank) const { return rank % L; }
  __host__ __device__ int node_at(int d) const { return ((node + d) % N + N) % N; }    // d nodes after mine
  __host__ __device__ int local_at(int d) const { return ((local + d) % L + L) % L; }  // d ranks after me
};

// Per-slice flags of the cross-node RS/AR (reduce block rb handles the same slice on every rank: every rank runs
// the same plan). In the workspace after the control block.
constexpr int kMaxNodeReduceBlocks = 64;
struct NodeFlags {
  uint64_t partial_in[kMaxWorld][kMaxNodeReduceBlocks];  // at an owner: [n][rb] node n's partial, slice rb, landed
  uint64_t reduced_in[kMaxWorld][kMaxNodeReduceBlocks];  // at a representative: [n][rb] the owner's reduced rows
                                                         // (node n, my local index), slice rb, landed
  uint64_t forwarded[kMaxWorld][kMaxNodeReduceBlocks];   // [o][rb] chunk o's reduced slice rb sits at this node's
                                                         // representative of o (read it there)
};
constexpr size_t kNodeFlagBytes = sizeof(NodeFlags);

// The generic persistent-kernel pieces live in the runtime (kernels/include/tandem/kernels/runtime/persistent.cuh); the TP kernels and
// the others that grew up on this file use them by these names.
using runtime::atom_add_acq_rel_gpu;
using runtime::block_ok;
using runtime::check_world;
using runtime::complete_bulk_stores;
using runtime::current_epoch;
using runtime::dispatch_roles;
using runtime::fail;
using runtime::kClusterX;
using runtime::finish_block;
using runtime::last_of;
using runtime::last_of_units;
using runtime::launch_clustered;
using runtime::split16;
using runtime::workspace_in_heap;
using runtime::WorkspaceCarver;

// Diagnostics (tools/diag/tp_trace.py; none of these is read unless its variable is set, and the defaults are the
// kernels' own choices):
//   TANDEM_TP_TRACE=1     the TP kernels record their per-block timeline (runtime::Timeline) into one device
//                         buffer, zeroed before each launch and read back by tp::timeline_snapshot()
//   TANDEM_TP_SWIZZLE=s   the fused GEMM roles' tile-scheduler swizzle (1, 2, 4, 8; default 1)
//   TANDEM_TP_RASTER=m    the fused GEMM+RS chunks walk their tiles along M (default: along N)
//   TANDEM_RS_ORDER=common  every rank computes the chunks in the same order 0, 1, ... (default: owner r+1 first)
//   TANDEM_RS_REDUCE=onepass  the fused reduction waits for every partial, then one pass in registers (default:
//                         one step per partial as it lands, fp32 accumulator in memory)
//   TANDEM_RS_PIECES=auto|S|0  the fused GEMM+RS/AR (one node, two-shot) computes each chunk in pieces of whole
//                         cluster rows, every rank in the same order (piece 0 of every owner, then piece 1, ...),
//                         and the owner reduces each piece in one pass as soon as every rank has it (default
//                         auto; 0: whole chunks)
uint64_t* timeline_for_launch(cudaStream_t stream);  // null unless TANDEM_TP_TRACE=1
extern int g_last_fused_pieces;   // host: the pieces of this process's last fused GEMM+RS/AR launch (1: whole chunks)
extern bool g_last_fused_claims;  // host: the last fused TP launch took tile claims
extern int g_last_fused_gemm_tile_m;  // host: the tile M of the last fused TP launch's GEMM role (128 or 256)
extern bool g_last_fused_joined;  // host: the last fused GEMM+RS/AR launch joined its reduction
extern bool g_last_fused_ring;    // host: ... was the ring (the reduction in the GEMM's epilogues)
extern bool g_last_fused_ticket;  // host: ... was the ticket reduction (the last arriver of a tile reduces it)
//   TANDEM_TP_CLAIM=0     the fused GEMM roles take tiles by the static persistent stride (default: tile claims)
//   TANDEM_RS_JOIN=1      the fused GEMM+RS/AR in pieces with tile claims: GEMM blocks that finished their GEMM
//                         join the reduction (items claimed by reduce and GEMM blocks alike)
//   TANDEM_RS_RING=1      the fused GEMM+RS and two-shot GEMM+AR (one node) as a ring: no reduce role, each step's GEMM
//                         epilogue adds the right neighbour's running sum (gemm_rs_sm90.cu; off by default: docs/fused-kernels.md)
//   TANDEM_RS_TICKET=1    the fused GEMM+RS and two-shot GEMM+AR (one node) by tickets: no reduce role, no waits in
//                         the GEMM; each tile's last rank to finish it adds every rank's partial (ticket_scheduler.hpp,
//                         gemm_rs_sm90.cu; off by default until measured)
//   TANDEM_RS_TICKET_END_WAITERS=n  the ticket kernel's end: the last n blocks to reach it wait for the reduced
//                         chunks, the others copy what is ready and leave (default: an eighth of the grid; 0: every
//                         block waits and copies a fixed share)
//   TANDEM_RS_TICKET_DIRECT=0  the ticket kernel's owner reduces its own tiles into its staging and flags them, as
//                         other ranks do (default: straight into its output, so that its end copies nothing for them)
//   TANDEM_RS_TICKET_ROUNDS=P  the ticket kernel in P rounds (at most 8): round j computes piece j of every chunk, so
//                         the owner's fixups of its own pieces run beside the next round's GEMM (default 1: none)
//   TANDEM_TP_GEMM_TILE=256x128  the fused GEMM roles (AG+GEMM, GEMM+RS/AR) in 256x128 tiles, with tile claims
//                         (default 128x256; TANDEM_TP_CLAIM=0 keeps 128x256)
//   TANDEM_TP_LATE=c:us   (tests) the fused GEMM role's clusters from row c of its grid on start us microseconds
//                         late, as clusters that MPS made resident late do (tile claims give their tiles away)
struct FusedKnobs {
  int late_cluster = 0;
  uint32_t late_us = 0;
  bool join = false;
  int swizzle = 1;
  bool raster_m = false;
  bool common_order = false;
  bool one_pass = false;
  int pieces = -1;  // TANDEM_RS_PIECES: -1 = auto (default), 0 = whole chunks, else at most this many a chunk
  int gemm_tile_m = 128;  // TANDEM_TP_GEMM_TILE=256x128: the fused GEMM roles in 256x128 tiles
  bool ring = false;      // TANDEM_RS_RING=1: the fused GEMM+RS as a ring, its adds in the GEMM epilogues
  bool ticket = false;    // TANDEM_RS_TICKET=1: the fused GEMM+RS by tickets, the last arriver of a tile reduces it
  int ticket_end_waiters = -1;  // TANDEM_RS_TICKET_END_WAITERS: blocks that wait at the ticket kernel's end (-1:
                                // an eighth of the grid; 0: every block waits and copies a fixed share)
  bool ticket_direct = true;    // TANDEM_RS_TICKET_DIRECT=0: the owner's sums go through its staging too
  int ticket_rounds = 1;        // TANDEM_RS_TICKET_ROUNDS=P: the ticket kernel in P rounds (a piece of every chunk each)
  static FusedKnobs from_env();
};

// What every TP op checks besides its shapes: the runtime's common checks (world size; dtype; operands non-null
// and 16-byte aligned, TMA rows, `names` says which they are, for the message; the workspace non-null, 16-byte
// aligned and inside the symmetric heap), then the resolved SM plan.
inline Status check_common(const tandem::DeviceComm& comm, DType dtype, std::initializer_list<const void*> operands,
                           const char* names, const void* workspace, size_t workspace_bytes, const SmPlan& plan,
                           std::string* why) {
  if (Status s = runtime::check_launch_common(comm, dtype, operands, names, workspace, workspace_bytes, 16, why);
      s != Status::kOk)
    return s;
  return runtime::check_sm_plan(plan.sm_count, plan.comm_blocks, 1, why);
}

}  // namespace tandem::kernels::tp::detail
