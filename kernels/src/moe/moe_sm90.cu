// MoE dispatch + grouped GEMM as one persistent kernel, and the combine (sm90a). moe.h has the contract.
//
// Per dispatch launch (epoch e) on rank r, W ranks, E experts (E_l per rank), k slots:
//   prepare  (before the kernel, stream-ordered) count this rank's (token, slot) pairs per expert, and sort the
//            pairs by expert with a stable radix sort (CUB): each expert's pairs are then contiguous, in
//            (token, slot) order. Ids outside [0, E) sort last and are reported.
//   counts   dispatch block 0 waits ready[q] >= e - 1 (q is done with its buffers of e - 1), then puts this
//            rank's count row to every rank (counts_flag[r] = e there)
//   layout   every dispatch block waits for all W count rows; from them each rank knows where its rows go on
//            every destination (expert offsets, then the sources before it); block 0 also writes this rank's
//            receive layout and the grouped GEMM's per-expert shapes and pointers, then sets shapes_ready = e
//   send     warps take chunks of 32 sorted pairs round-robin (starting with rank r+1's experts, to spread the load;
//            experts complete one after another): each copies its
//            token row to the destination row and the pair's flat index to row_source; the warp that completes
//            expert x's rows sets arrive[x_local][r] = e on x's rank (only sources with rows are waited for)
//   GEMM     (fused) GEMM blocks wait shapes_ready, then run CUTLASS's grouped GEMM whose scheduler waits for a
//            group's arrivals before handing out its tiles
//   end      dispatch blocks wait for every arrival, copy row_source to the local layout; the last block sets
//            ready[r] = e on every rank and completes the epoch
//
// Combine launch (epoch e of its own workspace): every rank sends each row of z to the (token, slot) it came
// from (after ready[s] >= e - 1: s finished reading its buffer), the warp completing source s's rows sets
// done[r] = e there; then every rank waits for every done[q] and reduces out[t] = sum_slot w[t, slot] * row in
// slot order (fp32, one rounding).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cub/device/device_radix_sort.cuh>
#include <cstdlib>
#include <vector>

#include "../fused/tp_common.cuh"
#include "grouped_gemm_sm90.hpp"
#include "tandem/kernels/moe/moe.h"

namespace tandem::kernels::moe {

namespace {

using tp::detail::block_ok;
using tp::detail::fail;
using tp::detail::finish_block;
using tp::detail::launch_clustered;
using tp::detail::last_of;

// Optional per-block timeline of the dispatch launch (TANDEM_MOE_TRACE=1, read back by trace_snapshot(); the
// diagnostic tools/diag/moe_fused.py prints it): globaltimer stamps at each block's phase boundaries. The
// globaltimer is one clock for every process on a GPU, so MPS ranks' timelines line up. Off (null): no stores.
using detail::kTraceBlocks;  // (grouped_gemm_sm90.hpp writes slots 2, 6, 7 too)
using detail::kTraceSlots;
__device__ uint64_t g_moe_trace[kTraceBlocks * kTraceSlots];

__device__ __forceinline__ void trace_stamp(uint64_t* trace, int slot) {
  if (trace != nullptr && threadIdx.x == 0) {
    const int b = static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x);
    if (b < kTraceBlocks) trace[b * kTraceSlots + slot] = tandem::device::now_ns();
  }
}

constexpr int kMaxExperts = 4096;         // shared-memory tables of the send blocks
constexpr int32_t kSendChunk = 32;        // pairs a warp sends before the next warp's turn (see dispatch_role)
constexpr uint32_t kArrivalPollNs = 1000;  // dispatch blocks waiting for the last arrivals: leave the memory
                                           // system to the senders
constexpr int kMaxWorldMoe = 64;
using tp::detail::WorkspaceCarver;

struct alignas(128) MoeControl {
  uint64_t epoch;
  uint64_t done_blocks;
  uint64_t shapes_ready;           // local: the GEMM's shapes and pointers of this epoch are written
  uint64_t pad0[13];
  uint64_t counts_flag[kMaxWorldMoe];  // source s's count row landed
  uint64_t ready[kMaxWorldMoe];        // rank q finished with everything the others wrote for that epoch
  uint64_t done[kMaxWorldMoe];         // combine: rank q sent every row of this rank's tokens
};
static_assert(sizeof(MoeControl) <= 4096, "control block must fit 4 KiB");
constexpr size_t kControlBytes = 4096;

int experts_total(const MoeShape& s, int world) { return s.experts_per_rank * world; }

// Byte offsets of everything in the dispatch workspace (the same on every rank: only shapes and world enter).
struct DispatchOffsets {
  size_t arrive, counts_all, local_counts, rows_done, keys, keys_sorted, vals, vals_sorted, cub_temp, cub_bytes;
  size_t shapes, ptr_a, ptr_b, ptr_d, stride_a, stride_b, stride_d, cutlass_ws, cutlass_ws_bytes;
  size_t recv_src, x_stage, recv_x, total;
};

template <class Element>
using Gg = detail::Sm90GroupedGemm<Element>;

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
  o.total = w.at;
  return o;
}

struct Common {
  tandem::DeviceComm comm;
  MoeControl* ctl;
  int tokens, hidden, inter, topk, el, experts;  // experts: E
  int64_t capacity;
};

// Every block at its very end: the last one waits until the proxy delivered every command (the next launch
// overwrites what it reads from the heap), tells every rank this one is done with the epoch, and completes it.
// release = false: the unfused dispatch, whose GEMM (the next kernel) still reads the received rows; the release
// kernel after it does this part.
__device__ __forceinline__ void moe_release(const Common& c, uint64_t e) {
  using namespace tandem::device;
  if (tandem::device::has_proxy(c.comm)) (void)quiet(c.comm);
  for (int q = 0; q < c.comm.world; ++q) (void)signal(c.comm, &c.ctl->ready[c.comm.rank], e, SignalOp::kSet, q);
  tandem::device::local_store(&c.ctl->epoch, e);
}

__device__ __forceinline__ void moe_finish(const Common& c, uint64_t total_blocks, uint64_t e, bool release = true) {
  __syncthreads();
  if (threadIdx.x == 0 && last_of(&c.ctl->done_blocks, total_blocks) && release) moe_release(c, e);
}

__global__ void moe_release_kernel(Common c) {
  if (threadIdx.x == 0) moe_release(c, tandem::device::local_load(&c.ctl->epoch) + 1);
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
  uint64_t* trace;        // null unless TANDEM_MOE_TRACE=1
  int dispatch_rows_y;    // grid rows below this dispatch; the GEMM's follow (fused)
  int dispatch_blocks;
  bool gemm_role;
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

// Receive layout of this rank and the grouped GEMM's arrays (one block; E_l entries).
// empty: the launch overruns a receive capacity (capacity_overrun): every expert gets no rows (the GEMM has no
// tiles, the combine sends nothing).
template <class Element>
__device__ void write_layout(const DispatchParams<Element>& p, uint64_t e, bool empty) {
  const Common& c = p.c;
  const int world = c.comm.world, rank = c.comm.rank;
  if (threadIdx.x == 0) {
    int32_t off = 0;
    for (int j = 0; j < c.el; ++j) {
      const int x = rank * c.el + j;
      int32_t m = 0;
      p.expert_offset[j] = off;
      for (int s = 0; s < world; ++s) {
        p.source_offset[j * (world + 1) + s] = m;
        if (!empty) m += p.counts_all[s * c.experts + x];
      }
      p.source_offset[j * (world + 1) + world] = m;
      p.expert_rows[j] = m;
      off += m;
    }
    p.expert_offset[c.el] = off;
    *p.received = off;
  }
  __syncthreads();
  using G = Gg<Element>;
  for (int j = threadIdx.x; j < c.el; j += blockDim.x) {
    const int32_t off = p.expert_offset[j];
    p.arrays.shapes[j] = typename G::Shape3{p.expert_rows[j], c.inter, c.hidden};
    p.arrays.a[j] = reinterpret_cast<const Element*>(p.recv_x) + static_cast<size_t>(off) * c.hidden;
    p.arrays.b[j] = p.w + static_cast<size_t>(j) * c.hidden * c.inter;
    p.arrays.d[j] = reinterpret_cast<Element*>(p.y) + static_cast<size_t>(off) * c.inter;
    p.arrays.da[j] = cute::make_stride(int64_t(c.hidden), cute::Int<1>{}, cute::Int<0>{});
    p.arrays.db[j] = cute::make_stride(cute::Int<1>{}, int64_t(c.inter), cute::Int<0>{});
    p.arrays.dd[j] = cute::make_stride(int64_t(c.inter), cute::Int<1>{}, cute::Int<0>{});
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    tandem::device::local_publish(&c.ctl->shapes_ready, e);
  }
}

template <class Element>
__device__ void dispatch_role(const DispatchParams<Element>& p, int db, uint64_t e, int32_t* smem_i) {
  using namespace tandem::device;
  const Common& c = p.c;
  const DeviceComm& comm = c.comm;
  const int world = comm.world, rank = comm.rank, E = c.experts;
  Status st = Status::kOk;
  // Every destination must be done with its buffers of e - 1 (counts, rows, row sources) before any of ours land.
  if (threadIdx.x == 0) {
    for (int q = 0; q < world && st == Status::kOk; ++q) st = wait_until(comm, &c.ctl->ready[q], Cmp::kGe, e - 1, q);
  }
  if (!block_ok(st)) return;
  trace_stamp(p.trace, 1);
  if (db == 0) {
    __syncthreads();
    for (int q = 0; q < world && block_ok(st); ++q)
      st = put_signal<Group::kBlock>(comm, p.counts_all + rank * E, p.local_counts, sizeof(int32_t) * E,
                                     &c.ctl->counts_flag[rank], e, SignalOp::kSet, q);
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < world && st == Status::kOk; ++s)
      st = wait_until(comm, &c.ctl->counts_flag[s], Cmp::kGe, e, s);
  }
  if (!block_ok(st)) return;
  trace_stamp(p.trace, 2);
  // Receive capacity guard: rows that every destination would receive, from the count rows every rank now holds
  // (the same on every rank). More than the capacity (moe.h: distinct experts per token; the same expert twice in
  // a token's top-k, or max_tokens that differ between ranks, can exceed it) would write past y, the layout and
  // the heap buffers: then no rank sends anything, every layout is empty, and the launch reports
  // kInvalidArgument (peer: the destination, expected: its capacity, observed: the rows) and completes.
  const bool overrun = capacity_overrun(c, p.counts_all, db == 0);
  if (db == 0) write_layout(p, e, overrun);
  if (overrun) return;
  // Where this rank's rows of every expert go: base[x] = x's offset on its rank + the rows of sources before us;
  // seg[x] = where x's pairs start in the sorted list.
  int32_t* base = smem_i;
  int32_t* seg = smem_i + E + 1;
  for (int x = threadIdx.x; x < E; x += blockDim.x) {
    int32_t before = 0;
    for (int s = 0; s < rank; ++s) before += p.counts_all[s * E + x];
    base[x] = before;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t pos = 0;
    for (int x = 0; x < E; ++x) {
      seg[x] = pos;
      pos += p.local_counts[x];
    }
    seg[E] = pos;
  }
  // Expert offsets on each destination: one thread per destination rank.
  for (int q = threadIdx.x; q < world; q += blockDim.x) {
    int32_t off = 0;
    for (int j = 0; j < c.el; ++j) {
      const int x = q * c.el + j;
      base[x] += off;
      int32_t m = 0;
      for (int s = 0; s < world; ++s) m += p.counts_all[s * E + x];
      off += m;
    }
  }
  __syncthreads();
  const int32_t valid = seg[E];
  const int32_t rot = seg[((rank + 1) % world) * c.el];  // start with the next rank's experts
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t row_bytes = static_cast<size_t>(c.hidden) * sizeof(Element);
  // Warps take chunks of kSendChunk consecutive (rotated) sorted pairs round-robin, so the pairs leave in
  // expert order across the whole dispatch and each expert's rows complete early, one after another, for the
  // GEMM to start on (a contiguous share per warp would complete every expert only near the end). Consecutive
  // pairs of one expert in a chunk land in consecutive rows of one destination: their row sources leave as one
  // put, counted with one fence and one atomic per run (not per row).
  const int total_warps = p.dispatch_blocks * warps;
  const int global_warp = db * warps + warp;
  int run_x = -1;
  int32_t run_idx = 0, run_pos = 0, run_n = 0;
  const auto flush = [&]() {
    if (run_n == 0) return;
    __syncwarp();  // every lane's row stores precede lane 0's release below
    if (lane == 0) {
      const int q = run_x / c.el, j = run_x % c.el;
      Status s2 = put<Group::kThread>(comm, p.recv_src + run_pos, p.vals_sorted + run_idx, sizeof(int32_t) * run_n, q);
      if (st == Status::kOk) st = s2;
      tandem::device::fence_system();
      const uint32_t done = atomicAdd(&p.rows_done[run_x], static_cast<uint32_t>(run_n)) + run_n;
      if (done == static_cast<uint32_t>(p.local_counts[run_x])) {  // the last rows of expert x from this rank
        tandem::device::fence_system();
        s2 = signal(comm, &p.arrive[j * world + rank], e, SignalOp::kSet, q);
        if (st == Status::kOk) st = s2;
      }
    }
    st = static_cast<Status>(__shfl_sync(0xffffffffu, static_cast<int>(st), 0));
    run_n = 0;
  };
  for (int32_t c0 = global_warp * kSendChunk; c0 < valid && st == Status::kOk;
       c0 += static_cast<int32_t>(total_warps) * kSendChunk) {
    const int32_t c1 = min(valid, c0 + kSendChunk);
    for (int32_t i = c0; i < c1 && st == Status::kOk; ++i) {
      int32_t idx = i + rot;
      if (idx >= valid) idx -= valid;
      const int x = p.keys_sorted[idx];
      const int32_t pos = base[x] + (idx - seg[x]);
      if (x != run_x || idx != run_idx + run_n) {
        flush();
        run_x = x, run_idx = idx, run_pos = pos;
      }
      const int t = p.vals_sorted[idx] / c.topk;
      const Status s2 = put<Group::kWarp>(comm, p.recv_x + static_cast<size_t>(pos) * row_bytes,
                                          p.x + static_cast<size_t>(t) * row_bytes, row_bytes, x / c.el);
      if (st == Status::kOk) st = s2;
      ++run_n;
    }
    flush();  // the chunk's last run: its expert may be complete now
  }
  flush();
  __syncthreads();
  trace_stamp(p.trace, 3);
  // Every row addressed to this rank has landed: the GEMM (unfused: launched next) may read them all, and the
  // row sources are copied out before ready[r] = e lets the next epoch's senders overwrite them.
  if (threadIdx.x == 0) {
    for (int j = 0; j < c.el && st == Status::kOk; ++j) {
      for (int s = 0; s < world && st == Status::kOk; ++s) {
        if (p.counts_all[s * E + rank * c.el + j] == 0) continue;
        st = wait_until_backoff(comm, &p.arrive[j * world + s], Cmp::kGe, e, kArrivalPollNs, s);
      }
    }
  }
  if (!block_ok(st)) return;
  trace_stamp(p.trace, 4);
  int32_t received = 0;  // (from the counts: block 0's layout writes are not ordered before this block)
  for (int j = 0; j < c.el; ++j)
    for (int s = 0; s < world; ++s) received += p.counts_all[s * E + rank * c.el + j];
  for (int32_t r = db * blockDim.x + threadIdx.x; r < received; r += p.dispatch_blocks * blockDim.x)
    p.row_source[r] = p.recv_src[r];
}

template <class Element>
__global__ void __launch_bounds__(Gg<Element>::Kernel::MaxThreadsPerBlock, 1)
    moe_dispatch_kernel(const __grid_constant__ DispatchParams<Element> p) {
  extern __shared__ __align__(128) char smem[];
  using namespace tandem::device;
  MoeControl* ctl = p.c.ctl;
  const uint64_t e = tandem::device::local_load(&ctl->epoch) + 1;
  const bool gemm_block = p.gemm_role && static_cast<int>(blockIdx.y) >= p.dispatch_rows_y;
  trace_stamp(p.trace, 0);
  if (gemm_block) {
    Status st = Status::kOk;
    // shapes and pointers of this epoch (written by dispatch block 0)
    if (threadIdx.x == 0) st = wait_until_backoff(p.c.comm, &ctl->shapes_ready, Cmp::kGe, e, 1000, p.c.comm.rank);
    if (block_ok(st)) {
      trace_stamp(p.trace, 1);
      typename Gg<Element>::Kernel op;
      op(p.gemm, smem);
    }
    __syncthreads();
    trace_stamp(p.trace, 4);
  } else {
    const int db = static_cast<int>(blockIdx.y) * 2 + static_cast<int>(blockIdx.x);
    dispatch_role(p, db, e, reinterpret_cast<int32_t*>(smem));
    __syncthreads();
  }
  trace_stamp(p.trace, 5);
  moe_finish(p.c, static_cast<uint64_t>(gridDim.x) * gridDim.y, e, p.gemm_role);
}

// The experts' GEMM alone (unfused: after the dispatch kernel, which waited for every row).
template <class Element>
__global__ void __launch_bounds__(Gg<Element>::Kernel::MaxThreadsPerBlock, 1)
    moe_gemm_kernel(const __grid_constant__ typename Gg<Element>::Kernel::Params p) {
  extern __shared__ __align__(128) char smem[];
  typename Gg<Element>::Kernel op;
  op(p, smem);
}

// ---------------------------------------------------------------------------------------------------------------
// Combine.

constexpr int kCombineThreads = 512;

struct CombineParams {
  Common c;
  int dim;
  const char* z;          // rows the sends read: the user's z, or z_stage (proxy peers)
  char* z_stage;
  const int32_t* layout;
  LayoutIndex li;
  const int32_t* topk_ids;
  const float* weights;
  char* comb_in;          // symmetric: T_max * k rows of D
  int64_t comb_rows;      // T_max * k: a row source at or past it is refused (reported), never written
  char* out;
  uint32_t* rows_sent;    // [world]
  int blocks;
  int esize;
};

// Proxy peers read the rows they send from the heap: the combine's rows (layout[0] of them, known only on the
// device) are copied there by this kernel, stream-ordered before the send kernel. (Staging inside the send
// kernel needed a grid-wide wait before the first send, i.e. every block resident at once, which MPS ranks
// sharing one GPU do not guarantee: the 4-rank emulated-node test deadlocked on it.)
__global__ void moe_stage_rows_kernel(const int32_t* received, int64_t capacity, const char* src, char* dst,
                                      size_t row_bytes) {
  const int32_t rows = *received;  // (the combine kernel reports a count outside [0, capacity])
  const size_t bytes = static_cast<size_t>(rows < 0 ? 0 : (rows > capacity ? capacity : rows)) * row_bytes;
  for (size_t i = 16 * (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x); i < bytes;
       i += 16 * static_cast<size_t>(gridDim.x) * blockDim.x)
    *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(src + i);
}

template <class Element>
__device__ __forceinline__ float to_f(Element v) { return static_cast<float>(v); }

template <class Element>
__global__ void __launch_bounds__(kCombineThreads, 1) moe_combine_kernel(const __grid_constant__ CombineParams p) {
  using namespace tandem::device;
  __shared__ int32_t expected[kMaxWorldMoe];
  const Common& c = p.c;
  const DeviceComm& comm = c.comm;
  const int world = comm.world, rank = comm.rank;
  MoeControl* ctl = c.ctl;
  const uint64_t e = tandem::device::local_load(&ctl->epoch) + 1;
  const int b = blockIdx.x;
  const int32_t* offset = p.layout + p.li.offset;
  const int32_t* source = p.layout + p.li.source;
  const int32_t* row_source = p.layout + p.li.row_source;
  int32_t received = p.layout[0];
  const size_t row_bytes = static_cast<size_t>(p.dim) * p.esize;
  Status st = Status::kOk;
  if (received < 0 || received > c.capacity) {  // not a dispatch layout of this shape: send nothing
    if (b == 0 && threadIdx.x == 0)
      tandem::device::report(comm, Status::kInvalidArgument, DeviceOp::kNone, -1, static_cast<uint64_t>(c.capacity),
                             static_cast<uint64_t>(static_cast<uint32_t>(received)));
    received = 0;
  }
  if (threadIdx.x == 0) {  // every source is done reading its combine buffer of e - 1
    for (int q = 0; q < world && st == Status::kOk; ++q) st = wait_until(comm, &ctl->ready[q], Cmp::kGe, e - 1, q);
  }
  if (!block_ok(st)) goto finish;
  for (int s = threadIdx.x; s < world; s += blockDim.x) {
    int32_t n = 0;
    for (int j = 0; j < c.el; ++j) n += source[j * (world + 1) + s + 1] - source[j * (world + 1) + s];
    expected[s] = n;
  }
  __syncthreads();
  if (b == 0 && threadIdx.x == 0) {  // sources this rank holds no rows of: nothing will complete them
    for (int s = 0; s < world; ++s)
      if (expected[s] == 0) (void)signal(comm, &ctl->done[rank], e, SignalOp::kSet, s);
  }
  {
    const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int total_warps = p.blocks * warps;
    const int32_t per_warp = (received + total_warps - 1) / total_warps;
    const int32_t r0 = min(received, (b * warps + warp) * per_warp), r1 = min(received, r0 + per_warp);
    int run_s = -1, run_n = 0;
    const auto flush = [&]() {
      if (run_n == 0) return;
      __syncwarp();
      if (lane == 0) {
        tandem::device::fence_system();
        if (atomicAdd(&p.rows_sent[run_s], static_cast<uint32_t>(run_n)) + run_n ==
            static_cast<uint32_t>(expected[run_s])) {
          tandem::device::fence_system();
          const Status s2 = signal(comm, &ctl->done[rank], e, SignalOp::kSet, run_s);
          if (st == Status::kOk) st = s2;
        }
      }
      st = static_cast<Status>(__shfl_sync(0xffffffffu, static_cast<int>(st), 0));
      run_n = 0;
    };
    int j = 0;
    for (int32_t r = r0; r < r1 && st == Status::kOk; ++r) {
      while (j + 1 < c.el && offset[j + 1] <= r) ++j;  // rows ascend: the expert only moves forward
      if (r < offset[j]) {                               // (r0 may start past several experts)
        j = 0;
        while (j + 1 < c.el && offset[j + 1] <= r) ++j;
      }
      const int32_t rel = r - offset[j];
      int s = 0;
      while (s + 1 < world && source[j * (world + 1) + s + 1] <= rel) ++s;
      if (s != run_s) {
        flush();
        run_s = s;
      }
      const int32_t flat = row_source[r];
      if (flat < 0 || flat >= p.comb_rows) {  // past the source's combine buffer: refused, reported
        if (lane == 0)
          tandem::device::report(comm, Status::kInvalidArgument, DeviceOp::kNone, s, static_cast<uint64_t>(p.comb_rows),
                                 static_cast<uint64_t>(static_cast<uint32_t>(flat)));
        st = Status::kInvalidArgument;
        break;
      }
      const Status s2 = put<Group::kWarp>(comm, p.comb_in + static_cast<size_t>(flat) * row_bytes,
                                          p.z + static_cast<size_t>(r) * row_bytes, row_bytes, s);
      if (st == Status::kOk) st = s2;
      ++run_n;
    }
    flush();
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // every rank's rows of this rank's tokens have landed
    for (int q = 0; q < world && st == Status::kOk; ++q) st = wait_until(comm, &ctl->done[q], Cmp::kGe, e, q);
  }
  if (!block_ok(st)) goto finish;
  {
    // out[t] = sum over slots in order of w * row (fp32), 8 columns per thread step
    const int vecs = p.dim / 8;
    const int64_t items = static_cast<int64_t>(c.tokens) * vecs;
    for (int64_t it = static_cast<int64_t>(b) * blockDim.x + threadIdx.x; it < items;
         it += static_cast<int64_t>(p.blocks) * blockDim.x) {
      const int t = static_cast<int>(it / vecs), v = static_cast<int>(it % vecs);
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int slot = 0; slot < c.topk; ++slot) {
        const int id = p.topk_ids[t * c.topk + slot];
        if (id < 0 || id >= c.experts) continue;
        const float w = p.weights[t * c.topk + slot];
        const Element* row = reinterpret_cast<const Element*>(p.comb_in + static_cast<size_t>(t * c.topk + slot) * row_bytes);
        const uint4 raw = reinterpret_cast<const uint4*>(row)[v];
        const Element* x = reinterpret_cast<const Element*>(&raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += w * to_f(x[i]);
      }
      uint4 o;
      Element* y = reinterpret_cast<Element*>(&o);
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = Element(acc[i]);
      reinterpret_cast<uint4*>(p.out + static_cast<size_t>(t) * row_bytes)[v] = o;
    }
  }
finish:
  moe_finish(c, gridDim.x, e);
}

// ---------------------------------------------------------------------------------------------------------------
// Host side.

int bits_for(int values) {  // radix-sort bits for keys in [0, values]
  int b = 1;
  while ((1 << b) <= values) ++b;
  return b;
}

Status check_shape(const MoeShape& s, const tandem::DeviceComm& comm, std::string* why) {
  const int world = comm.world;
  if (world < 1 || world > kMaxWorldMoe) return fail(why, "world size must be in [1, 64]");
  if (s.experts_per_rank < 1) return fail(why, "experts_per_rank must be at least 1");
  const int E = experts_total(s, world);
  if (E > kMaxExperts) return fail(why, "at most 4096 experts in all");
  if (s.topk < 1 || s.topk > E) return fail(why, "topk must be in [1, experts]");
  if (s.tokens < 0 || s.max_tokens < 1 || s.tokens > s.max_tokens) return fail(why, "need 0 <= tokens <= max_tokens, max_tokens >= 1");
  if (s.hidden <= 0 || s.hidden % 8) return fail(why, "hidden must be a positive multiple of 8");
  const int64_t cap = receive_capacity(s, world);
  if (static_cast<int64_t>(s.max_tokens) * s.topk > (int64_t(1) << 30) || cap > (int64_t(1) << 30))
    return fail(why, "max_tokens * topk (and the receive capacity) must stay below 2^30");
  return Status::kOk;
}

Status check_common_moe(const tandem::DeviceComm& comm, DType dtype, const void* workspace, size_t ws_bytes,
                        std::string* why) {
  if (dtype != DType::kBF16 && dtype != DType::kFP16) return fail(why, "dtype must be bf16 or fp16");
  if (workspace == nullptr) return fail(why, "null workspace");
  if (reinterpret_cast<uintptr_t>(workspace) & 255u) return fail(why, "the workspace must be 256-byte aligned");
  const char* ws = static_cast<const char*>(workspace);
  if (ws < comm.heap_base || ws + ws_bytes > comm.heap_base + comm.heap_bytes)
    return fail(why, "the workspace must lie in the communicator's symmetric heap");
  return Status::kOk;
}

SmPlan resolve(const SmPlan& plan) {
  SmPlan p = plan;
  if (p.comm_blocks <= 0) {
    int c = p.sm_count / 8;
    p.comm_blocks = (c < 2 ? 2 : c) & ~1;
  }
  return p;
}

template <class Element>
Status run_typed(const DispatchArgs& a, cudaStream_t stream, bool fused, std::string* why) {
  using G = Gg<Element>;
  using Kernel = typename G::Kernel;
  const MoeShape& s = a.shape;
  const int world = a.comm.world, rank = a.comm.rank, el = s.experts_per_rank, E = experts_total(s, world);
  const SmPlan plan = resolve(a.plan);
  const DispatchOffsets o = offsets_of(a);
  const LayoutIndex li = layout_index(s, world);
  char* ws = static_cast<char*>(a.workspace);
  DispatchParams<Element> p{};
  p.c.comm = a.comm;
  p.c.ctl = reinterpret_cast<MoeControl*>(ws);
  p.c.tokens = s.tokens;
  p.c.hidden = s.hidden;
  p.c.inter = s.inter;
  p.c.topk = s.topk;
  p.c.el = el;
  p.c.experts = E;
  p.c.capacity = receive_capacity(s, world);
  p.x_stage = tandem::device::has_proxy(a.comm) ? ws + o.x_stage : nullptr;
  p.x = p.x_stage != nullptr ? p.x_stage : static_cast<const char*>(a.x);
  p.w = static_cast<const Element*>(a.w);
  p.arrive = reinterpret_cast<uint64_t*>(ws + o.arrive);
  p.counts_all = reinterpret_cast<int32_t*>(ws + o.counts_all);
  p.local_counts = reinterpret_cast<int32_t*>(ws + o.local_counts);
  p.rows_done = reinterpret_cast<uint32_t*>(ws + o.rows_done);
  p.keys_sorted = reinterpret_cast<const int32_t*>(ws + o.keys_sorted);
  p.vals_sorted = reinterpret_cast<const int32_t*>(ws + o.vals_sorted);
  p.received = a.layout;
  p.expert_rows = a.layout + li.rows;
  p.expert_offset = a.layout + li.offset;
  p.source_offset = a.layout + li.source;
  p.row_source = a.layout + li.row_source;
  p.recv_src = reinterpret_cast<int32_t*>(ws + o.recv_src);
  p.recv_x = ws + o.recv_x;
  p.y = static_cast<char*>(a.y);
  p.arrays.shapes = reinterpret_cast<typename G::Shape3*>(ws + o.shapes);
  p.arrays.a = reinterpret_cast<const Element**>(ws + o.ptr_a);
  p.arrays.b = reinterpret_cast<const Element**>(ws + o.ptr_b);
  p.arrays.d = reinterpret_cast<Element**>(ws + o.ptr_d);
  p.arrays.da = reinterpret_cast<typename G::StrideA*>(ws + o.stride_a);
  p.arrays.db = reinterpret_cast<typename G::StrideB*>(ws + o.stride_b);
  p.arrays.dd = reinterpret_cast<typename G::StrideD*>(ws + o.stride_d);
  p.dispatch_blocks = plan.comm_blocks;
  p.dispatch_rows_y = plan.comm_blocks / 2;

  // Proxy peers read the token rows from the heap: copy them there first, stream-ordered (no grid-wide wait in
  // the kernel; see moe_stage_rows_kernel).
  if (p.x_stage != nullptr && s.tokens > 0 &&
      cudaMemcpyAsync(p.x_stage, a.x, static_cast<size_t>(s.tokens) * s.hidden * sizeof(Element),
                      cudaMemcpyDeviceToDevice, stream) != cudaSuccess)
    return fail(why, "staging x failed", Status::kCudaError);
  // prepare: counts and the sorted (token, slot) pairs
  const int n = s.tokens * s.topk;
  if (cudaMemsetAsync(p.local_counts, 0, sizeof(int32_t) * E, stream) != cudaSuccess ||
      cudaMemsetAsync(p.rows_done, 0, sizeof(uint32_t) * E, stream) != cudaSuccess)
    return fail(why, "cudaMemsetAsync failed", Status::kCudaError);
  if (n > 0) {
    int32_t* keys = reinterpret_cast<int32_t*>(ws + o.keys);
    int32_t* vals = reinterpret_cast<int32_t*>(ws + o.vals);
    moe_prepare_kernel<<<(n + 255) / 256, 256, 0, stream>>>(a.comm, a.topk_ids, n, E, keys, vals, p.local_counts);
    size_t temp = o.cub_bytes;
    if (cub::DeviceRadixSort::SortPairs(ws + o.cub_temp, temp, keys, const_cast<int32_t*>(p.keys_sorted), vals,
                                        const_cast<int32_t*>(p.vals_sorted), n, 0, bits_for(E), stream) != cudaSuccess)
      return fail(why, "the routing sort failed", Status::kCudaError);
  }
  const int grid_y = plan.sm_count / 2;
  p.trace = nullptr;
  if (const char* v = std::getenv("TANDEM_MOE_TRACE"); v != nullptr && v[0] == '1') {
    void* sym = nullptr;
    if (cudaGetSymbolAddress(&sym, g_moe_trace) != cudaSuccess ||
        cudaMemsetAsync(sym, 0, sizeof(uint64_t) * kTraceBlocks * kTraceSlots, stream) != cudaSuccess)
      return fail(why, "the trace buffer is unavailable", Status::kCudaError);
    p.trace = static_cast<uint64_t*>(sym);
  }
  detail::ExpertArrivals arr;
  arr.trace = p.trace;
  if (const char* v = std::getenv("TANDEM_MOE_POLL_NS"))  // diagnostic override of the scheduler's poll sleep
    arr.poll_sleep_ns = static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
  arr.comm = a.comm;
  arr.world = world;
  arr.expert0 = rank * el;
  arr.experts_total = E;
  if (fused) {
    arr.flags = p.arrive;
    arr.counts = p.counts_all;
    arr.epoch_counter = &p.c.ctl->epoch;
    arr.gemm_block_y0 = p.dispatch_rows_y;
    arr.gemm_grid_y = grid_y - p.dispatch_rows_y;
  }
  auto args = G::arguments(el, p.arrays, arr, 2 * grid_y);  // tensormap slots: every block of the grid
  if (Kernel::can_implement(args) == false) return fail(why, "CUTLASS cannot implement this grouped GEMM");
  if (Kernel::get_workspace_size(args) > o.cutlass_ws_bytes)
    return fail(why, "grouped GEMM workspace larger than reserved", Status::kInternal);
  p.gemm = Kernel::to_underlying_arguments(args, ws + o.cutlass_ws);
  const int dispatch_smem = static_cast<int>(sizeof(int32_t) * (2 * E + 2));
  const auto launch = [&](auto kernel, dim3 grid, int smem, const auto& params) {
    const cudaError_t err = launch_clustered(kernel, grid, Kernel::MaxThreadsPerBlock, smem, stream, params);
    return err == cudaSuccess ? Status::kOk
                              : fail(why, std::string("launch failed: ") + cudaGetErrorString(err), Status::kCudaError);
  };
  if (fused) {
    p.gemm_role = true;
    const int smem = Kernel::SharedStorageSize > dispatch_smem ? static_cast<int>(Kernel::SharedStorageSize) : dispatch_smem;
    return launch(moe_dispatch_kernel<Element>, dim3(2, grid_y, 1), smem, p);
  }
  p.gemm_role = false;
  if (Status st = launch(moe_dispatch_kernel<Element>, dim3(2, p.dispatch_rows_y, 1), dispatch_smem, p);
      st != Status::kOk)
    return st;
  if (Status st = launch(moe_gemm_kernel<Element>, dim3(2, grid_y, 1), static_cast<int>(Kernel::SharedStorageSize),
                         p.gemm);
      st != Status::kOk)
    return st;
  moe_release_kernel<<<1, 32, 0, stream>>>(p.c);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? Status::kOk
                            : fail(why, std::string("launch failed: ") + cudaGetErrorString(err), Status::kCudaError);
}

struct CombineOffsets {
  size_t comb_in, rows_sent, z_stage, total;
};

CombineOffsets combine_offsets(const CombineArgs& a) {
  const MoeShape& s = a.shape;
  CombineOffsets o{};
  WorkspaceCarver w{kControlBytes};
  const auto take = [&](size_t bytes) { return w.take(bytes); };
  o.comb_in = take(static_cast<size_t>(s.max_tokens) * s.topk * a.dim * 2);
  o.rows_sent = take(sizeof(uint32_t) * a.comm.world);
  o.z_stage = take(tandem::device::has_proxy(a.comm) ? static_cast<size_t>(receive_capacity(s, a.comm.world)) * a.dim * 2 : 0);
  o.total = w.at;
  return o;
}

}  // namespace

int64_t receive_capacity(const MoeShape& s, int world) {
  const int per = s.topk < s.experts_per_rank ? s.topk : s.experts_per_rank;
  return static_cast<int64_t>(world) * s.max_tokens * (per > 0 ? per : 0);
}

LayoutIndex layout_index(const MoeShape& s, int world) {
  LayoutIndex li;
  li.rows = 1;
  li.offset = li.rows + s.experts_per_rank;
  li.source = li.offset + s.experts_per_rank + 1;
  li.row_source = li.source + static_cast<int64_t>(s.experts_per_rank) * (world + 1);
  li.size = li.row_source + receive_capacity(s, world);
  return li;
}

size_t workspace_size(const DispatchArgs& a) { return offsets_of(a).total; }

Status can_implement(const DispatchArgs& a, std::string* why) {
  if (Status st = check_shape(a.shape, a.comm, why); st != Status::kOk) return st;
  if (a.shape.inter <= 0 || a.shape.inter % 8) return fail(why, "inter must be a positive multiple of 8");
  if ((a.x == nullptr && a.shape.tokens > 0) || (a.topk_ids == nullptr && a.shape.tokens > 0) || a.w == nullptr ||
      a.y == nullptr || a.layout == nullptr)
    return fail(why, "null pointer");
  const auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) != 0; };
  if (misaligned(a.x) || misaligned(a.w) || misaligned(a.y)) return fail(why, "x, w and y must be 16-byte aligned");
  const SmPlan plan = resolve(a.plan);
  if (plan.sm_count < 4) return fail(why, "sm_count must be the SMs this rank has");
  if (plan.comm_blocks < 2 || plan.comm_blocks % 2) return fail(why, "comm_blocks must be even and at least 2");
  if (plan.sm_count - plan.comm_blocks < 2) return fail(why, "no SMs left for the GEMM");
  return check_common_moe(a.comm, a.dtype, a.workspace, workspace_size(a), why);
}

Status run(const DispatchArgs& a, cudaStream_t stream, std::string* why) {
  if (Status st = can_implement(a, why); st != Status::kOk) return st;
  if (a.dtype == DType::kFP16) return run_typed<cutlass::half_t>(a, stream, true, why);
  return run_typed<cutlass::bfloat16_t>(a, stream, true, why);
}

Status run_unfused(const DispatchArgs& a, cudaStream_t stream, std::string* why) {
  if (Status st = can_implement(a, why); st != Status::kOk) return st;
  if (a.dtype == DType::kFP16) return run_typed<cutlass::half_t>(a, stream, false, why);
  return run_typed<cutlass::bfloat16_t>(a, stream, false, why);
}

size_t workspace_size(const CombineArgs& a) { return combine_offsets(a).total; }

Status can_implement(const CombineArgs& a, std::string* why) {
  if (Status st = check_shape(a.shape, a.comm, why); st != Status::kOk) return st;
  if (a.dim <= 0 || a.dim % 8) return fail(why, "dim must be a positive multiple of 8");
  // A rank with no tokens passes empty tensors (torch gives them a null data pointer): out, weights and ids are
  // never touched then.
  if (a.z == nullptr || a.layout == nullptr ||
      (a.shape.tokens > 0 && (a.out == nullptr || a.topk_weights == nullptr || a.topk_ids == nullptr)))
    return fail(why, "null pointer");
  if ((reinterpret_cast<uintptr_t>(a.z) | reinterpret_cast<uintptr_t>(a.out)) & 15u)
    return fail(why, "z and out must be 16-byte aligned");
  if (a.plan.sm_count < 1) return fail(why, "sm_count must be the SMs this rank has");
  return check_common_moe(a.comm, a.dtype, a.workspace, workspace_size(a), why);
}

Status run(const CombineArgs& a, cudaStream_t stream, std::string* why) {
  if (Status st = can_implement(a, why); st != Status::kOk) return st;
  const CombineOffsets o = combine_offsets(a);
  char* ws = static_cast<char*>(a.workspace);
  CombineParams p{};
  p.c.comm = a.comm;
  p.c.ctl = reinterpret_cast<MoeControl*>(ws);
  p.c.tokens = a.shape.tokens;
  p.c.hidden = a.shape.hidden;
  p.c.topk = a.shape.topk;
  p.c.el = a.shape.experts_per_rank;
  p.c.experts = experts_total(a.shape, a.comm.world);
  p.c.capacity = receive_capacity(a.shape, a.comm.world);
  p.dim = a.dim;
  p.z_stage = tandem::device::has_proxy(a.comm) ? ws + o.z_stage : nullptr;
  p.z = p.z_stage != nullptr ? p.z_stage : static_cast<const char*>(a.z);
  p.layout = a.layout;
  p.li = layout_index(a.shape, a.comm.world);
  p.topk_ids = a.topk_ids;
  p.weights = a.topk_weights;
  p.comb_in = ws + o.comb_in;
  p.comb_rows = static_cast<int64_t>(a.shape.max_tokens) * a.shape.topk;
  p.out = static_cast<char*>(a.out);
  p.rows_sent = reinterpret_cast<uint32_t*>(ws + o.rows_sent);
  p.esize = 2;
  const int blocks = a.plan.sm_count < 32 ? a.plan.sm_count : 32;
  p.blocks = blocks;
  if (cudaMemsetAsync(p.rows_sent, 0, sizeof(uint32_t) * a.comm.world, stream) != cudaSuccess)
    return fail(why, "cudaMemsetAsync failed", Status::kCudaError);
  if (p.z_stage != nullptr)
    moe_stage_rows_kernel<<<blocks, 256, 0, stream>>>(a.layout, p.c.capacity, static_cast<const char*>(a.z),
                                                      p.z_stage, static_cast<size_t>(a.dim) * 2);
  if (a.dtype == DType::kFP16) moe_combine_kernel<__half><<<blocks, kCombineThreads, 0, stream>>>(p);
  else moe_combine_kernel<__nv_bfloat16><<<blocks, kCombineThreads, 0, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? Status::kOk
                            : fail(why, std::string("launch failed: ") + cudaGetErrorString(err), Status::kCudaError);
}

cudaError_t trace_snapshot(std::vector<uint64_t>* out) {
  out->assign(static_cast<size_t>(kTraceBlocks) * kTraceSlots, 0);
  return cudaMemcpyFromSymbol(out->data(), g_moe_trace, sizeof(uint64_t) * out->size());
}

cudaError_t preload_kernels() {
  cudaFuncAttributes attr{};
  const void* fs[] = {
      reinterpret_cast<const void*>(moe_prepare_kernel),
      reinterpret_cast<const void*>(moe_release_kernel),
      reinterpret_cast<const void*>(moe_dispatch_kernel<cutlass::bfloat16_t>),
      reinterpret_cast<const void*>(moe_dispatch_kernel<cutlass::half_t>),
      reinterpret_cast<const void*>(moe_gemm_kernel<cutlass::bfloat16_t>),
      reinterpret_cast<const void*>(moe_gemm_kernel<cutlass::half_t>),
      reinterpret_cast<const void*>(moe_combine_kernel<__nv_bfloat16>),
      reinterpret_cast<const void*>(moe_combine_kernel<__half>),
      reinterpret_cast<const void*>(moe_stage_rows_kernel),
  };
  for (const void* f : fs)
    if (const cudaError_t e = cudaFuncGetAttributes(&attr, f); e != cudaSuccess) return e;
  return cudaSuccess;
}

}  // namespace tandem::kernels::moe
