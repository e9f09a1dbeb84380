// MoE combine (sm90a), device side: every rank sends each row of z back to the (token, slot) it came from, and
// the destination sums a token's k rows with their weights.
#pragma once

#include "moe_common.cuh"

namespace tandem::kernels::moe {

namespace {

constexpr int kCombineThreads = 512;
// Rows a warp claims at a time from the launch's send counter: small enough that the resident warps share the last
// rows evenly, large enough that the claims (one atomic per chunk) cost nothing beside the rows' puts.
constexpr int32_t kCombineClaimRows = 8;

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
  uint32_t* rows_sent;    // [world], rows sent per source (send_claim follows them in the workspace)
  uint32_t* send_claim;   // the next unclaimed row of z (zeroed before the launch, with rows_sent)
  int blocks;
  int esize;
  int late_block;         // TANDEM_MOE_COMBINE_LATE (tests): blocks from this index start late_us late
  uint32_t late_us;
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

// Residency: the sends are claimed, not shared out. A block sends rows claimed from p.send_claim until none are
// left, then waits for every rank's rows of this rank's tokens (done[q]). If each block sent a fixed share, every
// block of every rank would have to be running before any could pass that wait: a block without an SM (MPS ranks
// share the GPU, and nothing promises co-residency) would hold up the resident ones until the timeout. With claims
// the resident blocks send every row; a block that starts late finds none left, sees done[] set, and does its share
// of the weighted sums, which wait for nothing (docs/moe.md, "Residency").
template <class Element>
__global__ void __launch_bounds__(kCombineThreads, 1) moe_combine_kernel(const __grid_constant__ CombineParams p) {
  using namespace tandem::device;
  if (p.late_us != 0 && static_cast<int>(blockIdx.x) >= p.late_block) runtime::hold_block_us(p.late_us);
  __shared__ int32_t expected[kMaxWorld];
  const Common& c = p.c;
  const DeviceComm& comm = c.comm;
  const int world = comm.world, rank = comm.rank;
  MoeControl* ctl = c.ctl;
  const uint64_t e = runtime::current_epoch(ctl);
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
    for (int q = 0; q < world && st == Status::kOk; ++q) st = wait_until_backoff(comm, &ctl->ready[q], Cmp::kGe, e - 1, c.wait_sleep_ns, q);
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
    const int lane = threadIdx.x % 32;
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
    // chunks of kCombineClaimRows rows, claimed by the warp's lane 0 (a warp's claims ascend: so do its rows)
    for (;;) {
      st = static_cast<Status>(__shfl_sync(0xffffffffu, static_cast<int>(st), 0));  // one status a warp
      if (st != Status::kOk) break;  // (a warp that failed claims no more)
      int32_t r0 = 0;
      if (lane == 0) r0 = static_cast<int32_t>(atomicAdd(p.send_claim, static_cast<uint32_t>(kCombineClaimRows)));
      r0 = __shfl_sync(0xffffffffu, r0, 0);
      if (r0 >= received) break;
      const int32_t r1 = min(received, r0 + kCombineClaimRows);
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
    }
    flush();
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // every rank's rows of this rank's tokens have landed
    for (int q = 0; q < world && st == Status::kOk; ++q) st = wait_until_backoff(comm, &ctl->done[q], Cmp::kGe, e, c.wait_sleep_ns, q);
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

}  // namespace

}  // namespace tandem::kernels::moe
