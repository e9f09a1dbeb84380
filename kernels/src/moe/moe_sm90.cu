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
//   send     warps take the sorted pairs (starting with rank r+1's experts, to spread the load): each copies its
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

constexpr int kMaxExperts = 4096;      // shared-memory tables of the send blocks
constexpr int kMaxWorldMoe = 64;
constexpr size_t kAlign = 256;
constexpr size_t align_up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

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
  size_t expert_rows, expert_offset, source_offset, received, row_source;
  size_t shapes, ptr_a, ptr_b, ptr_d, stride_a, stride_b, stride_d, cutlass_ws;
  size_t recv_src, x_stage, recv_x, y, total;
};

template <class Element>
using Gg = detail::Sm90GroupedGemm<Element>;

size_t cub_temp_bytes(int n) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n < 1 ? 1 : n);
  return bytes;
}

int grid_blocks(const SmPlan& plan) { return plan.sm_count & ~1; }

DispatchOffsets offsets_of(const DispatchArgs& a) {
  const MoeShape& s = a.shape;
  const int world = a.comm.world, el = s.experts_per_rank, e = experts_total(s, world);
  const size_t n = static_cast<size_t>(s.max_tokens) * s.topk, cap = static_cast<size_t>(receive_capacity(s, world));
  DispatchOffsets o{};
  size_t at = kControlBytes;
  auto take = [&](size_t bytes) {
    const size_t r = at;
    at += align_up(bytes);
    return r;
  };
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
  o.expert_rows = take(sizeof(int32_t) * el);
  o.expert_offset = take(sizeof(int32_t) * (el + 1));
  o.source_offset = take(sizeof(int32_t) * el * (world + 1));
  o.received = take(sizeof(int32_t));
  o.row_source = take(sizeof(int32_t) * cap);
  using G = Gg<cutlass::bfloat16_t>;
  o.shapes = take(sizeof(typename G::Shape3) * el);
  o.ptr_a = take(sizeof(void*) * el);
  o.ptr_b = take(sizeof(void*) * el);
  o.ptr_d = take(sizeof(void*) * el);
  o.stride_a = take(sizeof(typename G::StrideA) * el);
  o.stride_b = take(sizeof(typename G::StrideB) * el);
  o.stride_d = take(sizeof(typename G::StrideD) * el);
  o.cutlass_ws = take(size_t(128) * 8 * (grid_blocks(a.plan) + 2));  // tensormaps: a few per block of the grid
  o.recv_src = take(sizeof(int32_t) * cap);
  o.x_stage = take(a.comm.proxy_slots != nullptr ? static_cast<size_t>(s.max_tokens) * s.hidden * 2 : 0);
  o.recv_x = take(cap * s.hidden * 2);
  o.y = take(cap * s.inter * 2);
  o.total = at;
  return o;
}

struct Common {
  tandem::DeviceComm comm;
  MoeControl* ctl;
  int tokens, hidden, inter, topk, el, experts;  // experts: E
  int64_t capacity;
};

template <class Element>
struct DispatchParams {
  typename Gg<Element>::Kernel::Params gemm;
  Common c;
  const char* x;          // the token rows the sends read: the user's x, or x_stage (proxy peers)
  const char* x_user;
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
    tandem::device::impl::report_error(comm, Status::kInvalidArgument, DeviceOp::kNone, -1,
                                       static_cast<uint64_t>(static_cast<uint32_t>(id)), static_cast<uint64_t>(i), 0);
    id = experts;  // sorts after every valid id; never sent
  } else {
    atomicAdd(counts + id, 1);
  }
  keys[i] = id;
  vals[i] = i;
}

// Receive layout of this rank and the grouped GEMM's arrays (one block; E_l entries).
template <class Element>
__device__ void write_layout(const DispatchParams<Element>& p) {
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
        m += p.counts_all[s * c.experts + x];
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
    tandem::device::impl::st_release_gpu(&c.ctl->shapes_ready, tandem::device::impl::ld_relaxed_gpu(&c.ctl->epoch) + 1);
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
  // Stage the token rows in the heap when some destination is reached through the proxy (it reads by offset).
  if (p.x_stage != nullptr) {
    const size_t bytes = static_cast<size_t>(c.tokens) * c.hidden * sizeof(Element);
    size_t lo, hi;
    tp::detail::split16(bytes, p.dispatch_blocks, db, &lo, &hi);
    for (size_t i = lo + 16 * threadIdx.x; i < hi; i += 16 * blockDim.x)
      *reinterpret_cast<uint4*>(p.x_stage + i) = *reinterpret_cast<const uint4*>(p.x_user + i);
  }
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
  if (p.x_stage != nullptr) {  // every block's staged slice, before any block sends a row of it
    // (a grid-wide point: count the dispatch blocks through the rows_done counter of the invalid id E)
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(&p.rows_done[E], 1u);
      while (atomicAdd(&p.rows_done[E], 0u) < static_cast<uint32_t>(p.dispatch_blocks)) __nanosleep(256);
      __threadfence();
    }
    __syncthreads();
  }
  if (db == 0) write_layout(p);
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
  for (int32_t i = db * warps + warp; i < valid && st == Status::kOk; i += p.dispatch_blocks * warps) {
    int32_t idx = i + rot;
    if (idx >= valid) idx -= valid;
    const int x = p.keys_sorted[idx];
    const int32_t flat = p.vals_sorted[idx];
    const int t = flat / c.topk, q = x / c.el, j = x % c.el;
    const int32_t pos = base[x] + (idx - seg[x]);
    st = put<Group::kWarp>(comm, p.recv_x + static_cast<size_t>(pos) * row_bytes, p.x + t * row_bytes, row_bytes, q);
    if (lane == 0) {
      if (st == Status::kOk) st = put<Group::kThread>(comm, p.recv_src + pos, p.vals_sorted + idx, sizeof(int32_t), q);
      // the last row of expert x from this rank: tell x's rank (release after every warp's rows)
      if (atomicAdd(&p.rows_done[x], 1u) + 1 == static_cast<uint32_t>(p.local_counts[x])) {
        __threadfence_system();
        const Status s2 = signal(comm, &p.arrive[j * world + rank], e, SignalOp::kSet, q);
        if (st == Status::kOk) st = s2;
      }
    }
    st = static_cast<Status>(__shfl_sync(0xffffffffu, static_cast<int>(st), 0));
  }
  __syncthreads();
  // Every row addressed to this rank has landed: the GEMM (unfused: launched next) may read them all, and the
  // row sources are copied out before ready[r] = e lets the next epoch's senders overwrite them.
  if (threadIdx.x == 0) {
    for (int j = 0; j < c.el && st == Status::kOk; ++j) {
      for (int s = 0; s < world && st == Status::kOk; ++s) {
        if (p.counts_all[s * E + rank * c.el + j] == 0) continue;
        st = wait_until(comm, &p.arrive[j * world + s], Cmp::kGe, e, s);
      }
    }
  }
  if (!block_ok(st)) return;
  const int32_t received = p.expert_offset[c.el];
  for (int32_t r = db * blockDim.x + threadIdx.x; r < received; r += p.dispatch_blocks * blockDim.x)
    p.row_source[r] = p.recv_src[r];
}

template <class Element>
__global__ void __launch_bounds__(Gg<Element>::Kernel::MaxThreadsPerBlock, 1)
    moe_dispatch_kernel(const __grid_constant__ DispatchParams<Element> p) {
  extern __shared__ __align__(128) char smem[];
  using namespace tandem::device;
  MoeControl* ctl = p.c.ctl;
  const uint64_t e = impl::ld_relaxed_gpu(&ctl->epoch) + 1;
  const bool gemm_block = p.gemm_role && static_cast<int>(blockIdx.y) >= p.dispatch_rows_y;
  if (gemm_block) {
    Status st = Status::kOk;
    if (threadIdx.x == 0) {  // shapes and pointers of this epoch (written by dispatch block 0)
      uint64_t start = 0;
      while (impl::ld_acquire_gpu(&ctl->shapes_ready) < e) {
        if (impl::aborted(p.c.comm)) {
          st = Status::kAborted;
          break;
        }
        const uint64_t now = impl::globaltimer_ns();
        if (start == 0) start = now;
        if (p.c.comm.timeout_ns != 0 && now - start > p.c.comm.timeout_ns) {
          impl::report_error(p.c.comm, Status::kTimeout, DeviceOp::kWaitUntil, p.c.comm.rank, e,
                             impl::ld_relaxed_gpu(&ctl->shapes_ready), now - start);
          st = Status::kTimeout;
          break;
        }
        __nanosleep(1000);
      }
    }
    if (block_ok(st)) {
      typename Gg<Element>::Kernel op;
      op(p.gemm, smem);
    }
  } else {
    const int db = static_cast<int>(blockIdx.y) * 2 + static_cast<int>(blockIdx.x);
    dispatch_role(p, db, e, reinterpret_cast<int32_t*>(smem));
  }
  finish_block(reinterpret_cast<tp::detail::Control*>(nullptr) == nullptr ? nullptr : nullptr, 0, 0, [] {});
}

}  // namespace

}  // namespace tandem::kernels::moe
