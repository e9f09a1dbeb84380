// Host-side check of the ring-attention kernel's register and shared-memory layouts (CuTe layouts are plain
// host-callable functions, so this runs on a machine without a GPU). For every consumer thread it checks that
//   * as_a_operand: the S accumulator, re-viewed as the A operand of O += P V, holds in each register the
//     (row, key) element that the register-sourced wgmma expects there (CuTe's own A partition of the tile);
//   * rowcol: each row of the (rows, cols) view is one row of the tile, and the O accumulator's rows are the S
//     accumulator's rows (the softmax statistics of a row are applied to that row of O);
//   * exactly one of the threads holding a row has column 0 (it alone writes the row's LSE);
//   * SmemLayoutVt is SmemLayoutV transposed: Vt(d, n, s) and V(n, d, s) are the same shared-memory element;
//   * the causal/ragged work decisions, against the element predicate key_hidden and ring_attention.h's
//     global_row: the visible key tiles of a Q tile are exactly those with a visible element (a prefix), and a
//     tile the kernel computes unmasked has no hidden element.
// tests/cpu/test_ring_layouts.py compiles and runs it. Exit status 0 and "ok" on success.
#include "../../kernels/src/attention/ring_common.cuh"

#include <cstdio>
#include <vector>

namespace attn = tandem::kernels::attention;

template <class T>
int check(const char* name) {
  using namespace cute;
  int bad = 0;
  typename T::MmaS mma_s;
  typename T::MmaO mma_o;
  const auto idS = make_identity_tensor(Shape<Int<attn::kBlockM>, Int<attn::kBlockN>>{});
  const auto idO = make_identity_tensor(Shape<Int<attn::kBlockM>, Int<T::kHeadDim>>{});
  const auto idA = make_identity_tensor(Shape<Int<attn::kBlockM>, Int<attn::kBlockN>>{});  // O = P V: M x K
  std::vector<int> lse_writers(attn::kBlockM, 0);
  for (int t = 0; t < attn::kConsumerThreads; ++t) {
    auto thr_s = mma_s.get_thread_slice(t);
    auto thr_o = mma_o.get_thread_slice(t);
    Tensor cS = thr_s.partition_C(idS);
    Tensor cO = thr_o.partition_C(idO);
    Tensor cA = thr_o.partition_A(idA);                          // where the RS wgmma wants each A register
    Tensor cP = make_tensor(cS.data(), attn::as_a_operand(cS.layout()));  // what the kernel puts there
    if (size(cA) != size(cP)) {
      std::printf("%s: thread %d: A fragment has %d values, P has %d\n", name, t, int(size(cA)), int(size(cP)));
      return 1;
    }
    for (int i = 0; i < size(cA); ++i) {
      if (cA(i) != cP(i)) {
        if (bad++ < 5)
          std::printf("%s: thread %d register %d: A wants (%d, %d), P holds (%d, %d)\n", name, t, i,
                      int(get<0>(cA(i))), int(get<1>(cA(i))), int(get<0>(cP(i))), int(get<1>(cP(i))));
      }
    }
    Tensor sRC = make_tensor(cS.data(), attn::rowcol(cS.layout()));
    Tensor oRC = make_tensor(cO.data(), attn::rowcol(cO.layout()));
    if (size<0>(sRC) != size<0>(oRC)) {
      std::printf("%s: thread %d: S has %d rows, O %d\n", name, t, int(size<0>(sRC)), int(size<0>(oRC)));
      return 1;
    }
    for (int r = 0; r < size<0>(sRC); ++r) {
      const int row = get<0>(sRC(r, 0));
      for (int c = 0; c < size<1>(sRC); ++c) bad += get<0>(sRC(r, c)) != row;
      for (int c = 0; c < size<1>(oRC); ++c) bad += get<0>(oRC(r, c)) != row;
      for (int c = 0; c + 1 < size<1>(oRC); c += 2)  // the merge stores column pairs
        bad += get<1>(oRC(r, c + 1)) != get<1>(oRC(r, c)) + 1 || get<1>(oRC(r, c)) % 2 != 0;
      if (get<1>(oRC(r, 0)) == 0) ++lse_writers[row];
    }
  }
  for (int row = 0; row < attn::kBlockM; ++row)
    if (lse_writers[row] != 1) {
      if (bad++ < 5) std::printf("%s: row %d has %d LSE writers\n", name, row, lse_writers[row]);
    }
  // V transposed
  const auto sV = typename T::SmemLayoutV{};
  const auto sVt = typename T::SmemLayoutVt{};
  for (int s = 0; s < attn::kStages; ++s)
    for (int n = 0; n < attn::kBlockN; ++n)
      for (int d = 0; d < T::kHeadDim; ++d)
        if (sV(n, d, s) != sVt(d, n, s)) {
          if (bad++ < 5) std::printf("%s: V(%d, %d, %d) = %d but Vt = %d\n", name, n, d, s, int(sV(n, d, s)),
                                     int(sVt(d, n, s)));
        }
  std::printf("%s: %s (%d mismatches)\n", name, bad ? "FAILED" : "ok", bad);
  return bad != 0;
}

// Every (world, rank, step, Q tile, key tile) of a few shapes, element by element.
int check_masks() {
  int bad = 0;
  for (int world : {1, 2, 3, 4})
    for (int seq : {2, 64, 130, 200, 256, 1000})
      for (bool causal : {false, true}) {
        if (causal && seq % 2) continue;
        attn::Problem pr{};
        pr.seq = seq, pr.world = world, pr.causal = causal;
        pr.m_tiles = (seq + attn::kBlockM - 1) / attn::kBlockM;
        pr.n_tiles = (seq + attn::kBlockN - 1) / attn::kBlockN;
        attn::RingShape shape{};
        shape.seq_local = seq, shape.causal = causal;
        for (int rank = 0; rank < world; ++rank) {
          for (int64_t j = 0; j < seq; ++j)  // the kernel's positions are the contract's
            bad += attn::position(pr, rank, j) != attn::global_row(shape, world, rank, j);
          for (int step = 0; step < world; ++step) {
            const int src = (rank - step + world) % world;
            for (int m = 0; m < pr.m_tiles; ++m) {
              const int n_end = attn::visible_tiles(pr, rank, src, m);
              for (int n = 0; n < pr.n_tiles; ++n) {
                int visible = 0, hidden = 0;
                for (int64_t q = int64_t(m) * attn::kBlockM; q < std::min<int64_t>(seq, (m + 1) * attn::kBlockM); ++q)
                  for (int64_t k = int64_t(n) * attn::kBlockN; k < int64_t(n + 1) * attn::kBlockN; ++k) {
                    const bool h = attn::key_hidden(pr, rank, src, q, k);
                    const bool ref = k >= seq || (causal && attn::global_row(shape, world, src, k) >
                                                                attn::global_row(shape, world, rank, q));
                    bad += h != ref;
                    (h ? hidden : visible) += 1;
                  }
                const bool computed = n < n_end;
                if (computed != (visible > 0) || (computed && hidden > 0 && !attn::tile_needs_mask(pr, rank, src, m, n))) {
                  if (bad++ < 5)
                    std::printf("masks: world %d S_l %d causal %d rank %d step %d m %d n %d: n_end %d, %d visible, "
                                "%d hidden, needs_mask %d\n", world, seq, int(causal), rank, step, m, n, n_end,
                                visible, hidden, int(attn::tile_needs_mask(pr, rank, src, m, n)));
                }
              }
            }
          }
        }
      }
  std::printf("masks: %s (%d mismatches)\n", bad ? "FAILED" : "ok", bad);
  return bad != 0;
}

// The claim order of the work items: every (batch, head, Q tile) exactly once a step, each (batch, head)'s Q tiles
// in decreasing order (the longest causal items first), every (batch, head) pair claimed within its group's span,
// and items_of (the workspace's merge flags) counts them. Groups of 1, some, and all pairs; ragged last groups.
int check_work_items() {
  int bad = 0;
  for (int batch : {1, 2, 3})
    for (int heads : {1, 4, 6})
      for (int seq : {2, 128, 129, 1000})
        for (int group : {1, 4, 5, 100}) {
          attn::Problem pr{};
          pr.batch = batch, pr.heads_q = heads, pr.seq = seq;
          pr.m_tiles = (seq + attn::kBlockM - 1) / attn::kBlockM;
          pr.order_group = std::min(group, batch * heads);
          attn::RingShape shape{};
          shape.batch = batch, shape.heads_q = heads, shape.seq_local = seq;
          const int items = static_cast<int>(attn::items_of(shape));
          bad += items != batch * heads * pr.m_tiles;
          std::vector<int> seen(static_cast<size_t>(items), 0), last_m(static_cast<size_t>(batch) * heads, pr.m_tiles);
          for (int t = 0; t < items; ++t) {
            const attn::WorkItem w = attn::work_item(pr, t);
            const bool in_range = w.b >= 0 && w.b < batch && w.h >= 0 && w.h < heads && w.m >= 0 && w.m < pr.m_tiles;
            const int bh = in_range ? w.b * heads + w.h : 0;
            const int span = pr.order_group * pr.m_tiles;  // items of one group
            if (!in_range || w.m >= last_m[bh] || bh / pr.order_group != t / span) {
              if (bad++ < 5)
                std::printf("work: B %d H %d S_l %d group %d item %d -> (%d, %d, %d)\n", batch, heads, seq,
                            pr.order_group, t, w.b, w.h, w.m);
              continue;
            }
            last_m[bh] = w.m;
            seen[static_cast<size_t>(bh) * pr.m_tiles + w.m] += 1;
          }
          for (int c : seen) bad += c != 1;
        }
  std::printf("work items: %s (%d mismatches)\n", bad ? "FAILED" : "ok", bad);
  return bad != 0;
}

int main() {
  int fails = check_masks();
  fails += check_work_items();
  fails += check<attn::Traits<cutlass::bfloat16_t, 128>>("bf16 d128");
  fails += check<attn::Traits<cutlass::bfloat16_t, 64>>("bf16 d64");
  fails += check<attn::Traits<cutlass::half_t, 128>>("fp16 d128");
  fails += check<attn::Traits<cutlass::half_t, 64>>("fp16 d64");
  if (fails == 0) std::printf("ok\n");
  return fails != 0;
}
