// Ring attention (sm90a), the consumers: two warpgroups, 64 Q rows each -- the mainloop (S = Q K^T, online
// softmax, O += P V with FlashAttention-3's overlap) and the cross-step merge of (O_i, lse_i) into the fp32
// accumulator.
#pragma once

#include "ring_common.cuh"
#include "ring_flow.cuh"

namespace tandem::kernels::attention {

namespace {

// The step's partial, merged into the running result: O_i = acc / l and lse_i = max * scale + log2(l) (log2
// units; -inf where nothing was seen), combined with (O_acc, lse_acc) of the earlier steps by their weights, stored
// as O_acc / lse_acc between steps and as O / LSE (natural log) at the last one. o_rc / cO_rc: this thread's O
// accumulator and its (row, col) coordinates; row_max / row_sum: its rows' online-softmax state.
template <class T, int kRows, class TensorO, class TensorC>
__device__ __forceinline__ void merge_step(const Params<T>& p, const WorkItem& w, int64_t row0, bool first, bool last,
                                           float scale, const float (&row_max)[kRows], const float (&row_sum)[kRows],
                                           TensorO& o_rc, const TensorC& cO_rc) {
  using Element = typename T::Element;
  const Problem& pr = p.pr;
  // This step's partial: O_i = acc / l, lse_i = max * scale + log2(l) (log2 units); -inf where nothing seen. The
  // 1 / l is folded into the merge weight below (one multiply an element, not two).
  float lse_step[kRows], inv_l[kRows];
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const float l = quad_sum(row_sum[r]);
    lse_step[r] = l > 0.f ? row_max[r] * scale + log2f(l) : -INFINITY;
    inv_l[r] = l > 0.f ? 1.f / l : 0.f;
  }
  // Merge with the running result and store (O_acc / lse_acc between steps; O / LSE at the last step). The
  // four threads holding a row all read its old lse before the one that writes it does (__syncwarp).
  float lse_old[kRows];
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = row0 + get<0>(cO_rc(r, 0));
    lse_old[r] = -INFINITY;
    // L2 reads (ld.cg): another SM may have written the accumulators (its L1 is not coherent with ours)
    if (!first && row < pr.seq)
      lse_old[r] = __ldcg(p.lse_acc + (static_cast<size_t>(w.b) * pr.heads_q + w.h) * pr.seq + row);
  }
  __syncwarp();
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = row0 + get<0>(cO_rc(r, 0));
    if (row >= pr.seq) continue;
    const size_t o_row = ((static_cast<size_t>(w.b) * pr.seq + row) * pr.heads_q + w.h) * T::kHeadDim;
    const size_t l_idx = (static_cast<size_t>(w.b) * pr.heads_q + w.h) * pr.seq + row;
    float w_old = 0.f, w_new = 1.f, lse_new = lse_step[r];
    if (!first) {
      const float mx = fmaxf(lse_old[r], lse_step[r]);
      if (mx == -INFINITY) {
        lse_new = -INFINITY, w_old = 0.f, w_new = 0.f;
      } else {
        lse_new = mx + log2f(exp2f(lse_old[r] - mx) + exp2f(lse_step[r] - mx));
        w_old = exp2f(lse_old[r] - lse_new);
        w_new = exp2f(lse_step[r] - lse_new);
      }
    }
    const bool writes_lse = get<1>(cO_rc(r, 0)) == 0;  // one of the four threads holding the row
    const float scale_new = w_new * inv_l[r];           // O_i's weight, applied to acc (O_i = acc / l)
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < size<1>(o_rc); c += 2) {  // column pairs: 8-byte fp32 / 4-byte 16-bit accesses
      const int col = get<1>(cO_rc(r, c));
      float v0 = o_rc(r, c) * scale_new, v1 = o_rc(r, c + 1) * scale_new;
      if (!first) {
        const float2 old = __ldcg(reinterpret_cast<const float2*>(p.o_acc + o_row + col));
        v0 += old.x * w_old;
        v1 += old.y * w_old;
      }
      if (last) {
        Element out[2] = {static_cast<Element>(v0), static_cast<Element>(v1)};
        *reinterpret_cast<uint32_t*>(p.o + o_row + col) = *reinterpret_cast<const uint32_t*>(out);
      } else {
        *reinterpret_cast<float2*>(p.o_acc + o_row + col) = make_float2(v0, v1);
      }
    }
    if (writes_lse) {
      if (last) p.lse[l_idx] = lse_new * 0.69314718055994531f;  // log2 -> natural log
      else p.lse_acc[l_idx] = lse_new;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Consumers: two warpgroups, 64 Q rows each.

template <class T>
__device__ void consume(const Params<T>& p, typename T::SharedStorage& ss, typename T::PipelineQ& pipe_q,
                        typename T::PipelineKV& pipe_k, typename T::PipelineKV& pipe_v,
                        typename T::PipelineWork& pipe_work, uint64_t epoch) {
  using Element = typename T::Element;
  using cutlass::arch::NamedBarrier;
  const Problem& pr = p.pr;
  const int tid = static_cast<int>(threadIdx.x) - 128;  // 0..255
  const int wg = tid / 128;                             // consumer warpgroup: rows [64 wg, 64 wg + 64) of a tile
  cutlass::PipelineState<kWorkStages> work_state;
  cutlass::PipelineState<kQStages> q_state;
  cutlass::PipelineState<kStages> k_state, v_state;
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename T::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename T::SmemLayoutVt{});
  typename T::MmaS mma_s;
  typename T::MmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_o = mma_o.get_thread_slice(tid);
  Tensor tSrQ = thr_s.partition_fragment_A(sQ);
  Tensor tSrK = thr_s.partition_fragment_B(sK);
  Tensor tOrV = thr_o.partition_fragment_B(sVt);
  // (row, col) of every accumulator element, for masks and the output
  Tensor cS = thr_s.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor cO = thr_o.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<T::kHeadDim>>{}));
  Tensor cS_rc = make_tensor(cS.data(), rowcol(cS.layout()));
  Tensor cO_rc = make_tensor(cO.data(), rowcol(cO.layout()));
  Tensor acc_o = partition_fragment_C(mma_o, Shape<Int<kBlockM>, Int<T::kHeadDim>>{});
  Tensor acc_s = partition_fragment_C(mma_s, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor o_rc = make_tensor(acc_o.data(), rowcol(acc_o.layout()));
  Tensor s_rc = make_tensor(acc_s.data(), rowcol(acc_s.layout()));
  // P in the input precision, the A operand of O += P V. It has registers of its own: P_{n-1} is in flight in
  // the PV GEMM while S_n is computed and softmaxed in acc_s.
  Tensor p_reg = make_tensor<Element>(acc_s.layout());
  Tensor tOrP = make_tensor(p_reg.data(), as_a_operand(p_reg.layout()));
  constexpr int kRows = decltype(size<0>(o_rc))::value;  // rows a thread holds (2)
  static_assert(kRows == decltype(size<0>(s_rc))::value, "S and O rows must match");
  const float scale = pr.scale_log2;

  // Ping-pong: warpgroup g issues its GEMMs after the other one has issued its own (scheduler barrier g), then
  // lets the other go. Warpgroup 1 lets warpgroup 0 go first. Both issue the same number of rounds per item
  // (one per key tile: they share the item), so the turns never drift apart.
  const auto scheduler_wait = [&] {
    if constexpr (kPingPong) NamedBarrier::sync(kConsumerThreads, kSchedulerBarrier + wg);
  };
  const auto scheduler_pass = [&] {
    if constexpr (kPingPong) NamedBarrier::arrive(kConsumerThreads, kSchedulerBarrier + (1 - wg));
  };
  if constexpr (kPingPong) {
    if (wg == 1) NamedBarrier::arrive(kConsumerThreads, kSchedulerBarrier + 0);
  }

  for (;;) {
    pipe_work.consumer_wait(work_state);
    const int2 job = ss.work[work_state.index()];
    pipe_work.consumer_release(work_state);
    ++work_state;
    const int step = job.x, t = job.y;
    if (step < 0) break;
    const int src = source_of(pr, step);
    const bool first = step == 0, last = step == pr.world - 1;
    const WorkItem w = work_item(pr, t);
    const int n_end = visible_tiles(pr, pr.rank, src, w.m);
    const int64_t row0 = static_cast<int64_t>(w.m) * kBlockM;
    float row_max[kRows], row_sum[kRows], correction[kRows];
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.f, correction[r] = 1.f;
    // -inf where key tile n hides the key from the row (past S_l, or causal and later): the visible keys of a
    // row are a prefix, so one count per row and one compare per element.
    const auto mask = [&](int n) {
      if (!tile_needs_mask(pr, pr.rank, src, w.m, n)) return;
      const int64_t col0 = static_cast<int64_t>(n) * kBlockN;
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size<0>(s_rc); ++r) {
        const int64_t keys = visible_keys(pr, pr.rank, src, row0 + get<0>(cS_rc(r, 0))) - col0;
        const int limit = static_cast<int>(cute::max(int64_t(0), cute::min(int64_t(kBlockN), keys)));
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(s_rc); ++c)
          if (get<1>(cS_rc(r, c)) >= limit) s_rc(r, c) = -INFINITY;
      }
    };
    // Online softmax of S (base 2): p = 2^(s scale - max scale); correction[r] rescales what was accumulated
    // before this tile (applied to O later, when O is not in flight).
    const auto softmax = [&] {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size<0>(s_rc); ++r) {
        float mx = row_max[r];
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(s_rc); ++c) mx = fmaxf(mx, s_rc(r, c));
        mx = quad_max(mx);
        // a row that sees nothing yet keeps max -inf: use 0 so the exponentials are 0, not NaN
        const float base = mx == -INFINITY ? 0.f : mx * scale;
        correction[r] = fast_exp2(row_max[r] == -INFINITY ? -INFINITY : row_max[r] * scale - base);
        row_max[r] = mx;
        float sum = 0.f;
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(s_rc); ++c) {
          const float e = fast_exp2(s_rc(r, c) * scale - base);
          s_rc(r, c) = e;
          sum += e;
        }
        row_sum[r] = row_sum[r] * correction[r] + sum;  // quad-partial; reduced once at the end
      }
    };
    const auto rescale_o = [&] {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size<0>(o_rc); ++r) {
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(o_rc); ++c) o_rc(r, c) *= correction[r];
      }
    };
    const auto convert_p = [&] {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(acc_s); ++i) p_reg(i) = static_cast<Element>(acc_s(i));
    };
    if (n_end > 0) {
      // FlashAttention-3's intra-warpgroup overlap: iteration n issues S_n = Q K_n^T and O += P_{n-1} V_{n-1}
      // back to back, softmaxes S_n while the PV GEMM runs, then rescales O (once the GEMM is done with it).
      pipe_q.consumer_wait(q_state);
      const int qs = q_state.index();
      pipe_k.consumer_wait(k_state);
      scheduler_wait();
      mma_issue(mma_s, tSrQ(_, _, _, qs), tSrK(_, _, _, k_state.index()), acc_s, true);
      scheduler_pass();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s);
      pipe_k.consumer_release(k_state);
      ++k_state;
      mask(0);
      softmax();
      convert_p();
      for (int n = 1; n < n_end; ++n) {
        pipe_k.consumer_wait(k_state);
        scheduler_wait();
        mma_issue(mma_s, tSrQ(_, _, _, qs), tSrK(_, _, _, k_state.index()), acc_s, true);
        if (n > 1) rescale_o();  // O holds tiles < n - 1: bring it to tile n - 1's max before adding P_{n-1} V
        pipe_v.consumer_wait(v_state);
        warpgroup_fence_operand(p_reg);
        mma_issue(mma_o, tOrP, tOrV(_, _, _, v_state.index()), acc_o, n == 1);
        scheduler_pass();
        warpgroup_wait<1>();  // S_n
        warpgroup_fence_operand(acc_s);
        pipe_k.consumer_release(k_state);
        ++k_state;
        mask(n);
        softmax();
        warpgroup_wait<0>();  // O += P_{n-1} V_{n-1}
        warpgroup_fence_operand(acc_o);
        warpgroup_fence_operand(p_reg);
        pipe_v.consumer_release(v_state);
        ++v_state;
        convert_p();
      }
      pipe_q.consumer_release(q_state);
      ++q_state;
      if (n_end > 1) rescale_o();
      pipe_v.consumer_wait(v_state);
      warpgroup_fence_operand(p_reg);
      mma_issue(mma_o, tOrP, tOrV(_, _, _, v_state.index()), acc_o, n_end == 1);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
      warpgroup_fence_operand(p_reg);
      pipe_v.consumer_release(v_state);
      ++v_state;
    } else {  // nothing of the source's block is visible to the tile
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(acc_o); ++i) acc_o(i) = 0.f;
    }
    if (!first) wait_for_previous_merge(p, t, step, epoch, tid);
    // An invisible block changes nothing before the last step; the last step writes O and LSE in any case.
    if (n_end > 0 || last) merge_step<T>(p, w, row0, first, last, scale, row_max, row_sum, o_rc, cO_rc);
    finish_item(p, t, step, epoch, tid);
  }
}

}  // namespace

}  // namespace tandem::kernels::attention
