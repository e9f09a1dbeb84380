// tandem kernels — the tensor-parallel pair as role-specialized persistent kernels (Hopper):
//
//   AllGather+GEMM:      C (M x N) = all_gather(A_local (M/W x K)) @ B (K x N)
//   GEMM+ReduceScatter:  out (M/W x N) = reduce_scatter(A (M x K) @ B (K x N)), rank r owns rows [r M/W, ...)
//   GEMM+AllReduce:      out (M x N) = all_reduce(A (M x K) @ B (K x N)), the same bytes on every rank
//
// One launch per op. Its blocks take roles:
//   * GEMM blocks run the CUTLASS 3 core (sm90_config.hpp) on a persistent grid sized to the SMs left over;
//   * AG comm blocks copy this rank's A rows into the gathered buffer of every rank (itself first), through
//     the transport's device API (TMA bulk puts to load/store peers, the CPU proxy to other nodes), and
//     signal each chunk's arrival; the GEMM's tile scheduler waits per chunk and takes this rank's chunk first;
//   * RS reduce blocks wait for each rank's partial of this rank's rows, and add them in a fixed order in fp32
//     (deterministic); the GEMM computes the chunks in the order their owners need them (next rank first);
//   * AR: the RS roles, then the reduce blocks gather every owner's reduced rows (two-shot all-reduce).
// Across nodes (ranks_per_node < world) every chunk crosses the network once per node, between ranks of the same
// local index: AG sends its rows to one rank per other node, which republishes them over NVLink; RS reduces each
// chunk inside the node first (at the node's rank with the owner's local index) and sends one node partial to
// the owner; AR sends the owner's reduced rows back the same way.
// Cross-launch reuse is guarded by epochs kept on the device (workspace), so the launches are CUDA-graph safe.
//
// Host adapters in the CUTLASS manner: can_implement -> workspace_size -> run. The workspace lives in the
// communicator's symmetric heap (same offset on every rank), zero-initialized once, reused across launches of
// the same shape; every rank of the communicator calls run with the same shapes, in the same order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/kernels/gemm/gemm.h"
#include "tandem/transport/device_comm.h"

namespace tandem::kernels::tp {

using gemm::DType;

// Role plan: how many of the rank's SMs do what. 0 = the default split (default_plan).
struct SmPlan {
  int sm_count = 0;    // SMs this rank really has (its MPS share); every block must be resident at once
  int comm_blocks = 0; // AG: copy blocks; RS: reduce blocks. Even (the GEMM's clusters are 2 blocks wide)
};

struct AgGemmArgs {
  DType dtype = DType::kBF16;
  int m_local = 0, n = 0, k = 0;  // A_local is m_local x k (contiguous rows), B is k x n, C is (world m_local) x n
  const void* a_local = nullptr;  // any device memory of this rank; may be the rank's own rows of `gathered`
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  void* workspace = nullptr;      // symmetric: workspace_size bytes, zeroed before first use
  SmPlan plan{};
  tandem::DeviceComm comm{};
  // Nodes of this many consecutive ranks (Communicator::uniform_ranks_per_node()); 0 or world: one node. Peers
  // of other nodes go through the communicator's proxy; chunks cross nodes once per node (hierarchical).
  int ranks_per_node = 0;
};

struct GemmRsArgs {
  DType dtype = DType::kBF16;
  int m = 0, n = 0, k = 0;        // A is m x k, B is k x n; out is (m / world) x n
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* out = nullptr;            // contiguous (m / world) x n
  void* workspace = nullptr;      // symmetric: workspace_size bytes, zeroed before first use
  SmPlan plan{};
  tandem::DeviceComm comm{};
  // Nodes of this many consecutive ranks (Communicator::uniform_ranks_per_node()); 0 or world: one node. Peers
  // of other nodes go through the communicator's proxy; chunks cross nodes once per node (hierarchical).
  int ranks_per_node = 0;
  // The fused kernel's reduction (every rank the same: it is the cross-rank protocol): -1 as TANDEM_RS_TICKET says
  // (the reduce role unless it is 1); 0 the reduce role; 1 tickets (one node: gemm_rs_sm90.cu). ticket_rounds: -1
  // as TANDEM_RS_TICKET_ROUNDS says; else the ticket kernel's rounds (1: none). The workspace's size depends on
  // `ticket` (workspace_size). tandem.ops.tp sets them from auto's plan "ticket".
  int ticket = -1;
  int ticket_rounds = -1;
};

// GEMM+AllReduce: the GemmRsArgs fields, with `out` a contiguous m x n matrix (every rank gets all rows).
//   two-shot: reduce-scatter (each owner reduces its rows), then every rank gathers the owners' rows;
//   one-shot: every rank reads every partial and reduces every row itself (one wait, W times the reads: for
//             small outputs). Both sum in the owners' order, so the bits are the same either way.
enum class ArAlgo : int { kAuto = 0, kOneShot = 1, kTwoShot = 2 };
// kAuto takes one-shot up to this output size (bytes; at most 8 ranks, one node). Measured (H200, world 2 under
// MPS, K 4096 per rank, tools/diag/ar_crossover.py, docs/results/ar_crossover_w2.md): one-shot lost to two-shot
// at every size from 0.5 to 128 MiB (0.206 vs 0.189 ms at 0.5 MiB), so auto never takes it here; on NVLink
// peers, where a round trip costs more than on one GPU, the crossover is to be measured again.
constexpr size_t kArOneShotMaxBytes = 0;
struct GemmArArgs : GemmRsArgs {
  ArAlgo algo = ArAlgo::kAuto;
};
bool use_one_shot(const GemmArArgs& args);

// Load every kernel the TP ops (and the GEMM core) can launch. Call once per process before the first TP op on a
// communicator with proxy peers: with lazy module loading the first launch of a kernel loads its module, which
// was seen to wait for a running kernel; if that kernel waits for proxy traffic, whose CUDA copies queue behind
// the load, nothing moves until the device timeout (the unfused AG's GEMM, launched behind its copy kernel).
cudaError_t preload_kernels();
// With TANDEM_TP_TRACE=1 in the environment, the last TP launch's per-block timeline (runtime::Timeline's
// layout: kTimelineBlocks x kTimelineSlots global-timer stamps, the last slot SM id + 1); empty otherwise.
// Synchronizes the device. A diagnostic (tools/diag/tp_trace.py).
cudaError_t timeline_snapshot(std::vector<uint64_t>* out);
int timeline_slots();  // stamps per block in the snapshot (rows of blocks in grid row-major order)
// Diagnostic: how many pieces a chunk took in this process's last fused GEMM+RS/AR launch (1: whole chunks;
// TANDEM_RS_PIECES), so that a test of the pieces schedule knows it ran.
int last_fused_rs_pieces();
// Diagnostic: whether this process's last fused TP launch (AG+GEMM, GEMM+RS or GEMM+AR) took its GEMM tiles by
// tile claims (TANDEM_TP_CLAIM=1) rather than the static persistent stride.
bool last_fused_claims();
// The tile M of the last fused TP launch's GEMM role in this process (AG+GEMM, GEMM+RS/AR): 128 (the core's
// 128x256), or 256 (TANDEM_TP_GEMM_TILE=256x128).
int last_fused_gemm_tile_m();
// Diagnostic: whether the last fused GEMM+RS/AR launch ran the joined reduction (TANDEM_RS_JOIN=1; pieces with
// tile claims).
bool last_fused_rs_joined();
// Diagnostic: whether the last fused GEMM+RS / two-shot GEMM+AR launch ran the ring (TANDEM_RS_RING=1: the
// reduction in the GEMM's epilogues, no reduce role; one node, whole chunks).
bool last_fused_rs_ring();
bool last_fused_rs_ticket();  // the last fused GEMM+RS/AR launch of this process was the ticket reduction
cudaError_t preload_ag_kernels();
cudaError_t preload_rs_kernels();

// The heuristic split: AG copy blocks / RS reduce blocks ~ 1/16 of the SMs, at least 2, even.
SmPlan default_plan(int sm_count);

Status can_implement(const AgGemmArgs& args, std::string* why = nullptr);
size_t workspace_size(const AgGemmArgs& args);
// The gathered A (world m_local x k, row-major) inside the workspace: valid after the launch completes, until
// the next launch on the same workspace.
size_t gathered_offset(const AgGemmArgs& args);
Status run(const AgGemmArgs& args, cudaStream_t stream, std::string* why = nullptr);
// The unfused halves: the copy blocks alone (all-gather into the workspace, no M_local constraint) — the caller
// then runs gemm::run on the gathered A. The fallback below the fusion crossover, and the baseline.
Status run_all_gather(const AgGemmArgs& args, cudaStream_t stream, std::string* why = nullptr);

Status can_implement(const GemmRsArgs& args, std::string* why = nullptr);
size_t workspace_size(const GemmRsArgs& args);
Status run(const GemmRsArgs& args, cudaStream_t stream, std::string* why = nullptr);
// Unfused: wait until the partial buffer is free, the plain GEMM into it, then the reduction alone.
Status run_unfused(const GemmRsArgs& args, cudaStream_t stream, std::string* why = nullptr);

Status can_implement(const GemmArArgs& args, std::string* why = nullptr);
size_t workspace_size(const GemmArArgs& args);
Status run(const GemmArArgs& args, cudaStream_t stream, std::string* why = nullptr);
// Unfused: the RS's unfused halves, whose reduction kernel also gathers the reduced rows.
Status run_unfused(const GemmArArgs& args, cudaStream_t stream, std::string* why = nullptr);
// The collective alone: the reduction kernel of run_unfused over whatever the partial buffer holds (no GEMM).
// For benchmarks (the collective's own time) and for callers that wrote the partial buffer themselves.
Status run_reduce_only(const GemmRsArgs& args, cudaStream_t stream, std::string* why = nullptr);
Status run_reduce_only(const GemmArArgs& args, cudaStream_t stream, std::string* why = nullptr);
// The unfused path with the caller's GEMM (cuBLAS, say): run_wait_partial (until every rank finished reading this
// rank's partial buffer of the previous launch), then the caller writes A @ B (M x N, row-major, the op's
// dtype) at workspace + partial_offset, then run_reduce_only. The same three steps as run_unfused.
size_t partial_offset(const GemmRsArgs& args);
Status run_wait_partial(const GemmRsArgs& args, cudaStream_t stream, std::string* why = nullptr);

}  // namespace tandem::kernels::tp
