// tandem kernels (private) — what the fused TP kernels share: the workspace control block, the epoch protocol,
// the "last block" counters, the launch with comm blocks beside the GEMM's persistent grid.
//
// Epochs. Every launch on a workspace is epoch e = control.epoch + 1, read by each block when it starts; the
// last block to finish stores e (so launches on one stream, and the replays of a captured graph, see 1, 2, 3,
// ...). Flags carry epochs (kSet, monotonic), never reset. Local counters ("the last of N blocks to reach this
// point") count to N and are reset by the block that completes them; kernel boundaries order the reset before
// the next launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "tandem/device.cuh"
#include "tandem/kernels/fused/tp_gemm.h"

namespace tandem::kernels::tp::detail {

constexpr int kMaxWorld = 64;
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
struct alignas(128) Control {
  uint64_t epoch;                  // last completed epoch (local)
  uint64_t reduce_done;            // local: AR reduce blocks done with this rank's rows
  uint64_t pad0[14];
  uint64_t done_blocks;            // local: blocks of this launch that finished
  uint64_t pad1[15];
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
};
static_assert(sizeof(Control) <= 4096, "control block must fit its 4 KiB");
constexpr size_t kControlBytes = 4096;

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

__device__ __forceinline__ uint64_t atom_add_acq_rel_gpu(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

// Called by thread 0 after the block's work is ordered before it (__syncthreads). True for the last of `total`
// callers; its acquire sees every caller's writes, so a release it issues next publishes them all.
__device__ __forceinline__ bool last_of(uint64_t* counter, uint64_t total) {
  if (atom_add_acq_rel_gpu(counter, 1) + 1 != total) return false;
  tandem::device::local_store(counter, 0);
  return true;
}

__device__ __forceinline__ uint64_t current_epoch(const Control* ctl) {
  return tandem::device::local_load(&ctl->epoch) + 1;
}

// Every block, at its very end (all threads): the last one runs `on_last` (thread 0) and completes the epoch.
template <class F>
__device__ __forceinline__ void finish_block(Control* ctl, uint64_t total_blocks, uint64_t epoch, F&& on_last) {
  __syncthreads();
  if (threadIdx.x == 0 && last_of(&ctl->done_blocks, total_blocks)) {
    on_last();
    tandem::device::local_store(&ctl->epoch, epoch);
  }
}

// The TMA bulk stores of CUTLASS's epilogue are waited for with .read only (the shared source may be reused);
// before a peer may read the output, the issuing thread waits for the writes themselves, then orders the async
// proxy's writes before the generic proxy's release that follows.
__device__ __forceinline__ void complete_bulk_stores() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// Hands out consecutive 256-byte aligned ranges of a workspace, from `at` on (the MoE and ring-attention
// workspace layouts).
struct WorkspaceCarver {
  size_t at;
  size_t take(size_t bytes) {
    const size_t r = at;
    at += (bytes + 255) / 256 * 256;
    return r;
  }
};

// [lo, hi) of `bytes` for part `i` of `parts`, 16-byte granular.
__device__ __forceinline__ void split16(size_t bytes, int parts, int i, size_t* lo, size_t* hi) {
  const size_t units = bytes / 16;
  *lo = 16 * (units * static_cast<size_t>(i) / static_cast<size_t>(parts));
  *hi = i + 1 == parts ? bytes : 16 * (units * static_cast<size_t>(i + 1) / static_cast<size_t>(parts));
}

// Report a failed wait once per block and let the caller skip the rest of its work (the abort flag is up, so
// every other wait fails fast and the kernel still finishes).
__device__ __forceinline__ bool block_ok(Status s) { return __syncthreads_and(s == Status::kOk) != 0; }

// Launch `kernel` on grid (gx, gy) with 2x1x1 clusters (the GEMM core's cluster shape).
template <class Params, class Kernel>
cudaError_t launch_clustered(Kernel kernel, dim3 grid, int threads, int smem, cudaStream_t stream,
                             const Params& params) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, params);
}

inline Status fail(std::string* why, const std::string& w, Status s = Status::kInvalidArgument) {
  if (why) *why = w;
  return s;
}

// What every TP op checks besides its shapes: the world size; operands and workspace non-null and 16-byte
// aligned (TMA rows; `names` says which they are, for the message); the workspace inside the symmetric heap;
// the resolved SM plan; the dtype.
inline Status check_common(const tandem::DeviceComm& comm, DType dtype, std::initializer_list<const void*> operands,
                           const char* names, const void* workspace, size_t workspace_bytes, const SmPlan& plan,
                           std::string* why) {
  if (comm.world < 1 || comm.world > kMaxWorld) return fail(why, "world size must be in [1, 64]");
  for (const void* p : operands)
    if (p == nullptr) return fail(why, "null pointer");
  if (workspace == nullptr) return fail(why, "null pointer");
  const auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) != 0; };
  for (const void* p : operands)
    if (misaligned(p)) return fail(why, std::string(names) + " and the workspace must be 16-byte aligned");
  if (misaligned(workspace)) return fail(why, std::string(names) + " and the workspace must be 16-byte aligned");
  const char* ws = static_cast<const char*>(workspace);
  if (ws < comm.heap_base || ws + workspace_bytes > comm.heap_base + comm.heap_bytes)
    return fail(why, "the workspace must lie in the communicator's symmetric heap");
  if (plan.sm_count <= 0) return fail(why, "sm_count must be the SMs this rank has");
  if (plan.comm_blocks < 2 || plan.comm_blocks % 2) return fail(why, "comm_blocks must be even and at least 2");
  if (plan.sm_count - plan.comm_blocks < 2) return fail(why, "no SMs left for the GEMM");
  if (dtype != DType::kBF16 && dtype != DType::kFP16) return fail(why, "dtype must be bf16 or fp16");
  return Status::kOk;
}

}  // namespace tandem::kernels::tp::detail
