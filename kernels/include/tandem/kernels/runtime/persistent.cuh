// tandem kernels — the persistent-kernel runtime every fused kernel (TP, MoE, ring attention) is built on: the
// epoch protocol over a control block at the start of the op's workspace, the "last of N blocks" counters, roles
// over grid rows, workspace carving and the checks every adapter makes, the launch beside clusters. Public and
// installed: it needs the CUDA toolkit, tandem's device API and the kernels' plain C++ gemm.h (DType) only
// (tests/cpu/test_installed_headers.py).
//
// Control blocks. Every kernel's control block (at the start of its workspace) derives from ControlHeader below:
// the runtime's two words, then the family's own flags (tp::detail::Control, MoeControl, RingControl; a new
// kernel's likewise). The runtime's functions take any of them.
//
// Epochs. Every launch on a workspace is epoch e = control.epoch + 1 (current_epoch, read by each block when it
// starts); the last block to finish stores e (finish_block), so launches on one stream, and the replays of a
// captured graph, see 1, 2, 3, ... Flags carry epochs (kSet, monotonic) and are never reset. Local counters
// ("the last of N blocks to reach this point", last_of) count to N and are reset by the block that completes
// them; kernel boundaries order the reset before the next launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "tandem/device.cuh"
#include "tandem/kernels/gemm/gemm.h"
#include "tandem/kernels/runtime/launch_cache.hpp"

namespace tandem::kernels::runtime {

// The largest world a fused kernel takes. Every family's control block holds flags indexed by rank (TP's
// Control, MoeControl, RingControl: arrays of kMaxWorld words, static_asserted where they are declared), and
// check_world / check_launch_common refuse larger worlds before a launch.
constexpr int kMaxWorld = 64;

// The epoch protocol's words, first in every control block; one 128-byte line of its own, so the family's
// counters and flags that follow do not share it.
struct alignas(128) ControlHeader {
  uint64_t epoch;        // last completed epoch (local)
  uint64_t done_blocks;  // local: blocks of this launch that finished (reset by the last one)
};
static_assert(sizeof(ControlHeader) == 128, "the header is one line");

template <class ControlBlock>
constexpr bool is_control_block = std::is_base_of_v<ControlHeader, ControlBlock>;

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

// last_of for work counted in units (tiles) rather than blocks: every block adds the units it completed (none:
// it does not take part), and the one whose units bring the counter to `total` gets true and resets it. Called
// by thread 0 after the block's work is ordered before it (__syncthreads), like last_of.
__device__ __forceinline__ bool last_of_units(uint64_t* counter, uint64_t units, uint64_t total) {
  if (units == 0 || atom_add_acq_rel_gpu(counter, units) + units != total) return false;
  tandem::device::local_store(counter, 0);
  return true;
}

// A lock between blocks of one GPU (a local word, 0 = free), for the rare case where a few remote stores must land
// in the order the blocks make them (runtime users: the pieces' prefix signals). The holder only runs a few
// instructions, so the spin is short; it is bounded all the same (the communicator's timeout, then false and an
// error record, abort flag up). Acquire on success; unlock_local releases.
__device__ __forceinline__ bool lock_local(uint64_t* lock, const tandem::DeviceComm& comm) {
  uint64_t since = 0;
  for (uint32_t spins = 1;; ++spins) {
    uint64_t old;
    asm volatile("atom.acquire.gpu.global.cas.b64 %0, [%1], 0, 1;" : "=l"(old) : "l"(lock) : "memory");
    if (old == 0) return true;
    __nanosleep(32);
    if (spins % 1024 == 0) {
      const uint64_t now = tandem::device::now_ns();
      if (since == 0) since = now;
      else if (comm.timeout_ns != 0 && now - since > comm.timeout_ns) {
        tandem::device::report(comm, tandem::Status::kTimeout, tandem::DeviceOp::kWaitUntil, comm.rank, 0, old);
        return false;
      }
    }
  }
}
__device__ __forceinline__ void unlock_local(uint64_t* lock) { tandem::device::local_publish(lock, 0); }

__device__ __forceinline__ uint64_t atom_or_acq_rel_gpu(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.acq_rel.gpu.global.or.b64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

// Tests: the knob "B:US" in environment variable `name` (TANDEM_TP_LATE, TANDEM_MOE_COMBINE_LATE): blocks from
// index B start US microseconds late (hold_block_us). Sets *first and *us and returns true where it holds one.
inline bool late_blocks_from_env(const char* name, int* first, uint32_t* us) {
  const char* v = std::getenv(name);
  int b = 0;
  unsigned u = 0;
  if (v == nullptr || std::sscanf(v, "%d:%u", &b, &u) != 2 || b < 0) return false;
  *first = b;
  *us = u;
  return true;
}

// Diagnostics and tests: hold the calling block for `us` microseconds before its work (thread 0 sleeps, then a
// block barrier), as a block that the hardware made resident late would start (TANDEM_TP_LATE).
__device__ __forceinline__ void hold_block_us(uint32_t us) {
  if (threadIdx.x == 0) {
    const uint64_t until = tandem::device::now_ns() + uint64_t(us) * 1000u;
    while (tandem::device::now_ns() < until) __nanosleep(1000);
  }
  __syncthreads();
}

// The epoch after the one recorded in `epoch_word`, a control block's `epoch` seen through a pointer by code that
// has only that word (the GEMM schedulers: ArrivalSchedule::epoch_counter, the MoE grouped GEMM's arrivals).
// Written by the previous launch on this stream, which finished before this one started: a relaxed load.
__device__ __forceinline__ uint64_t epoch_after(const uint64_t* epoch_word) {
  return tandem::device::local_load(epoch_word) + 1;
}

// This launch's epoch: the control block's last completed epoch + 1 (read once by each block at its start).
template <class ControlBlock>
__device__ __forceinline__ uint64_t current_epoch(const ControlBlock* ctl) {
  static_assert(is_control_block<ControlBlock>, "a control block derives from runtime::ControlHeader");
  return epoch_after(&ctl->epoch);
}

// Completes `epoch`: the next launch on the stream computes epoch + 1. finish_block's last block calls it; a
// kernel family that completes an epoch in a later kernel of its own (MoE's unfused dispatch: the release kernel
// after the GEMM) calls it there.
template <class ControlBlock>
__device__ __forceinline__ void complete_epoch(ControlBlock* ctl, uint64_t epoch) {
  static_assert(is_control_block<ControlBlock>, "a control block derives from runtime::ControlHeader");
  tandem::device::local_store(&ctl->epoch, epoch);
}

// Every block, at its very end (all threads): the last one runs `on_last` (thread 0) and completes the epoch.
// last_completes = false: the last block only counts (the counter is ready for the next launch) and runs
// nothing; a later kernel completes the epoch (complete_epoch).
template <class ControlBlock, class F>
__device__ __forceinline__ void finish_block(ControlBlock* ctl, uint64_t total_blocks, uint64_t epoch, F&& on_last,
                                             bool last_completes = true) {
  static_assert(is_control_block<ControlBlock>, "a control block derives from runtime::ControlHeader");
  __syncthreads();
  if (threadIdx.x == 0 && last_of(&ctl->done_blocks, total_blocks) && last_completes) {
    on_last();
    complete_epoch(ctl, epoch);
  }
}

// Roles over the grid. A fused kernel's blocks, numbered b = y * gridDim.x + x, take two roles: blocks [0,
// comm_blocks) are the communication role's (comm_role(b)), the blocks after them the compute role's
// (compute_role(): a persistent CUTLASS GEMM or an attention mainloop, which finds its tiles from its own grid
// coordinates). The TP and MoE kernels' grids are (kClusterX, rows) -- 2-block clusters along x, the GEMM core's
// cluster shape -- so their comm role is whole rows (comm_blocks = 2 x comm rows); ring attention's is 1-D.
// Without a compute role (has_compute_role false: the unfused launches, which give the GEMM its own kernel) every
// block is a comm block. The comm blocks come first so that, launched in order, they get SMs before the compute blocks;
// still, a comm block must never wait for a compute block (nor the reverse) unless the adapter checked that the
// whole grid is resident at once: MPS does not promise co-residency.
//
// dispatch_roles runs the two bodies as callables (AG+GEMM, ring attention: the same registers, stack and spills
// as before, ptxas of nvcc 13.0). A kernel whose register allocation a callable around its compute body changes
// keeps both bodies inline and asks is_compute_block / grid_block_index instead (GEMM+RS: a lambda around its
// GEMM role raised its stack frame from 688 to 720 bytes; inline, it compiles as before; the MoE dispatch kernel
// likewise: inline, 576 bytes of stack as before, its spills 68 / 152 -> 64 / 96 bytes stored / loaded).
__device__ __forceinline__ int grid_block_index() { return static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x); }

__device__ __forceinline__ bool is_compute_block(int comm_blocks, bool has_compute_role) {
  return has_compute_role && grid_block_index() >= comm_blocks;
}

template <class CommRole, class ComputeRole>
__device__ __forceinline__ void dispatch_roles(int comm_blocks, bool has_compute_role, CommRole&& comm_role,
                                               ComputeRole&& compute_role) {
  if (is_compute_block(comm_blocks, has_compute_role))
    compute_role();
  else
    comm_role(grid_block_index());
}

// The TMA bulk stores of CUTLASS's epilogue are waited for with .read only (the shared source may be reused);
// before a peer may read the output, the issuing thread waits for the writes themselves, then orders the async
// proxy's writes before the generic proxy's release that follows.
__device__ __forceinline__ void complete_bulk_stores() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// Hands out consecutive 256-byte aligned ranges of a workspace, from `at` on.
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

// The cluster width of launch_clustered (the GEMM core's 2x1x1 clusters): the fused grids are kClusterX blocks
// wide, so their comm roles are whole rows of kClusterX blocks.
constexpr int kClusterX = 2;

// Launch `kernel` on grid (gx, gy) with cluster_x x 1 x 1 clusters: kClusterX, the GEMM core's cluster shape, or 1
// (a fused GEMM role in clusters of one CTA; the grid keeps its kClusterX-wide rows).
template <class Params, class Kernel>
cudaError_t launch_clustered(Kernel kernel, dim3 grid, int threads, int smem, cudaStream_t stream,
                             const Params& params, int cluster_x = kClusterX) {
  // once per kernel and device (launch_cache.hpp), not per launch
  cudaError_t e = ensure_dynamic_smem(kernel, smem);
  if (e != cudaSuccess) return e;
  const ClusterLaunch launch(grid, dim3(threads, 1, 1), smem, stream, dim3(cluster_x, 1, 1));
  return cudaLaunchKernelEx(&launch.config, kernel, params);
}

inline Status fail(std::string* why, const std::string& w, Status s = Status::kInvalidArgument) {
  if (why) *why = w;
  return s;
}

// Whether [workspace, workspace + bytes) lies inside the communicator's symmetric heap (peers address it by its
// offset there): what every adapter checks before a launch.
inline bool workspace_in_heap(const tandem::DeviceComm& comm, const void* workspace, size_t bytes) {
  const char* ws = static_cast<const char*>(workspace);
  return ws >= comm.heap_base && ws + bytes <= comm.heap_base + comm.heap_bytes;
}

// The checks every fused kernel's adapter makes on its arguments (TP, MoE, ring attention; each family keeps its
// shape, plan and limit checks beside them). Host only; a failure returns kInvalidArgument with the reason in
// *why, in the same words from every family.

// The world size: 1 to kMaxWorld ranks. Every adapter checks it first (its workspace layout depends on it).
inline Status check_world(const tandem::DeviceComm& comm, std::string* why) {
  if (comm.world < 1 || comm.world > kMaxWorld)
    return fail(why, "world size must be in [1, " + std::to_string(kMaxWorld) + "]");
  return Status::kOk;
}

// In this order (the first failure is the one reported): the world size (check_world); the dtype, bf16 or fp16;
// `operands` non-null, then 16-byte aligned (TMA rows, 16-byte vectors; `names` lists them for the message);
// the workspace non-null, aligned to `workspace_align` bytes (a power of two) and inside the communicator's
// symmetric heap (workspace_in_heap: peers address it by its offset). Operands that a family may leave null
// (MoE: x of a rank without tokens) are checked by the family itself and left out of `operands`.
inline Status check_launch_common(const tandem::DeviceComm& comm, gemm::DType dtype,
                                  std::initializer_list<const void*> operands, const char* names,
                                  const void* workspace, size_t workspace_bytes, size_t workspace_align,
                                  std::string* why) {
  if (Status s = check_world(comm, why); s != Status::kOk) return s;
  if (dtype != gemm::DType::kBF16 && dtype != gemm::DType::kFP16) return fail(why, "dtype must be bf16 or fp16");
  for (const void* p : operands)
    if (p == nullptr) return fail(why, "null pointer");
  for (const void* p : operands)
    if ((reinterpret_cast<uintptr_t>(p) & 15u) != 0) return fail(why, std::string(names) + " must be 16-byte aligned");
  if (workspace == nullptr) return fail(why, "null workspace");
  if ((reinterpret_cast<uintptr_t>(workspace) & (workspace_align - 1)) != 0)
    return fail(why, "the workspace must be " + std::to_string(workspace_align) + "-byte aligned");
  if (!workspace_in_heap(comm, workspace, workspace_bytes))
    return fail(why, "the workspace must lie in the communicator's symmetric heap");
  return Status::kOk;
}

// The SM plan every comm-role kernel checks (TP, MoE): `sm_count` (at least `min_sm_count`) SMs, of which
// `comm_blocks` (whole rows of the kClusterX-wide grid, at least one row) take the comm roles and at least two are
// left for the GEMM.
inline Status check_sm_plan(int sm_count, int comm_blocks, int min_sm_count, std::string* why) {
  if (sm_count < min_sm_count) return fail(why, "sm_count must be the SMs this rank has");
  if (comm_blocks < kClusterX || comm_blocks % kClusterX) return fail(why, "comm_blocks must be even and at least 2");
  if (sm_count - comm_blocks < 2) return fail(why, "no SMs left for the GEMM");
  return Status::kOk;
}

}  // namespace tandem::kernels::runtime
