// MoE dispatch + grouped GEMM as one persistent kernel, and the combine (sm90a). moe.h has the contract.
//
// Per dispatch launch (epoch e) on rank r, W ranks, E experts (E_l per rank), k slots:
//   prepare  (before the kernel, stream-ordered) count this rank's (token, slot) pairs per expert, and sort the
//            pairs by expert with a stable radix sort (CUB): each expert's pairs are then contiguous, in
//            (token, slot) order. Ids outside [0, E) sort last and are reported.
//   counts   every block of the launch (fused: the whole grid; alone: the dispatch grid) raises layout_claim to e;
//            the block that raised it (the elected block: whichever got there first, so it is running) waits
//            ready[q] >= e - 1 (q is done with its buffers of e - 1), puts this rank's count row to every rank
//            (counts_flag[r] = e there) and waits for all W count rows
//   layout   the elected block writes this rank's receive layout and the grouped GEMM's per-expert shapes and
//            pointers, then sets shapes_ready = e; every other block waits only for that (local), which also
//            orders the count rows and the peers' ready before its sends
//   send     the first comm_blocks blocks to take a join ticket (alone: all of them) send: their warps claim chunks
//            of 32 sorted pairs in order (starting with rank r+1's experts, to spread the load; experts complete one
//            after another) from a counter; each copies its token row to the destination row and the pair's flat
//            index to row_source; the warp that completes expert x's rows sets arrive[x_local][r] = e on x's rank
//            (only sources with rows are waited for). The ticket and the counter are zeroed by the host before
//            each launch. Blocks that get an SM late find the tickets and chunks taken.
//   GEMM     (fused) every block (both of a cluster, or neither: a failed wait) runs CUTLASS's grouped GEMM over the
//            whole grid, whose scheduler waits for a group's arrivals before handing out its tiles
//   end      every block waits for every arrival and copies its grid-stride share of row_source to the local
//            layout; the last block of the launch sets ready[r] = e on every rank and completes the epoch
// With dedup (DispatchArgs::dedup; the dispatch-alone launches only, the fused one sends as above):
//   prepare  also: a thread a token gives each of its distinct destination ranks q a unique index u
//            (atomicAdd(uniq_count[q])), and each sorted pair its row in q's token buffer, r T_max + u
//   counts   the elected block puts this rank's uniq_count row to every rank's uniq_all[r] before the count row's
//            put_signal (whose release covers both; across nodes, the proxy keeps a peer's commands in order)
//   send     first the unique rows: warps claim chunks of this rank's (token, destination) rows (destinations r+1,
//            r+2, ...) and put each token's row once into the destination's token buffer; the warp completing a
//            destination's rows sets tok_arrive[r] = e there. Then the pairs as above, with only their metadata:
//            row_source and recv_fan (the row's place in the token buffer), then arrive[] as above
//   end      also waits tok_arrive[s] for every source s with unique rows for it, then copies each received row r
//            from token-buffer row recv_fan[r] into its expert row (the GEMM kernel or the copy reads them next)
// The ranks must agree on dedup and on the launch kind (the Python ops key both): a fused launch beside a dedup
// launch would read another protocol's buffers.
// No block waits for a block of its grid that may not have an SM (MPS does not place a rank's grid at once:
// docs/fused-kernels.md, "Residency"); before 2026-12-07 the first comm_blocks blocks dispatched, a static share
// each, and the GEMM blocks waited for them (branch moe-claims, not run yet).
//
// Combine launch (epoch e of its own workspace): every rank sends each row of z to the (token, slot) it came
// from (after ready[s] >= e - 1: s finished reading its buffer; warps claim the rows in chunks from a counter, so
// the blocks that run send them all, whichever blocks have an SM), the warp completing source s's rows sets
// done[r] = e there; then every rank waits for every done[q] and reduces out[t] = sum_slot w[t, slot] * row in
// slot order (fp32, one rounding).
//
// Files: moe_common.cuh (the timeline's names, workspace offsets, shared state, release/finish, capacity check),
// moe_dispatch.cuh (layout, dispatch role, the fused and GEMM-alone kernels), moe_combine.cuh (the combine),
// moe_swiglu.cuh (the SwiGLU between the experts' GEMMs), this file (host side).
#include <mutex>
#include <vector>

// (in the order they had in one file)
#include "moe_common.cuh"
#include "moe_dispatch.cuh"
#include "moe_combine.cuh"
#include "moe_swiglu.cuh"

namespace tandem::kernels::moe {

namespace {  // (the names it uses from the runtime are brought in by moe_common.cuh)

// ---------------------------------------------------------------------------------------------------------------
// Host side.

// The dispatch timeline's device buffer (TANDEM_MOE_TRACE=1), one per device: made by that device's first traced
// launch and kept (a diagnostic, MoeTimeline::kWords words); trace_snapshot() reads the current device's.
std::mutex g_trace_mutex;
std::vector<uint64_t*> g_trace_buffers;  // host: by device ordinal (null: no traced launch there yet)

// The current device's buffer in *buf (null: none); `make`: allocate it if there is none.
cudaError_t trace_buffer(bool make, uint64_t** buf) {
  *buf = nullptr;
  int dev = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(g_trace_mutex);
  if (static_cast<size_t>(dev) >= g_trace_buffers.size()) g_trace_buffers.resize(static_cast<size_t>(dev) + 1, nullptr);
  uint64_t*& mine = g_trace_buffers[static_cast<size_t>(dev)];
  if (mine == nullptr && make) {
    // A launch under stream capture may be the first traced one: cudaMalloc is no stream operation, allowed in a
    // capture in relaxed mode (this thread's mode is restored after it).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, sizeof(uint64_t) * MoeTimeline::kWords);
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess) return e;
    mine = static_cast<uint64_t*>(p);
  }
  *buf = mine;
  return cudaSuccess;
}

int bits_for(int values) {  // radix-sort bits for keys in [0, values]
  int b = 1;
  while ((1 << b) <= values) ++b;
  return b;
}

Status check_shape(const MoeShape& s, const tandem::DeviceComm& comm, std::string* why) {
  if (Status st = runtime::check_world(comm, why); st != Status::kOk) return st;
  const int world = comm.world;
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

// The dispatch blocks when the caller leaves comm_blocks 0. Fused: an eighth of the SMs (the rest run the GEMM
// beside them). Alone (the unfused and dispatch-only launches: nothing runs beside the dispatch kernel): half of
// them, at most 32 -- each row is a warp's put of 16-byte vectors, latency-bound, so the rate grows with the warps
// (16 blocks cut the small config's unfused time at 4,096 tokens from 1.41 to 1.12 ms, docs/results.md), and half
// the share keeps every rank's grid resident beside the others' under MPS. TANDEM_MOE_DISPATCH_BLOCKS=<n> sets the
// alone default (a diagnostic: the issue-26 step timing compares them).
int alone_dispatch_blocks(int sm_count) {
  if (const char* v = std::getenv("TANDEM_MOE_DISPATCH_BLOCKS"); v != nullptr && std::atoi(v) > 0) {
    const int c = std::atoi(v);
    return (c > sm_count - 2 ? sm_count - 2 : c) & ~1;
  }
  const int c = sm_count / 2 < 32 ? sm_count / 2 : 32;
  return c & ~1;
}

// The GEMM-alone kernel's cluster rows (the unfused path; the fused kernel is always 2x1). CUTLASS's group scheduler
// rounds each expert's row tiles up to the cluster, so in 2x1 clusters an expert of at most 128 rows costs 256 rows
// of MMA and weight reads: half of every cluster has no rows. 1x1 clusters (grouped_gemm_sm90.hpp, raster along M)
// cost one 128-row tile there; with more rows an expert 2x1's multicast of B wins. The default follows the rows an
// expert expects under even routing, max_tokens x topk x world / experts (the same on every rank, known before
// launch): 1x1 at most kOneRowTileRows. Measured 2026-12-07 (H100, world 2, moe_ffn, docs/results.md): 1x1 GEMMs
// 10.5 against 13.6 ms at 64 rows an expert (DeepSeek config, 1,024 tokens a rank), 2x1 20.3 against 21.5-23.4 ms at
// 256. TANDEM_MOE_GEMM_CLUSTER=1 or =2 forces one. A local choice: the GEMM reads only this rank's received rows.
constexpr int64_t kOneRowTileRows = 128;
int64_t expected_rows_per_expert(const MoeShape& s, int world) {
  const int64_t experts = static_cast<int64_t>(s.experts_per_rank) * world;
  return (static_cast<int64_t>(s.max_tokens) * s.topk * world + experts - 1) / experts;
}
int gemm_alone_cluster_rows(const MoeShape& s, int world) {
  const char* v = std::getenv("TANDEM_MOE_GEMM_CLUSTER");
  if (v != nullptr && (v[0] == '1' || v[0] == '2') && v[1] == '\0') return v[0] - '0';
  return expected_rows_per_expert(s, world) <= kOneRowTileRows ? 1 : 2;
}
// (diagnostic, tests: the cluster rows of the last GEMM-alone launch of the unfused dispatch, and of the last
// GroupedGemmArgs launch; 0 before any)
int g_last_gemm_cluster_rows = 0;
int g_last_grouped_gemm_cluster_rows = 0;

SmPlan resolve(const SmPlan& plan, bool alone = false) {
  SmPlan p = plan;
  if (p.comm_blocks <= 0) {
    int c = alone ? alone_dispatch_blocks(p.sm_count) : p.sm_count / 8;
    p.comm_blocks = (c < 2 ? 2 : c) & ~1;
  }
  return p;
}

// How long the rendezvous waits (a peer's ready, counts, done flags) sleep between polls: spinning threads of one
// rank's blocks compete with the other ranks' kernels for issue slots and memory under MPS. TANDEM_MOE_WAIT_NS
// overrides (0: spin, as before 2026-12-06).
uint32_t rendezvous_sleep_ns() {
  if (const char* v = std::getenv("TANDEM_MOE_WAIT_NS")) return static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
  return kRendezvousSleepNs;
}

// What run_typed launches: the fused kernel; the dispatch kernel then the GEMM kernel; the dispatch kernel alone
// (its received rows copied out for the caller).
enum class Launch { kFused, kUnfused, kDispatchOnly };

template <class Element>
Status run_typed(const DispatchArgs& a, cudaStream_t stream, Launch how, std::string* why) {
  const bool fused = how == Launch::kFused, gemm = how != Launch::kDispatchOnly;
  using G = Gg<Element>;
  using Kernel = typename G::Kernel;
  const MoeShape& s = a.shape;
  const int world = a.comm.world, rank = a.comm.rank, el = s.experts_per_rank, E = experts_total(s, world);
  const SmPlan plan = resolve(a.plan, /*alone=*/how != Launch::kFused);
  const DispatchOffsets o = offsets_of(a);
  const LayoutIndex li = layout_index(s, world);
  char* ws = static_cast<char*>(a.workspace);
  DispatchParams<Element> p{};
  p.c.comm = a.comm;
  p.c.wait_sleep_ns = rendezvous_sleep_ns();
  p.c.ctl = reinterpret_cast<MoeControl*>(ws);
  p.c.tokens = s.tokens;
  p.c.hidden = s.hidden;
  p.c.inter = gemm ? s.inter : 0;  // dispatch only: the GEMM's arrays (written, never read) get empty shapes
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
  // the grid is kClusterX (2) blocks wide, the GEMM's clusters. The dispatch-alone launches (unfused, dispatch
  // only) are comm_blocks blocks (whole rows), all sending; in the fused launch the first comm_blocks blocks to
  // join send (whichever have an SM first) and every block computes.
  p.senders = plan.comm_blocks;
  // dedup: the dispatch-alone launches only (the fused kernel's GEMM reads the rows as they land, before any
  // fan-out could copy them)
  p.dedup = a.dedup != 0 && !fused;
  p.max_tokens = s.max_tokens;
  if (a.dedup != 0) {  // (the workspace has the regions whenever the args ask, whatever the launch)
    p.uniq_count = reinterpret_cast<int32_t*>(ws + o.uniq_count);
    p.uniq_token = reinterpret_cast<const int32_t*>(ws + o.uniq_token);
    p.fan_abs = reinterpret_cast<const int32_t*>(ws + o.fan_abs);
    p.uniq_all = reinterpret_cast<int32_t*>(ws + o.uniq_all);
    p.tok_arrive = reinterpret_cast<uint64_t*>(ws + o.tok_arrive);
    p.tok_rows_done = reinterpret_cast<uint32_t*>(ws + o.tok_rows_done);
    p.recv_fan = reinterpret_cast<int32_t*>(ws + o.recv_fan);
    p.tok_buf = ws + o.tok_buf;
  }
  runtime::late_blocks_from_env("TANDEM_MOE_DISPATCH_LATE", &p.late_block, &p.late_us);
  const int dispatch_rows = plan.comm_blocks / runtime::kClusterX;

  // Proxy peers read the token rows from the heap: copy them there first, stream-ordered (no grid-wide wait in
  // the kernel; see moe_stage_rows_kernel).
  if (p.x_stage != nullptr && s.tokens > 0 &&
      cudaMemcpyAsync(p.x_stage, a.x, static_cast<size_t>(s.tokens) * s.hidden * sizeof(Element),
                      cudaMemcpyDeviceToDevice, stream) != cudaSuccess)
    return fail(why, "staging x failed", Status::kCudaError);
  // prepare: counts and the sorted (token, slot) pairs
  const int n = s.tokens * s.topk;
  // (and the dispatch's join and chunk claims: MoeControl::claims)
  if (cudaMemsetAsync(p.local_counts, 0, sizeof(int32_t) * E, stream) != cudaSuccess ||
      cudaMemsetAsync(p.rows_done, 0, sizeof(uint32_t) * E, stream) != cudaSuccess ||
      cudaMemsetAsync(&p.c.ctl->claims, 0, sizeof(MoeControl::Claims), stream) != cudaSuccess)
    return fail(why, "cudaMemsetAsync failed", Status::kCudaError);
  if (p.dedup && (cudaMemsetAsync(p.uniq_count, 0, sizeof(int32_t) * world, stream) != cudaSuccess ||
                  cudaMemsetAsync(p.tok_rows_done, 0, sizeof(uint32_t) * world, stream) != cudaSuccess))
    return fail(why, "cudaMemsetAsync failed", Status::kCudaError);
  if (n > 0) {
    int32_t* keys = reinterpret_cast<int32_t*>(ws + o.keys);
    int32_t* vals = reinterpret_cast<int32_t*>(ws + o.vals);
    moe_prepare_kernel<<<(n + 255) / 256, 256, 0, stream>>>(a.comm, a.topk_ids, n, E, keys, vals, p.local_counts);
    size_t temp = o.cub_bytes;
    if (cub::DeviceRadixSort::SortPairs(ws + o.cub_temp, temp, keys, const_cast<int32_t*>(p.keys_sorted), vals,
                                        const_cast<int32_t*>(p.vals_sorted), n, 0, bits_for(E), stream) != cudaSuccess)
      return fail(why, "the routing sort failed", Status::kCudaError);
    if (p.dedup) {  // each token's distinct destinations, then each sorted pair's row at its destination
      int32_t* uidx = reinterpret_cast<int32_t*>(ws + o.uidx);
      moe_unique_kernel<<<(s.tokens + 255) / 256, 256, 0, stream>>>(a.topk_ids, s.tokens, s.topk, el, E,
                                                                    s.max_tokens, p.uniq_count,
                                                                    const_cast<int32_t*>(p.uniq_token), uidx);
      moe_fan_kernel<<<(n + 255) / 256, 256, 0, stream>>>(p.vals_sorted, uidx, n, rank, s.max_tokens,
                                                           const_cast<int32_t*>(p.fan_abs));
    }
  }
  const int grid_y = plan.sm_count / runtime::kClusterX;
  p.timeline = MoeTimeline{};
  if (const char* v = std::getenv("TANDEM_MOE_TRACE"); v != nullptr && v[0] == '1') {
    uint64_t* buf = nullptr;
    if (trace_buffer(/*make=*/true, &buf) != cudaSuccess ||
        cudaMemsetAsync(buf, 0, sizeof(uint64_t) * MoeTimeline::kWords, stream) != cudaSuccess)
      return fail(why, "the trace buffer is unavailable", Status::kCudaError);
    p.timeline.stamps = buf;
  }
  detail::ExpertArrivals arr;
  arr.timeline = p.timeline;
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
    // every block of the fused grid dispatches first, then computes (moe_dispatch_kernel): the GEMM's grid is all
    arr.gemm_block_y0 = 0;
    arr.gemm_grid_y = grid_y;
  }
  if (gemm) {
    // tensormap slots: every block of the grid
    auto args = G::arguments(el, p.arrays, arr, runtime::kClusterX * grid_y);
    if (Kernel::can_implement(args) == false) return fail(why, "CUTLASS cannot implement this grouped GEMM");
    if (Kernel::get_workspace_size(args) > o.cutlass_ws_bytes)
      return fail(why, "grouped GEMM workspace larger than reserved", Status::kInternal);
    p.gemm = Kernel::to_underlying_arguments(args, ws + o.cutlass_ws);
  }
  const int dispatch_smem = static_cast<int>(sizeof(int32_t) * (2 * E + 4));  // base, seg, two flags (dispatch_role)
  const auto launch = [&](auto kernel, dim3 grid, int smem, const auto& params) {
    const cudaError_t err = launch_clustered(kernel, grid, Kernel::MaxThreadsPerBlock, smem, stream, params);
    return err == cudaSuccess ? Status::kOk
                              : fail(why, std::string("launch failed: ") + cudaGetErrorString(err), Status::kCudaError);
  };
  if (fused) {
    p.gemm_role = true;
    const int smem = Kernel::SharedStorageSize > dispatch_smem ? static_cast<int>(Kernel::SharedStorageSize) : dispatch_smem;
    return launch(moe_dispatch_kernel<Element>, dim3(runtime::kClusterX, grid_y, 1), smem, p);
  }
  p.gemm_role = false;
  if (Status st = launch(moe_dispatch_kernel<Element>, dim3(runtime::kClusterX, dispatch_rows, 1), dispatch_smem, p);
      st != Status::kOk)
    return st;
  if (gemm && gemm_alone_cluster_rows(s, world) == 1) {
    // 1x1 clusters (grouped_gemm_sm90.hpp): the same grid's blocks in one row, raster along M; the arrays the
    // dispatch kernel fills are the default's (same types), no arrival waits (arr.flags is null: unfused)
    using G1 = Gg1<Element>;
    using Kernel1 = typename G1::Kernel;
    const int blocks = runtime::kClusterX * grid_y;
    auto args1 = G1::arguments(el, p.arrays, arr, blocks);
    if (Kernel1::can_implement(args1) == false) return fail(why, "CUTLASS cannot implement this grouped GEMM (1x1)");
    if (Kernel1::get_workspace_size(args1) > o.cutlass_ws_bytes)
      return fail(why, "grouped GEMM workspace larger than reserved", Status::kInternal);
    const typename Kernel1::Params params1 = Kernel1::to_underlying_arguments(args1, ws + o.cutlass_ws);
    const cudaError_t err = launch_clustered(moe_gemm_kernel<Element, G1>, dim3(blocks, 1, 1),
                                             Kernel1::MaxThreadsPerBlock, static_cast<int>(Kernel1::SharedStorageSize),
                                             stream, params1, /*cluster_x=*/1);
    if (err != cudaSuccess) return fail(why, std::string("launch failed: ") + cudaGetErrorString(err), Status::kCudaError);
    g_last_gemm_cluster_rows = 1;
  } else if (gemm) {
    if (Status st = launch(moe_gemm_kernel<Element>, dim3(runtime::kClusterX, grid_y, 1),
                           static_cast<int>(Kernel::SharedStorageSize), p.gemm);
        st != Status::kOk)
      return st;
    g_last_gemm_cluster_rows = 2;
  } else {
    // the received rows only (layout[0] of them, known on the device), not the whole receive capacity; the
    // dispatch kernel waited for every row addressed to this rank: the copy after it sees them all
    const int blocks = plan.sm_count < 32 ? plan.sm_count : 32;
    moe_stage_rows_kernel<<<blocks, 256, 0, stream>>>(a.layout, p.c.capacity, p.recv_x, static_cast<char*>(a.rows),
                                                      static_cast<size_t>(s.hidden) * sizeof(Element));
  }
  // after the GEMM (or the copy) has read the received rows: peers may send the next epoch's
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
  o.rows_sent = take(sizeof(uint32_t) * (a.comm.world + 1));  // rows sent per source, then the send claim
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

static bool dispatch_only(const DispatchArgs& a) { return a.rows != nullptr && a.w == nullptr; }

Status can_implement(const DispatchArgs& a, std::string* why) {
  if (Status st = check_shape(a.shape, a.comm, why); st != Status::kOk) return st;
  const bool gemm = !dispatch_only(a);
  if (gemm && (a.shape.inter <= 0 || a.shape.inter % 8)) return fail(why, "inter must be a positive multiple of 8");
  if ((a.x == nullptr && a.shape.tokens > 0) || (a.topk_ids == nullptr && a.shape.tokens > 0) ||
      (gemm && (a.w == nullptr || a.y == nullptr)) || a.layout == nullptr)
    return fail(why, "null pointer");
  const auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) != 0; };
  if (misaligned(a.x) || misaligned(a.w) || misaligned(a.y) || misaligned(a.rows))
    return fail(why, "x, w, y and rows must be 16-byte aligned");
  const SmPlan plan = resolve(a.plan);
  if (Status st = runtime::check_sm_plan(plan.sm_count, plan.comm_blocks, 4, why); st != Status::kOk) return st;
  // the runtime's common checks (world, dtype, the workspace: non-null, 256-byte aligned, in the heap); the
  // operands above: which may be null depends on the mode and the tokens
  return runtime::check_launch_common(a.comm, a.dtype, {}, "", a.workspace, workspace_size(a), 256, why);
}

namespace {
Status run_as(const DispatchArgs& a, cudaStream_t stream, Launch how, std::string* why) {
  if (Status st = can_implement(a, why); st != Status::kOk) return st;
  if ((how == Launch::kDispatchOnly) != dispatch_only(a))
    return fail(why, how == Launch::kDispatchOnly ? "the dispatch alone takes rows (out) and no w"
                                                  : "the GEMM modes take w and y (rows without w: the dispatch alone)");
  if (a.dtype == DType::kFP16) return run_typed<cutlass::half_t>(a, stream, how, why);
  return run_typed<cutlass::bfloat16_t>(a, stream, how, why);
}
}  // namespace

Status run(const DispatchArgs& a, cudaStream_t stream, std::string* why) {
  return run_as(a, stream, Launch::kFused, why);
}

Status run_unfused(const DispatchArgs& a, cudaStream_t stream, std::string* why) {
  return run_as(a, stream, Launch::kUnfused, why);
}

Status run_dispatch(const DispatchArgs& a, cudaStream_t stream, std::string* why) {
  return run_as(a, stream, Launch::kDispatchOnly, why);
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
  // the runtime's common checks (world, dtype, the workspace: non-null, 256-byte aligned, in the heap); the
  // operands above: which may be null depends on the mode and the tokens
  return runtime::check_launch_common(a.comm, a.dtype, {}, "", a.workspace, workspace_size(a), 256, why);
}

Status run(const CombineArgs& a, cudaStream_t stream, std::string* why) {
  if (Status st = can_implement(a, why); st != Status::kOk) return st;
  const CombineOffsets o = combine_offsets(a);
  char* ws = static_cast<char*>(a.workspace);
  CombineParams p{};
  p.c.comm = a.comm;
  p.c.wait_sleep_ns = rendezvous_sleep_ns();
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
  p.send_claim = p.rows_sent + a.comm.world;
  p.esize = 2;
  const int blocks = a.plan.sm_count < 32 ? a.plan.sm_count : 32;
  p.blocks = blocks;
  // tests: blocks from index B start US microseconds late (a block without an SM, as under MPS), "B:US"
  runtime::late_blocks_from_env("TANDEM_MOE_COMBINE_LATE", &p.late_block, &p.late_us);
  if (cudaMemsetAsync(p.rows_sent, 0, sizeof(uint32_t) * (a.comm.world + 1), stream) != cudaSuccess)
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
  out->assign(MoeTimeline::kWords, 0);
  uint64_t* buf = nullptr;
  if (const cudaError_t e = trace_buffer(/*make=*/false, &buf); e != cudaSuccess) return e;
  if (buf == nullptr) return cudaSuccess;  // no traced launch on this device yet: zeros
  return cudaMemcpy(out->data(), buf, sizeof(uint64_t) * out->size(), cudaMemcpyDeviceToHost);
}

Status can_implement(const SwigluArgs& a, std::string* why) {
  if (a.dtype != DType::kBF16 && a.dtype != DType::kFP16) return fail(why, "dtype must be bf16 or fp16");
  if (a.inter <= 0 || a.inter % 8) return fail(why, "inter must be a positive multiple of 8");
  if (a.capacity < 0) return fail(why, "capacity must not be negative");
  if (a.capacity > 0 && (a.y == nullptr || a.out == nullptr || a.received == nullptr)) return fail(why, "null pointer");
  const auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) != 0; };
  if (misaligned(a.y) || misaligned(a.out)) return fail(why, "y and out must be 16-byte aligned");
  if (reinterpret_cast<uintptr_t>(a.received) & 3u) return fail(why, "received must be 4-byte aligned");
  if (a.sm_count < 0) return fail(why, "sm_count must not be negative");
  return Status::kOk;
}

// `requested` SMs, or the current device's count when it is 0 or less (the launches' sm_count convention).
static Status sm_count_or_device(int requested, int* sms, std::string* why) {
  *sms = requested;
  if (requested > 0) return Status::kOk;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return fail(why, "cannot read the SM count", Status::kCudaError);
  return Status::kOk;
}

Status run(const SwigluArgs& a, cudaStream_t stream, std::string* why) {
  if (Status st = can_implement(a, why); st != Status::kOk) return st;
  if (a.capacity == 0) return Status::kOk;
  int sms = 0;
  if (Status st = sm_count_or_device(a.sm_count, &sms, why); st != Status::kOk) return st;
  // enough blocks for every vector of the capacity, at most 8 a SM (the received rows are often fewer: the
  // grid-stride loop ends early there)
  const int64_t vectors = a.capacity * (a.inter / 8);
  const int64_t want = (vectors + kSwigluThreads - 1) / kSwigluThreads;
  const int grid = static_cast<int>(want < int64_t(sms) * kSwigluBlocksPerSm ? want : int64_t(sms) * kSwigluBlocksPerSm);
  if (a.dtype == DType::kFP16)
    moe_swiglu_kernel<__half><<<grid, kSwigluThreads, 0, stream>>>(static_cast<const __half*>(a.y), a.received,
                                                                  a.capacity, a.inter, static_cast<__half*>(a.out));
  else
    moe_swiglu_kernel<__nv_bfloat16><<<grid, kSwigluThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(a.y), a.received, a.capacity, a.inter, static_cast<__nv_bfloat16*>(a.out));
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return fail(why, std::string("swiglu launch failed: ") + cudaGetErrorString(e), Status::kCudaError);
  return Status::kOk;
}

int last_gemm_cluster_rows() { return g_last_gemm_cluster_rows; }

int64_t dispatch_rows_sent(const void* workspace) {
  if (workspace == nullptr) return -1;
  uint32_t sent = 0;
  // The address only (the control block is in device memory; nothing is dereferenced here). cudaMemcpy runs on
  // the legacy default stream: the caller synchronizes its stream first (the tests do).
  const uint32_t* at = &static_cast<const MoeControl*>(workspace)->claims.uniq_sent;
  if (cudaMemcpy(&sent, at, sizeof(sent), cudaMemcpyDeviceToHost) != cudaSuccess) return -1;
  return sent;
}
int last_grouped_gemm_cluster_rows() { return g_last_grouped_gemm_cluster_rows; }

// ---- the grouped GEMM on rows in the dispatch layout, as its own launch (moe.h: GroupedGemmArgs) --------------

namespace {

struct GroupedOffsets {
  size_t shapes, ptr_a, ptr_b, ptr_d, stride_a, stride_b, stride_d, cutlass_ws, total;
};

GroupedOffsets grouped_offsets(int experts) {
  using G = Gg<cutlass::bfloat16_t>;  // (the arrays' sizes do not depend on the element type)
  GroupedOffsets o{};
  WorkspaceCarver w{0};
  const size_t e = static_cast<size_t>(experts);
  o.shapes = w.take(sizeof(typename G::Shape3) * e);
  o.ptr_a = w.take(sizeof(void*) * e);
  o.ptr_b = w.take(sizeof(void*) * e);
  o.ptr_d = w.take(sizeof(void*) * e);
  o.stride_a = w.take(sizeof(typename G::StrideA) * e);
  o.stride_b = w.take(sizeof(typename G::StrideB) * e);
  o.stride_d = w.take(sizeof(typename G::StrideD) * e);
  o.cutlass_ws = w.take(kCutlassWorkspaceBytes);
  o.total = w.at;
  return o;
}

// The CUTLASS arrays of each expert (as write_layout makes the dispatch GEMM's): one thread an expert.
template <class Element>
__global__ void moe_grouped_arrays_kernel(GroupedGemmArgs a, typename Gg<Element>::Arrays arr) {
  using G = Gg<Element>;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < a.experts; j += gridDim.x * blockDim.x) {
    const int32_t rows = a.expert_rows[j], off = a.expert_offset[j];
    arr.shapes[j] = typename G::Shape3{rows, a.n, a.k};
    arr.a[j] = static_cast<const Element*>(a.a) + static_cast<size_t>(off) * a.k;
    arr.b[j] = static_cast<const Element*>(a.w) + static_cast<size_t>(j) * a.k * a.n;
    arr.d[j] = static_cast<Element*>(a.d) + static_cast<size_t>(off) * a.n;
    arr.da[j] = cute::make_stride(int64_t(a.k), cute::Int<1>{}, cute::Int<0>{});
    arr.db[j] = cute::make_stride(cute::Int<1>{}, int64_t(a.n), cute::Int<0>{});
    arr.dd[j] = cute::make_stride(int64_t(a.n), cute::Int<1>{}, cute::Int<0>{});
  }
}

template <class Element, class GemmOf>
Status run_grouped_as(const GroupedGemmArgs& a, const typename Gg<Element>::Arrays& arr, char* cutlass_ws, int sms,
                      cudaStream_t stream, std::string* why) {
  using Kernel = typename GemmOf::Kernel;
  // (no arrival waits: the rows are in place, stream-ordered)
  auto args = GemmOf::arguments(a.experts, arr, detail::ExpertArrivals{}, sms);
  if (Kernel::can_implement(args) == false) return fail(why, "CUTLASS cannot implement this grouped GEMM");
  if (Kernel::get_workspace_size(args) > kCutlassWorkspaceBytes)
    return fail(why, "grouped GEMM workspace larger than reserved", Status::kInternal);
  const typename Kernel::Params params = Kernel::to_underlying_arguments(args, cutlass_ws);
  // the arrays (device memory; CUTLASS reads them in the kernel), after every host-side check
  moe_grouped_arrays_kernel<Element><<<(a.experts + 255) / 256, 256, 0, stream>>>(a, arr);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return fail(why, std::string("grouped GEMM arrays launch failed: ") + cudaGetErrorString(e), Status::kCudaError);
  // 2x1: the grid 2 blocks wide (the cluster), AlongN; 1x1: one row, AlongM (grouped_gemm_sm90.hpp)
  const dim3 grid = GemmOf::kClusterRows == 2 ? dim3(runtime::kClusterX, sms / runtime::kClusterX, 1)
                                              : dim3(sms, 1, 1);
  const cudaError_t err = launch_clustered(moe_gemm_kernel<Element, GemmOf>, grid, Kernel::MaxThreadsPerBlock,
                                           static_cast<int>(Kernel::SharedStorageSize), stream, params,
                                           /*cluster_x=*/GemmOf::kClusterRows);
  return err == cudaSuccess ? Status::kOk
                            : fail(why, std::string("grouped GEMM launch failed: ") + cudaGetErrorString(err),
                                   Status::kCudaError);
}

template <class Element>
Status run_grouped(const GroupedGemmArgs& a, int sms, cudaStream_t stream, std::string* why) {
  using G = Gg<Element>;
  const GroupedOffsets o = grouped_offsets(a.experts);
  char* ws = static_cast<char*>(a.workspace);
  typename G::Arrays arr;
  arr.shapes = reinterpret_cast<typename G::Shape3*>(ws + o.shapes);
  arr.a = reinterpret_cast<const Element**>(ws + o.ptr_a);
  arr.b = reinterpret_cast<const Element**>(ws + o.ptr_b);
  arr.d = reinterpret_cast<Element**>(ws + o.ptr_d);
  arr.da = reinterpret_cast<typename G::StrideA*>(ws + o.stride_a);
  arr.db = reinterpret_cast<typename G::StrideB*>(ws + o.stride_b);
  arr.dd = reinterpret_cast<typename G::StrideD*>(ws + o.stride_d);
  const Status st = a.cluster_rows == 1 ? run_grouped_as<Element, Gg1<Element>>(a, arr, ws + o.cutlass_ws, sms, stream, why)
                                        : run_grouped_as<Element, G>(a, arr, ws + o.cutlass_ws, sms, stream, why);
  if (st == Status::kOk) g_last_grouped_gemm_cluster_rows = a.cluster_rows == 1 ? 1 : 2;
  return st;
}

}  // namespace

size_t workspace_size(const GroupedGemmArgs& a) {
  return a.experts > 0 && a.experts <= kMaxGroupedExperts ? grouped_offsets(a.experts).total : 0;
}

Status can_implement(const GroupedGemmArgs& a, std::string* why) {
  if (a.dtype != DType::kBF16 && a.dtype != DType::kFP16) return fail(why, "dtype must be bf16 or fp16");
  if (a.experts < 1 || a.experts > kMaxGroupedExperts) return fail(why, "experts must be in [1, 4096]");
  if (a.n <= 0 || a.n % 8 || a.k <= 0 || a.k % 8) return fail(why, "N and K must be positive multiples of 8");
  if (a.a == nullptr || a.w == nullptr || a.d == nullptr || a.expert_rows == nullptr || a.expert_offset == nullptr ||
      a.workspace == nullptr)
    return fail(why, "null pointer");
  const auto misaligned = [](const void* p, uintptr_t to) { return (reinterpret_cast<uintptr_t>(p) % to) != 0; };
  if (misaligned(a.a, 16) || misaligned(a.w, 16) || misaligned(a.d, 16))
    return fail(why, "a, w and d must be 16-byte aligned");
  if (misaligned(a.expert_rows, 4) || misaligned(a.expert_offset, 4)) return fail(why, "the row arrays must be 4-byte aligned");
  if (misaligned(a.workspace, 128)) return fail(why, "the workspace must be 128-byte aligned");
  if (a.sm_count < 0 || a.sm_count % 2) return fail(why, "sm_count must be even and not negative");
  if (a.cluster_rows != 1 && a.cluster_rows != 2) return fail(why, "cluster_rows must be 1 or 2");
  return Status::kOk;
}

Status run(const GroupedGemmArgs& a, cudaStream_t stream, std::string* why) {
  if (Status st = can_implement(a, why); st != Status::kOk) return st;
  int sms = 0;
  if (Status st = sm_count_or_device(a.sm_count, &sms, why); st != Status::kOk) return st;
  if (a.sm_count <= 0) sms &= ~1;  // the device's count, made even (a given one was checked even)
  return a.dtype == DType::kFP16 ? run_grouped<cutlass::half_t>(a, sms, stream, why)
                                 : run_grouped<cutlass::bfloat16_t>(a, sms, stream, why);
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
      reinterpret_cast<const void*>(moe_gemm_kernel<cutlass::bfloat16_t, Gg1<cutlass::bfloat16_t>>),
      reinterpret_cast<const void*>(moe_gemm_kernel<cutlass::half_t, Gg1<cutlass::half_t>>),
      reinterpret_cast<const void*>(moe_unique_kernel),
      reinterpret_cast<const void*>(moe_fan_kernel),
      reinterpret_cast<const void*>(moe_grouped_arrays_kernel<cutlass::bfloat16_t>),
      reinterpret_cast<const void*>(moe_grouped_arrays_kernel<cutlass::half_t>),
      reinterpret_cast<const void*>(moe_combine_kernel<__nv_bfloat16>),
      reinterpret_cast<const void*>(moe_combine_kernel<__half>),
      reinterpret_cast<const void*>(moe_stage_rows_kernel),
      reinterpret_cast<const void*>(moe_swiglu_kernel<__nv_bfloat16>),
      reinterpret_cast<const void*>(moe_swiglu_kernel<__half>),
  };
  for (const void* f : fs)
    if (const cudaError_t e = cudaFuncGetAttributes(&attr, f); e != cudaSuccess) return e;
  return cudaSuccess;
}

}  // namespace tandem::kernels::moe
