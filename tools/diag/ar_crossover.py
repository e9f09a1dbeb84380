"""Diagnostic: where one-shot GEMM+AR stops paying. Times gemm_ar fused one-shot, fused two-shot and unfused over
output sizes (M x N at fixed K per rank); rank 0 prints a table. kArOneShotMaxBytes (tp_gemm.h) and ops/tp.py's
AUTO_RULES["gemm_ar"] should follow it.

    python -m tandem.launch -n 2 -- python tools/diag/ar_crossover.py [--k 4096]
"""

import sys

import torch

from tandem.bench import common
from tandem.ops import tp
from tandem.transport import Communicator

k_local = int(sys.argv[sys.argv.index("--k") + 1]) if "--k" in sys.argv else 4096
comm = Communicator(heap_bytes=4 << 30, timeout_s=30)
world = comm.world_size
rows = []
for m, n in ((64, 4096), (256, 4096), (512, 4096), (1024, 4096), (2048, 4096), (4096, 4096), (8192, 8192)):
    m = max(m, 8 * world) // world * world  # a multiple of the world size
    a = torch.randn(m, k_local, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k_local, n, device="cuda", dtype=torch.bfloat16)
    t = {}
    for name, kw in (("one_shot", dict(mode="fused", algo="one_shot")), ("two_shot", dict(mode="fused", algo="two_shot")),
                     ("unfused", dict(mode="unfused", algo="two_shot"))):
        comm.barrier()
        t[name] = common.time_launches(lambda: tp.gemm_ar(comm, a, b, **kw), warmup=3, reps=7)
    rows.append((m, n, m * n * 2, t))
    tp.release_workspaces(comm)
comm.check()
if comm.rank == 0:
    print(f"world {world}, {comm.sm_count} SMs a rank, K per rank {k_local}")
    print("| M x N | output MiB | one-shot ms | two-shot ms | unfused ms | best |")
    print("|---|---|---|---|---|---|")
    for m, n, nbytes, t in rows:
        best = min(t, key=t.get)
        print(f"| {m}x{n} | {nbytes / 2**20:.2f} | {t['one_shot'] * 1e3:.3f} | {t['two_shot'] * 1e3:.3f} | "
              f"{t['unfused'] * 1e3:.3f} | {best} |")
comm.destroy()
