// MoE dispatch + grouped GEMM and combine (sm90a), the kernels' shared definitions: the optional per-block
// timeline's names, the dispatch workspace's offsets, the state every role shares (Common), the end-of-launch
// release and finish, and the receive-capacity check. The protocol is the one at the top of moe_sm90.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cub/device/device_radix_sort.cuh>
#include <cstdlib>
#include <vector>

#include "tandem/device.cuh"
#include "tandem/kernels/runtime/persistent.cuh"
#include "grouped_gemm_sm90.hpp"
#include "tandem/kernels/moe/moe.h"

namespace tandem::kernels::moe {

namespace {

using runtime::block_ok;
using runtime::fail;
using runtime::launch_clustered;
using runtime::kMaxWorld;  // the runtime's world limit: MoeControl's per-rank flags below, the combine's table
using runtime::last_of;

// Optional per-block timeline of the dispatch launch (TANDEM_MOE_TRACE=1, read back by trace_snapshot(); the
// diagnostic tools/diag/moe_fused.py prints it): globaltimer stamps at each block's phase boundaries, in the
// runtime's timeline (trace.cuh) of MoE's layout: grouped_gemm_sm90.hpp's MoeTimeline, 512 blocks x 8 slots.
// Every block: 0 start, 1 this epoch's layout seen (the elected block: written), 3 rows sent (senders only), 4 this
// rank's rows all arrived (fused: after the block's GEMM), 5 end; 2 the first GEMM tile, 6 and 7 the scheduler's
// later waits (ns in all, how many) (fused). The host owns the buffer and passes it in DispatchParams::timeline (null:
// off, no stores).
using detail::MoeTimeline;

constexpr int kMaxExperts = 4096;         // shared-memory tables of the send blocks
constexpr int32_t kSendChunk = 32;        // pairs a warp sends before the next warp's turn (see dispatch_role)
constexpr uint32_t kArrivalPollNs = 1000;  // dispatch blocks waiting for the last arrivals: leave the memory
                                           // system to the senders
constexpr uint32_t kRendezvousSleepNs = 1000;  // see rendezvous_sleep_ns (moe_sm90.cu)
using runtime::WorkspaceCarver;

struct alignas(128) MoeControl : runtime::ControlHeader {  // epoch, done_blocks: the runtime's line
  uint64_t shapes_ready;           // local: the GEMM's shapes and pointers of this epoch are written
  uint64_t pad0[15];
  uint64_t counts_flag[kMaxWorld];  // source s's count row landed
  uint64_t ready[kMaxWorld];        // rank q finished with everything the others wrote for that epoch
  uint64_t done[kMaxWorld];         // combine: rank q sent every row of this rank's tokens
  // local, the dispatch's claims (moe_dispatch.cuh, dispatch_role), on a line of their own (every block polls
  // shapes_ready): layout_claim is raised to the epoch by the block elected to exchange the counts and write the
  // layout (atomicMax: the first block of the launch to get there, whichever has an SM); join hands out sender
  // tickets (the first comm_blocks blocks to join send), send_claim chunks of sorted pairs to the senders' warps.
  // join and send_claim are zeroed by the host before each launch (stream-ordered, as local_counts), and so are
  // dedup's uniq_claim (chunks of the unique rows) and uniq_sent (rows put, a diagnostic).
  alignas(128) uint64_t layout_claim;
  struct Claims {
    uint32_t join;
    uint32_t send_claim;
    uint32_t uniq_claim;  // dedup: chunks of this rank's unique (token, destination) rows
    uint32_t uniq_sent;   // dedup: unique rows put (dispatch_rows_sent)
  } claims;
};
static_assert(sizeof(MoeControl) <= 4096, "control block must fit 4 KiB");
constexpr size_t kControlBytes = 4096;

int experts_total(const MoeShape& s, int world) { return s.experts_per_rank * world; }

// Byte offsets of everything in the dispatch workspace (the same on every rank: only shapes and world enter).
struct DispatchOffsets {
  size_t arrive, counts_all, local_counts, rows_done, keys, keys_sorted, vals, vals_sorted, cub_temp, cub_bytes;
  size_t shapes, ptr_a, ptr_b, ptr_d, stride_a, stride_b, stride_d, cutlass_ws, cutlass_ws_bytes;
  size_t recv_src, x_stage, recv_x;
  // dedup (DispatchArgs::dedup; zero bytes without it): uniq_count[W] (local: unique rows to each destination),
  // uniq_token[W][T_max] (their tokens), uidx[T_max k] (each pair's unique index at its destination), fan_abs[T_max k]
  // (each sorted pair's row in the destination's token buffer), uniq_all[W][W] (every source's uniq_count row),
  // tok_arrive[W] (source s's unique rows landed: epoch), tok_rows_done[W] (local counts), recv_fan[cap] (each
  // received row's token-buffer row), tok_buf[W T_max][H] (the unique rows, source s at s T_max)
  size_t uniq_count, uniq_token, uidx, fan_abs, uniq_all, tok_arrive, tok_rows_done, recv_fan, tok_buf;
  size_t total;
};

template <class Element>
using Gg = detail::Sm90GroupedGemm<Element>;
// The GEMM alone in 1x1 clusters (TANDEM_MOE_GEMM_CLUSTER=1; grouped_gemm_sm90.hpp says when it should help).
template <class Element>
using Gg1 = detail::Sm90GroupedGemm<Element, 1>;

size_t cub_temp_bytes(int n) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n < 1 ? 1 : n);
  return bytes;
}

constexpr size_t kCutlassWorkspaceBytes = size_t(1) << 20;  // tensormaps, 512 B per block: grids up to 2048

DispatchOffsets offsets_of(const DispatchArgs& a) {
  const MoeShape& s = a.shape;
  const int world = a.comm.world, el = s.experts_per_rank, e = experts_total(s, world);
  const size_t n = static_cast<size_t>(s.max_tokens) * s.topk, cap = static_cast<size_t>(receive_capacity(s, world));
  DispatchOffsets o{};
  WorkspaceCarver w{kControlBytes};
  const auto take = [&](size_t bytes) { return w.take(bytes); };
  o.arrive = take(sizeof(uint64_t) * el * world);
  o.counts_all = take(sizeof(int32_t) * world * e);
  o.local_counts = take(sizeof(int32_t) * e);
  o.rows_done = take(sizeof(uint32_t) * e);
  o.keys = take(sizeof(int32_t) * n);
  o.keys_sorted = take(sizeof(int32_t) * n);
  o.vals = take(sizeof(int32_t) * n);
  o.vals_sorted = take(sizeof(int32_t) * n);
  o.cub_bytes = cub_temp_bytes(static_cast<int>(n));
  o.cub_temp = take(o.cub_bytes);
  using G = Gg<cutlass::bfloat16_t>;
  o.shapes = take(sizeof(typename G::Shape3) * el);
  o.ptr_a = take(sizeof(void*) * el);
  o.ptr_b = take(sizeof(void*) * el);
  o.ptr_d = take(sizeof(void*) * el);
  o.stride_a = take(sizeof(typename G::StrideA) * el);
  o.stride_b = take(sizeof(typename G::StrideB) * el);
  o.stride_d = take(sizeof(typename G::StrideD) * el);
  o.cutlass_ws_bytes = kCutlassWorkspaceBytes;
  o.cutlass_ws = take(kCutlassWorkspaceBytes);
  o.recv_src = take(sizeof(int32_t) * cap);
  o.x_stage = take(tandem::device::has_proxy(a.comm) ? static_cast<size_t>(s.max_tokens) * s.hidden * 2 : 0);
  o.recv_x = take(cap * s.hidden * 2);
  const size_t dd = a.dedup ? 1 : 0, tm = static_cast<size_t>(s.max_tokens), ww = static_cast<size_t>(world);
  o.uniq_count = take(dd * sizeof(int32_t) * ww);
  o.uniq_token = take(dd * sizeof(int32_t) * ww * tm);
  o.uidx = take(dd * sizeof(int32_t) * n);
  o.fan_abs = take(dd * sizeof(int32_t) * n);
  o.uniq_all = take(dd * sizeof(int32_t) * ww * ww);
  o.tok_arrive = take(dd * sizeof(uint64_t) * ww);
  o.tok_rows_done = take(dd * sizeof(uint32_t) * ww);
  o.recv_fan = take(dd * sizeof(int32_t) * cap);
  o.tok_buf = take(dd * ww * tm * s.hidden * 2);
  o.total = w.at;
  return o;
}

struct Common {
  tandem::DeviceComm comm;
  MoeControl* ctl;
  int tokens, hidden, inter, topk, el, experts;  // experts: E
  int64_t capacity;
  uint32_t wait_sleep_ns;  // the rendezvous waits' sleep between polls (moe_sm90.cu: rendezvous_sleep_ns)
};

// What the last block of a launch does before the epoch is complete: waits until the proxy delivered every
// command (the next launch overwrites what it reads from the heap) and tells every rank this one is done with
// the epoch.
__device__ __forceinline__ void moe_release(const Common& c, uint64_t e) {
  using namespace tandem::device;
  if (tandem::device::has_proxy(c.comm)) (void)quiet(c.comm);
  for (int q = 0; q < c.comm.world; ++q) (void)signal(c.comm, &c.ctl->ready[c.comm.rank], e, SignalOp::kSet, q);
}

// Every block at its very end (the runtime's finish_block: the last one releases and completes the epoch).
// release = false: the unfused dispatch, whose GEMM (the next kernel) still reads the received rows; the release
// kernel after it releases and completes the epoch.
__device__ __forceinline__ void moe_finish(const Common& c, uint64_t total_blocks, uint64_t e, bool release = true) {
  runtime::finish_block(c.ctl, total_blocks, e, [&] { moe_release(c, e); }, release);
}

__global__ void moe_release_kernel(Common c) {
  if (threadIdx.x == 0) {
    const uint64_t e = runtime::current_epoch(c.ctl);
    moe_release(c, e);
    runtime::complete_epoch(c.ctl, e);
  }
}

template <class Element>
struct DispatchParams {
  typename Gg<Element>::Kernel::Params gemm;
  Common c;
  const char* x;          // the token rows the sends read: the user's x, or x_stage (proxy peers)
  char* x_stage;          // null without proxy peers
  const Element* w;
  uint64_t* arrive;       // [j * world + s]
  int32_t* counts_all;    // [s * E + x]
  int32_t* local_counts;
  uint32_t* rows_done;
  const int32_t* keys_sorted;
  const int32_t* vals_sorted;
  int32_t* expert_rows;
  int32_t* expert_offset;
  int32_t* source_offset;
  int32_t* received;
  int32_t* row_source;
  int32_t* recv_src;
  char* recv_x;
  char* y;
  typename Gg<Element>::Arrays arrays;
  MoeTimeline timeline;   // off (null) unless TANDEM_MOE_TRACE=1
  int late_block;         // TANDEM_MOE_DISPATCH_LATE (tests): blocks from this grid index start late_us late
  uint32_t late_us;
  int senders;            // blocks that send rows: the first this many to join (dispatch_role); fused: comm_blocks,
                          // alone: the whole grid
  bool gemm_role;
  // dedup (DispatchOffsets says what each is; null / false without it)
  bool dedup;
  int max_tokens;
  int32_t* uniq_count;
  const int32_t* uniq_token;
  const int32_t* fan_abs;
  int32_t* uniq_all;
  uint64_t* tok_arrive;
  uint32_t* tok_rows_done;
  int32_t* recv_fan;
  char* tok_buf;
};

__global__ void moe_prepare_kernel(tandem::DeviceComm comm, const int32_t* ids, int n, int experts, int32_t* keys,
                                   int32_t* vals, int32_t* counts) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int id = ids[i];
  if (id < 0 || id >= experts) {
    tandem::device::report(comm, Status::kInvalidArgument, DeviceOp::kNone, -1,
                           static_cast<uint64_t>(static_cast<uint32_t>(id)), static_cast<uint64_t>(i));
    id = experts;  // sorts after every valid id; never sent
  } else {
    atomicAdd(counts + id, 1);
  }
  keys[i] = id;
  vals[i] = i;
}

// dedup, after the sort: each token's distinct destination ranks get a unique index there (uniq_count[q] is
// bumped once per (token, q); the order of the indices is whatever the atomics give, which only places rows in the
// destination's token buffer: the layout, and the bits, do not depend on it); every pair records its token's
// index at its destination. A thread a token.
__global__ void moe_unique_kernel(const int32_t* ids, int tokens, int k, int el, int experts, int max_tokens,
                                  int32_t* uniq_count, int32_t* uniq_token, int32_t* uidx) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  for (int i = 0; i < k; ++i) {
    const int id = ids[t * k + i];
    if (id < 0 || id >= experts) {  // dropped (moe_prepare_kernel reports it)
      uidx[t * k + i] = -1;
      continue;
    }
    const int q = id / el;
    int first = -1;
    for (int j = 0; j < i && first < 0; ++j) {
      const int other = ids[t * k + j];
      if (other >= 0 && other < experts && other / el == q) first = j;
    }
    if (first >= 0) {
      uidx[t * k + i] = uidx[t * k + first];
    } else {
      const int u = atomicAdd(uniq_count + q, 1);
      uniq_token[static_cast<int64_t>(q) * max_tokens + u] = t;
      uidx[t * k + i] = u;
    }
  }
}

// dedup, after moe_unique_kernel: fan_abs[i] = this rank's row in the destination's token buffer for sorted pair i
// (source rank r's unique rows start at r x max_tokens there).
__global__ void moe_fan_kernel(const int32_t* vals_sorted, const int32_t* uidx, int n, int rank, int max_tokens,
                               int32_t* fan_abs) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t u = uidx[vals_sorted[i]];
  fan_abs[i] = u < 0 ? -1 : rank * max_tokens + u;
}

// True (in every thread of the block) if some destination would receive more rows than its receive capacity; `report`:
// record it (kInvalidArgument, once per communicator).
__device__ bool capacity_overrun(const Common& c, const int32_t* counts_all, bool report) {
  const int world = c.comm.world;
  int over = -1;
  int64_t rows = 0;
  for (int q = threadIdx.x; q < world; q += blockDim.x) {
    int64_t n = 0;
    for (int j = 0; j < c.el; ++j)
      for (int s = 0; s < world; ++s) n += counts_all[s * c.experts + q * c.el + j];
    if (n > c.capacity && over < 0) {
      over = q;
      rows = n;
    }
  }
  const bool any = __syncthreads_or(over >= 0) != 0;
  if (any && report && over >= 0)
    tandem::device::report(c.comm, Status::kInvalidArgument, DeviceOp::kNone, over,
                           static_cast<uint64_t>(c.capacity), static_cast<uint64_t>(rows));
  return any;
}

}  // namespace

}  // namespace tandem::kernels::moe
