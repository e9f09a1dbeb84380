// Host-side check of what the ticket reduction (kernels/include/tandem/kernels/gemm/ticket_scheduler.hpp) assumes of
// the GEMM core's accumulators (CuTe layouts are host-callable, so this runs without a GPU). For the TiledMma of the
// core's 128x256 cooperative configuration, bf16 and fp16:
//   * the 256 MMA threads' partition_C of the tile's identity tensor covers every (row, column) of the 128x256 tile
//     exactly once (the last arriver stores each sum once, and nothing of the tile is left out);
//   * values 2i and 2i+1 of a thread are columns n and n+1 of one row, n even (the fixup stores them as one
//     4-byte pair);
//   * a thread holds 128 values: 16 vectors of 8 elements, the slot layout [vector][thread] of 64 KiB a tile.
// tests/cpu/test_ticket_layout.py compiles and runs it. Exit status 0 and "ok" on success.
#include <cstdio>
#include <vector>

#include "../../kernels/src/gemm/sm90_config.hpp"

template <class Element>
int check(const char* name) {
  using namespace cute;
  using TiledMma = typename tandem::kernels::gemm::detail::Sm90Gemm<
      Element, tandem::kernels::gemm::ArrivalClaimsSchedulerTag>::Mainloop::TiledMma;
  constexpr int kM = 128, kN = 256, kThreads = int(size(TiledMma{}));
  if (kThreads != 256) {
    std::printf("%s: %d MMA threads, the fixup assumes 256\n", name, kThreads);
    return 1;
  }
  std::vector<int> seen(kM * kN, 0);
  int bad = 0;
  const auto id = make_identity_tensor(make_shape(Int<kM>{}, Int<kN>{}));
  for (int t = 0; t < kThreads; ++t) {
    auto thr = TiledMma{}.get_thread_slice(t);
    auto c = thr.partition_C(id);
    if (int(size(c)) != 128) {
      std::printf("%s: thread %d holds %d values, the slot layout assumes 128\n", name, t, int(size(c)));
      return 1;
    }
    for (int i = 0; i < int(size(c)); ++i) {
      const int m = get<0>(c(i)), n = get<1>(c(i));
      if (m < 0 || m >= kM || n < 0 || n >= kN) {
        if (bad++ < 5) std::printf("%s: thread %d value %d at (%d, %d): outside the tile\n", name, t, i, m, n);
        continue;
      }
      ++seen[m * kN + n];
      if (i % 2 == 1) {
        const int pm = get<0>(c(i - 1)), pn = get<1>(c(i - 1));
        if (pm != m || pn + 1 != n || pn % 2 != 0) {
          if (bad++ < 5)
            std::printf("%s: thread %d values %d, %d at (%d, %d), (%d, %d): not a pair of adjacent columns\n", name, t,
                        i - 1, i, pm, pn, m, n);
        }
      }
    }
  }
  for (int x = 0; x < kM * kN; ++x)
    if (seen[x] != 1 && bad++ < 5) std::printf("%s: element (%d, %d) held %d times\n", name, x / kN, x % kN, seen[x]);
  if (bad == 0) std::printf("%s: 256 threads x 128 values cover the 128x256 tile once, in column pairs\n", name);
  return bad != 0;
}

int main() {
  int bad = check<cutlass::bfloat16_t>("bf16") + check<cutlass::half_t>("fp16");
  if (bad) return 1;
  std::printf("ok\n");
  return 0;
}
