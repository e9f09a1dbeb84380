// tandem kernels — the Hopper GEMM core on its own: D = alpha * A @ B (+ beta * C), bf16/fp16 in, fp32
// accumulate, row-major A (M x K), B (K x N) and D (M x N). Built on CUTLASS 3 (TMA loads, wgmma, mbarrier
// pipeline, warp-specialized persistent cooperative kernel). The fused kernels reuse its configuration; this
// unfused entry is the world-1 baseline and the fallback below the fusion crossover.
//
// Host adapter in the CUTLASS manner: can_implement -> workspace_size -> run, each returning a Status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tandem/transport/device_comm.h"

namespace tandem::kernels::gemm {

enum class DType : int32_t { kBF16 = 0, kFP16 = 1 };

struct GemmArgs {
  int m = 0, n = 0, k = 0;
  DType dtype = DType::kBF16;
  const void* a = nullptr;  // M x K, row-major, leading dimension lda (elements)
  int64_t lda = 0;
  const void* b = nullptr;  // K x N, row-major, leading dimension ldb
  int64_t ldb = 0;
  void* d = nullptr;        // M x N, row-major, leading dimension ldd
  int64_t ldd = 0;
  const void* c = nullptr;  // optional M x N source of beta * C (nullptr: beta must be 0)
  int64_t ldc = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  int sm_count = 0;         // SMs the persistent grid may use (the rank's MPS share); 0 = the device's
  // The persistent scheduler's swizzle (1, 2, 4 or 8): that many consecutive tiles along the raster walk together,
  // which changes L2 reuse (not the arithmetic: every tile's result is the same bits).
  int max_swizzle = 1;
  // The order the persistent scheduler walks the output tiles in: kHeuristic (CUTLASS's: along M where there are
  // more N tiles than M tiles, else along N), kAlongM or kAlongN. Like the swizzle it changes which A and B tiles
  // share the L2, not any result's bits. The fused TP kernels and MoE pin their own order.
  enum class Raster : int { kHeuristic = 0, kAlongM = 1, kAlongN = 2 };
  Raster raster = Raster::kHeuristic;
};

// What is wrong with a tile walk (GemmArgs' and ScaledGemmArgs' max_swizzle and raster), or nullptr: the one check
// both GEMMs' can_implement make.
inline const char* tile_walk_error(int max_swizzle, GemmArgs::Raster raster) {
  if (max_swizzle != 1 && max_swizzle != 2 && max_swizzle != 4 && max_swizzle != 8)
    return "max_swizzle must be 1, 2, 4 or 8";
  if (raster != GemmArgs::Raster::kHeuristic && raster != GemmArgs::Raster::kAlongM &&
      raster != GemmArgs::Raster::kAlongN)
    return "raster must be kHeuristic, kAlongM or kAlongN";
  return nullptr;
}

// Shared state of the tile claims (ArrivalSchedule::claims), in a workspace the caller owns; any initial contents
// except `next`, which must be zero before a launch's first claim (workspace zeroed once, then tile_claims_reset
// by the launch's last block: no claim is made after every block has finished).
constexpr int kClaimCalls = 64;       // calls of the GEMM within one launch (GEMM+RS: chunks x pieces)
constexpr int kClaimClusters = 128;   // clusters of the GEMM grid
constexpr int kClaimRingSlots = 32;   // claims a cluster publishes ahead of its slowest reader (> pipeline stages)
struct TileClaims {
  uint32_t next[kClaimCalls];  // the next unclaimed cluster tile of each call
  // Per cluster: the claims of its first CTA's producer thread, which the cluster's other threads read (tag =
  // (epoch << 26) | (call << 20) | sequence number, released after the value; tags only grow).
  struct Slot {
    uint64_t tag;
    uint64_t value;
  } ring[kClaimClusters][kClaimRingSlots];
  uint32_t tiles_of_block[2 * kClaimClusters];  // valid tiles the block's last call computed (its thread 0)
};

// What the arrival-aware variant waits for before computing a tile (the AG+GEMM mainloop's contract):
// A's rows come in `chunks` chunks of `chunk_rows`; chunk c may be read once flags[c] >= epoch.
struct ArrivalSchedule {
  tandem::DeviceComm comm{};        // bounds and reports the waits (timeout, abort flag, error record)
  const uint64_t* flags = nullptr;  // [chunks], in this rank's memory
  uint64_t epoch = 0;
  // If set, the epoch is read on the device: *epoch_counter + 1 (the fused kernels keep the counter in their
  // workspace and advance it as they finish, so a captured CUDA graph waits for a fresh epoch every replay).
  const uint64_t* epoch_counter = nullptr;
  int32_t chunk_rows = 0;           // a multiple of 8; tiles that straddle chunks wait for each of them
  int32_t chunks = 0;
  int32_t first_chunk = 0;          // hand out chunk first_chunk first, then +1, ... (mod chunks)
  int32_t tile_m = 128;
  int32_t source_of_chunk0 = 0;     // rank that delivers chunk 0 (chunk c: (source_of_chunk0 + c) % world);
                                    // only names the peer of a timeout
  // The GEMM's own grid when the launch grid is larger (comm roles as extra rows of blockIdx.y, which CUTLASS's
  // persistent grid (cluster_m, ctas / cluster_m) leaves free): tiles are numbered and strided over this grid
  // only. 0 = the launch grid.
  int32_t gemm_grid_x = 0;
  int32_t gemm_grid_y = 0;
  // First blockIdx.y of the GEMM's blocks: the fused kernels put their comm blocks in the rows before it, so
  // that the block scheduler makes them resident first (a GEMM block waits for data the comm blocks move; the
  // comm blocks never wait for the GEMM of the same launch).
  int32_t gemm_block_y0 = 0;
  // Sleep between polls of a chunk flag (ns; 0 = spin): one poller per GEMM block still adds up to a grid's
  // worth of polls of one L2 line, which slows the copies that the wait is for.
  uint32_t poll_sleep_ns = 0;
  // Pieces (the fused GEMM+RS): the problem's tiles in the scheduler's linear order, cut into ranges of
  // piece_len linear indices (whole rows of clusters); one call of the kernel computes piece
  // piece_of_block[b] only, b being the block's index in the GEMM grid, written by the caller (thread 0, then a
  // block barrier) before the call. 0 = the whole problem in one call.
  int32_t piece_len = 0;
  const int32_t* piece_of_block = nullptr;
  // Tile claims (the *ClaimsSchedulerTag instantiations only): instead of the static persistent stride, each
  // cluster takes its next tile from a counter shared by the GEMM grid (TileClaims, in the caller's workspace),
  // so that clusters that start late (not resident: MPS gives no co-residency) find the tiles already taken by
  // the resident ones instead of holding back the chunks that wait for them. claim_call numbers this call among
  // the calls of one launch in the order every block makes them (its counter, and the order of the ring tags:
  // a later call must have a larger number); pieces add piece * claim_stride. The caller zeroes the counters
  // before the next launch (tile_claims_reset) and reads how many tiles each block computed (tiles_of_block).
  TileClaims* claims = nullptr;
  int32_t claim_call = 0;
  int32_t claim_stride = 0;
};

// kOk, or kInvalidArgument with the reason in *why (if given): shape, alignment (16-byte rows for TMA),
// leading dimensions, null pointers.
Status can_implement(const GemmArgs& args, std::string* why = nullptr);
size_t workspace_size(const GemmArgs& args);
// Launch on `stream`. `workspace` must hold workspace_size(args) bytes (may be null when that is 0).
Status run(const GemmArgs& args, void* workspace, cudaStream_t stream, std::string* why = nullptr);
// Load the GEMM core's kernels now (lazy module loading would load them at their first launch, which can wait
// for a running kernel: see tp::preload_kernels).
cudaError_t preload_kernels();

// The same GEMM, but each output tile starts only after its chunk of A rows has arrived (ArrivalSchedule), and
// chunks are taken in arrival order. Needs M == chunks * chunk_rows. A timed-out wait is recorded in
// schedule.comm (check it after the kernel); the kernel still finishes.
Status can_implement_with_arrivals(const GemmArgs& args, const ArrivalSchedule& schedule, std::string* why = nullptr);
Status run_with_arrivals(const GemmArgs& args, const ArrivalSchedule& schedule, void* workspace,
                         cudaStream_t stream, std::string* why = nullptr);

}  // namespace tandem::kernels::gemm
