// AllGather+GEMM as one persistent kernel (sm90a): GEMM blocks on the CUTLASS core with the arrival-aware tile
// scheduler (this rank's chunk first, then chunks as they land), copy blocks beside them moving this rank's A
// rows to every rank. tp_gemm.h has the contract, tp_common.cuh the epoch protocol.
//
// Per launch (epoch e), on rank r with W ranks and C copy blocks (block b owns byte slice b of the chunk):
//   start    block (0,0) tells every peer that r's previous GEMM is done (ready[r] = e - 1 there)
//   copy     own rows -> own gathered buffer (skipped when A_local already is that slice: in place);
//            the last of the C blocks sets arrive[r] = e locally; then for each peer q = r+1, r+2, ...:
//            wait ready[q] >= e - 1 (q no longer reads its gathered A of e - 1), bulk-put the slice to q,
//            and the last of the C blocks for q sets arrive[r] = e on q (release after all C slices)
//   GEMM     tiles of chunk c start once arrive[c] >= e (scheduler), chunk r first; with tile claims
//            (the default; TANDEM_TP_CLAIM=0: the static stride) each cluster takes its next tile from a counter
//   end      the last block of the launch completes the epoch. It does not release the gathered buffer: this
//            rank's stream may still read it (ag_gemm(return_gathered=True): valid until this rank's next
//            launch), so only the next launch's start says ready[r] = e to the peers
//
// Across nodes (N nodes of L consecutive ranks, rank r = (n, l)) a chunk crosses the network once per node:
//   copy     own rows -> the rank (n', l) of every other node n' first (proxy; arrive[r] = e there), then this
//            node's ranks as above
//   forward  chunk c = (n', l) of another node, once arrive[c] >= e here: put slice b to this node's other ranks
//            (after their ready >= e - 1), and the last of the C blocks sets arrive[c] = e on each of them
//   end      the last block also waits until the proxy has delivered every command (quiet): the next launch
//            overwrites this rank's rows, which the proxy reads from the heap
// Without the GEMM role (the unfused path) the copy blocks run alone and finally wait for every chunk, so the
// GEMM launched after them on the stream reads a complete gathered A.
#include <cuda_runtime_api.h>

#include <cstdlib>

#include "../gemm/sm90_config.hpp"
#include "tp_gemm_configs.hpp"
#include "tp_common.cuh"

namespace tandem::kernels::tp {

namespace {

using namespace detail;

// The fused grids are kClusterX blocks wide because the GEMM core's clusters are: the comm roles take whole rows.
static_assert(cute::size<0>(gemm::detail::CooperativeConfig::ClusterShape{}) == kClusterX &&
                  cute::size<1>(gemm::detail::CooperativeConfig::ClusterShape{}) == 1,
              "the fused grid's width is the GEMM core's cluster");
// The GEMM role may run 256x128 tiles instead (TANDEM_TP_GEMM_TILE=256x128): tp_gemm_configs.hpp.

template <class GemmKernel>
struct AgParams {
  typename GemmKernel::Params gemm;
  tandem::DeviceComm comm;
  const char* a_local;
  char* gathered;
  Control* ctl;
  size_t chunk_bytes;
  int copy_rows_y;   // blocks with blockIdx.y below this copy; the GEMM's follow (when gemm_role)
  int comm_blocks;
  bool gemm_role;
  int ranks_per_node;  // L; world / L nodes
  runtime::Timeline timeline;  // diagnostic (TANDEM_TP_TRACE=1). Copy blocks: 0 start, 1 own rows copied, 1+i
                               // destination i sent; GEMM blocks: 0 start, 1 done; every block 46 at the end
  gemm::TileClaims* claims;    // the GEMM's tile claims (null: the static persistent stride)
  int late_cluster;            // TANDEM_TP_LATE (tests): GEMM clusters from this row start late_us late
  uint32_t late_us;
};

template <class P>
__device__ void ag_copy_role(const P& p, int cb, uint64_t e, char* smem) {
  using namespace tandem::device;
  const DeviceComm& comm = p.comm;
  const int rank = comm.rank, world = comm.world;
  Control* ctl = p.ctl;
  char* mine = p.gathered + static_cast<size_t>(rank) * p.chunk_bytes;
  size_t lo, hi;
  split16(p.chunk_bytes, p.comm_blocks, cb, &lo, &hi);
  void* stage = smem;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kStageBytes);
  Status st = Status::kOk;
  if (p.a_local != mine && hi > lo) st = put_bulk_block(comm, mine + lo, p.a_local + lo, hi - lo, rank, stage,
                                                        kStageBytes, bars);
  __syncthreads();
  p.timeline.stamp(1);
  if (threadIdx.x == 0 && last_of(&ctl->local_count[rank], p.comm_blocks)) {
    const Status s = signal(comm, &ctl->arrive[rank], e, SignalOp::kSet, rank);
    if (st == Status::kOk) st = s;
  }
  const Topology t = Topology::of(rank, world, p.ranks_per_node);
  // Destinations: the same local index on every other node (proxy), then this node's ranks l+1, l+2, ...
  for (int i = 1; i <= t.N + t.L - 2 && block_ok(st); ++i) {
    // This node's ranks in the order their GEMMs consume chunk r: rank q's scheduler takes chunks q, q+1, ...,
    // so r-1 needs r's rows first, then r-2, ... (sending to r+1 first made every rank's second chunk arrive
    // last at world >= 3).
    const int q = i < t.N ? t.rank_of(t.node_at(i), t.local) : t.rank_of(t.node, t.local_at(-(i - t.N + 1)));
    if (threadIdx.x == 0) st = wait_until_backoff(comm, &ctl->ready[q], Cmp::kGe, e - 1, kRolePollNs, q);
    if (!block_ok(st)) break;
    // Source: this rank's slice of its own gathered buffer (in the heap, which the proxy path needs).
    if (hi > lo) st = put_bulk_block(comm, mine + lo, mine + lo, hi - lo, q, stage, kStageBytes, bars);
    __syncthreads();
    if (1 + i < 40) p.timeline.stamp(1 + i);  // (slots 40 and up are the end's)
    if (threadIdx.x == 0 && last_of(&ctl->local_count[q], p.comm_blocks)) {
      const Status s = signal(comm, &ctl->arrive[rank], e, SignalOp::kSet, q);
      if (st == Status::kOk) st = s;
    }
  }
  // Republish the chunks of the other nodes that came to this rank (their local index is mine) to this node.
  for (int d = 1; d < t.N && t.L > 1 && block_ok(st); ++d) {
    const int c = t.rank_of(t.node_at(-d), t.local);
    if (threadIdx.x == 0) st = wait_until(comm, &ctl->arrive[c], Cmp::kGe, e, c);
    if (!block_ok(st)) break;
    char* rows = p.gathered + static_cast<size_t>(c) * p.chunk_bytes;
    for (int dl = 1; dl < t.L && block_ok(st); ++dl) {
      const int q = t.rank_of(t.node, t.local_at(dl));
      if (threadIdx.x == 0) st = wait_until(comm, &ctl->ready[q], Cmp::kGe, e - 1, q);
      if (!block_ok(st)) break;
      if (hi > lo) st = put_bulk_block(comm, rows + lo, rows + lo, hi - lo, q, stage, kStageBytes, bars);
    }
    __syncthreads();
    if (threadIdx.x == 0 && last_of(&ctl->forward_count[c], p.comm_blocks)) {
      for (int dl = 1; dl < t.L; ++dl) {
        const Status s = signal(comm, &ctl->arrive[c], e, SignalOp::kSet, t.rank_of(t.node, t.local_at(dl)));
        if (st == Status::kOk) st = s;
      }
    }
  }
}

template <class GemmKernel>
__global__ void __launch_bounds__(GemmKernel::MaxThreadsPerBlock, 1)
    ag_gemm_kernel(const __grid_constant__ AgParams<GemmKernel> p) {
  extern __shared__ __align__(128) char smem[];
  using namespace tandem::device;
  Control* ctl = p.ctl;
  const uint64_t e = current_epoch(ctl);
  const DeviceComm& comm = p.comm;
  p.timeline.stamp(0);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    for (int q = 0; q < comm.world; ++q)
      if (q != comm.rank) (void)signal(comm, &ctl->ready[comm.rank], e - 1, SignalOp::kSet, q);
  }
  dispatch_roles(
      p.copy_rows_y * static_cast<int>(gridDim.x), p.gemm_role, [&](int cb) { ag_copy_role(p, cb, e, smem); },
      [&] {
        if (p.late_us != 0 && static_cast<int>(blockIdx.y) - p.copy_rows_y >= p.late_cluster)
          runtime::hold_block_us(p.late_us);
        GemmKernel op;
        op(p.gemm, smem);
        p.timeline.stamp(1);
      });
  p.timeline.stamp(46);
  finish_block(ctl, static_cast<uint64_t>(gridDim.x) * gridDim.y, e, [&] {
    // The proxy reads this rank's rows from the heap: they may be overwritten once every command is delivered.
    if (p.ranks_per_node < comm.world) (void)quiet(comm);
    if (!p.gemm_role) {
      // Without the GEMM role the GEMM launched next on the stream reads the gathered A: the last block waits
      // for every chunk (only the last: a block that waits must not hold an SM a copy block still needs). The
      // next launch's start says ready[r] = e.
      Status st = Status::kOk;
      for (int c = 0; c < comm.world && st == Status::kOk; ++c)
        st = wait_until_backoff(comm, &ctl->arrive[c], Cmp::kGe, e, kRolePollNs, c);
      return;
    }
    // No release here (ready[r] = e on the peers): the gathered A stays this rank's until its next launch,
    // whose start releases it. (Releasing it here let a peer's next launch overwrite rows that this rank's
    // stream still read through the gathered view: training's backward reads it after the forward.)
    if (p.claims != nullptr) gemm::tile_claims_reset(p.claims, 1);
  });
}

// The scheduler's sleep between polls of a chunk flag. TANDEM_TP_POLL_NS overrides the default (a diagnostic
// knob: tools/diag/ag_scaling.py sweeps it).
uint32_t poll_sleep_ns() {
  if (const char* v = std::getenv("TANDEM_TP_POLL_NS")) return static_cast<uint32_t>(std::strtoul(v, nullptr, 10));
  return kDefaultPollSleepNs;
}

template <class Element, bool kClaims = false, class Config = gemm::detail::CooperativeConfig>
Status run_typed(const AgGemmArgs& a, cudaStream_t stream, bool gemm_role, std::string* why) {
  using G = gemm::detail::Sm90Gemm<Element, std::conditional_t<kClaims, gemm::ArrivalClaimsSchedulerTag,
                                                                gemm::ArrivalSchedulerTag>, Config>;
  using Kernel = typename G::Kernel;
  constexpr int kGemmCluster = static_cast<int>(decltype(cute::size<0>(typename Config::ClusterShape{}))::value);
  constexpr int kTileM = static_cast<int>(decltype(cute::size<0>(typename Config::TileShape{}))::value);
  static_assert(kGemmCluster == kClusterX || kGemmCluster == 1, "GEMM clusters of kClusterX or one CTA");
  const int world = a.comm.world, rank = a.comm.rank;
  const SmPlan plan = a.plan.comm_blocks > 0 ? a.plan : default_plan(a.plan.sm_count);
  char* ws = static_cast<char*>(a.workspace);
  char* gathered = ws + gathered_offset(a);

  AgParams<Kernel> p{};
  p.comm = a.comm;
  p.a_local = static_cast<const char*>(a.a_local);
  p.gathered = gathered;
  p.ctl = reinterpret_cast<Control*>(ws);
  p.chunk_bytes = static_cast<size_t>(a.m_local) * a.k * sizeof(Element);
  p.comm_blocks = plan.comm_blocks;
  p.gemm_role = gemm_role;
  p.ranks_per_node = Topology::of(rank, world, a.ranks_per_node).L;
  p.timeline.stamps = timeline_for_launch(stream);
  p.claims = kClaims ? reinterpret_cast<gemm::TileClaims*>(ws + kControlBytes) : nullptr;
  const FusedKnobs knobs = FusedKnobs::from_env();
  p.late_cluster = knobs.late_cluster;
  p.late_us = gemm_role ? knobs.late_us : 0u;
  dim3 grid;
  if (gemm_role) {
    gemm::GemmArgs g;
    g.m = a.m_local * world;
    g.n = a.n;
    g.k = a.k;
    g.dtype = a.dtype;
    g.a = gathered;
    g.lda = a.k;
    g.b = a.b;
    g.ldb = a.ldb;
    g.d = a.c;
    g.ldd = a.ldc;
    g.sm_count = plan.sm_count - plan.comm_blocks;
    auto args = G::arguments(g);
    args.scheduler.raster_order = decltype(args.scheduler.raster_order)::AlongN;
    args.scheduler.max_swizzle_size = knobs.swizzle;
    gemm::ArrivalSchedule& s = args.scheduler.arrival;
    s.comm = a.comm;
    s.flags = p.ctl->arrive;
    s.epoch_counter = &p.ctl->epoch;
    s.chunk_rows = a.m_local;
    s.chunks = world;
    s.first_chunk = rank;
    s.tile_m = kTileM;
    s.source_of_chunk0 = 0;
    s.poll_sleep_ns = poll_sleep_ns();
    s.claims = p.claims;
    s.claim_call = 0;
    if (Kernel::can_implement(args) == false) return fail(why, "CUTLASS cannot implement this AG+GEMM problem");
    if (Kernel::get_workspace_size(args) != 0) return fail(why, "unexpected CUTLASS workspace", Status::kInternal);
    // The scheduler's grid first (persistent, raster along N: (cluster M, clusters)), then pin it: (2, rows).
    p.gemm = Kernel::to_underlying_arguments(args, nullptr);
    dim3 gg = Kernel::get_grid_shape(p.gemm);
    if (gg.x != static_cast<unsigned>(kGemmCluster) || gg.z != 1)
      return fail(why, "unexpected GEMM grid shape", Status::kInternal);
    if constexpr (kGemmCluster == 1) gg = dim3(kClusterX, (gg.y + kClusterX - 1) / kClusterX, 1);  // CTAs in rows
    // claims keep one ring per cluster: gg.y clusters of two, or every CTA a cluster of its own
    const unsigned claim_clusters = kGemmCluster == 1 ? gg.x * gg.y : gg.y;
    if (kClaims && claim_clusters > static_cast<unsigned>(gemm::kClaimClusters))
      return fail(why, "too many GEMM clusters for the tile claims", Status::kInternal);
    args.scheduler.arrival.gemm_grid_x = static_cast<int32_t>(gg.x);
    args.scheduler.arrival.gemm_grid_y = static_cast<int32_t>(gg.y);
    args.scheduler.arrival.gemm_block_y0 = plan.comm_blocks / kClusterX;
    p.gemm = Kernel::to_underlying_arguments(args, nullptr);
    grid = dim3(kClusterX, gg.y + plan.comm_blocks / kClusterX, 1);
  } else {
    // The all-gather runs alone: up to kMaxCollectiveBlocks SMs of the rank copy (bench roles, H200, world 4:
    // 808 GB/s a rank on 16 SMs, 798 on 32; a grid of every SM of an MPS rank hung beside the other ranks' GEMMs
    // in bench tp, 16384x8192x4096, world 4).
    const int all = plan.sm_count & ~1;
    p.comm_blocks = all < 2 ? 2 : (all > kMaxCollectiveBlocks ? kMaxCollectiveBlocks : all);
    grid = dim3(kClusterX, p.comm_blocks / kClusterX, 1);
  }
  p.copy_rows_y = p.comm_blocks / kClusterX;
  // Copy blocks stage through shared memory; GEMM blocks need the CUTLASS kernel's (larger) storage.
  const int copy_smem = kStageBytes + 64;
  const int smem_launch = gemm_role && Kernel::SharedStorageSize > copy_smem ? Kernel::SharedStorageSize : copy_smem;
  const cudaError_t err = launch_clustered(ag_gemm_kernel<Kernel>, grid, Kernel::MaxThreadsPerBlock, smem_launch,
                                           stream, p, gemm_role ? kGemmCluster : kClusterX);
  if (err != cudaSuccess) return fail(why, std::string("launch failed: ") + cudaGetErrorString(err), Status::kCudaError);
  return Status::kOk;
}

}  // namespace

SmPlan default_plan(int sm_count) {
  SmPlan p;
  p.sm_count = sm_count;
  int c = sm_count / 16;
  c = c < 2 ? 2 : c;
  p.comm_blocks = c & ~1;
  return p;
}

size_t gathered_offset(const AgGemmArgs&) { return kControlBytes + kClaimBytes; }

template <class Tag, class Config = gemm::detail::CooperativeConfig>
cudaError_t preload_ag_kernels_with() {
  cudaFuncAttributes attr{};
  const cudaError_t a = cudaFuncGetAttributes(
      &attr, ag_gemm_kernel<typename gemm::detail::Sm90Gemm<cutlass::bfloat16_t, Tag, Config>::Kernel>);
  const cudaError_t b = cudaFuncGetAttributes(
      &attr, ag_gemm_kernel<typename gemm::detail::Sm90Gemm<cutlass::half_t, Tag, Config>::Kernel>);
  return a != cudaSuccess ? a : b;
}

cudaError_t preload_ag_kernels() {
  // Every variant, whatever TANDEM_TP_CLAIM / TANDEM_TP_GEMM_TILE say now: they are read at every launch, and the
  // Python side preloads once a process, so a knob changed later must not make a launch load its kernel while a
  // peer waits (docs/reliability.md).
  const cudaError_t e[] = {preload_ag_kernels_with<gemm::ArrivalClaimsSchedulerTag>(),
                           preload_ag_kernels_with<gemm::ArrivalClaimsSchedulerTag, Tile256x128Config>(),
                           preload_ag_kernels_with<gemm::ArrivalSchedulerTag>()};
  for (cudaError_t x : e)
    if (x != cudaSuccess) return x;
  return cudaSuccess;
}

size_t workspace_size(const AgGemmArgs& a) {
  const size_t esize = 2;
  return kControlBytes + kClaimBytes + static_cast<size_t>(a.comm.world) * a.m_local * a.k * esize;
}

static Status check_ag(const AgGemmArgs& a, bool fused, std::string* why) {
  const int world = a.comm.world;
  if (Status s = check_world(a.comm, why); s != Status::kOk) return s;
  if (a.m_local <= 0 || a.n <= 0 || a.k <= 0) return fail(why, "M_local, N and K must be positive");
  if (fused && a.m_local % 8) return fail(why, "M_local must be a multiple of 8 for the fused kernel (TMA row alignment of the chunks)");
  if (a.k % 8 || a.n % 8 || a.ldb % 8 || a.ldc % 8) return fail(why, "K, N and leading dimensions must be multiples of 8");
  if (a.ldb < a.n || a.ldc < a.n) return fail(why, "leading dimensions must be at least N");
  const SmPlan plan = a.plan.comm_blocks > 0 ? a.plan : default_plan(a.plan.sm_count);
  if (a.ranks_per_node < 0 || a.ranks_per_node > world || (a.ranks_per_node > 0 && world % a.ranks_per_node))
    return fail(why, "ranks_per_node must divide the world size");
  if (Topology::of(a.comm.rank, world, a.ranks_per_node).N > 1 && !tandem::device::has_proxy(a.comm))
    return fail(why, "ranks on other nodes need the communicator's proxy path");
  return check_common(a.comm, a.dtype, {a.a_local, a.b, a.c}, "A_local, B, C", a.workspace, workspace_size(a), plan,
                      why);
}

Status can_implement(const AgGemmArgs& a, std::string* why) { return check_ag(a, true, why); }

Status run(const AgGemmArgs& a, cudaStream_t stream, std::string* why) {
  if (const Status s = check_ag(a, true, why); s != Status::kOk) return s;
  // Tile claims (default; TANDEM_TP_CLAIM=0 the static stride), on one node and across nodes alike: a claimed
  // tile still waits for its chunk's arrival flag, which the proxy sets for chunks from other nodes
  const bool claims = tile_claims_enabled();
  g_last_fused_claims = claims;
  // 256x128 tiles (TANDEM_TP_GEMM_TILE=256x128), with tile claims only
  const bool tile256 = claims && FusedKnobs::from_env().gemm_tile_m == 256;
  g_last_fused_gemm_tile_m = tile256 ? 256 : 128;
  if (tile256)
    return a.dtype == DType::kFP16 ? run_typed<cutlass::half_t, true, Tile256x128Config>(a, stream, true, why)
                                   : run_typed<cutlass::bfloat16_t, true, Tile256x128Config>(a, stream, true, why);
  if (a.dtype == DType::kFP16)
    return claims ? run_typed<cutlass::half_t, true>(a, stream, true, why)
                  : run_typed<cutlass::half_t>(a, stream, true, why);
  return claims ? run_typed<cutlass::bfloat16_t, true>(a, stream, true, why)
                : run_typed<cutlass::bfloat16_t>(a, stream, true, why);
}

Status run_all_gather(const AgGemmArgs& a, cudaStream_t stream, std::string* why) {
  if (const Status s = check_ag(a, false, why); s != Status::kOk) return s;
  if (a.dtype == DType::kFP16) return run_typed<cutlass::half_t>(a, stream, false, why);
  return run_typed<cutlass::bfloat16_t>(a, stream, false, why);
}

}  // namespace tandem::kernels::tp
