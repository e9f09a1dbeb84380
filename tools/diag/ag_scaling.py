"""Diagnostic: where does the fused AG+GEMM fall behind the unfused path? Times fused and unfused AG+GEMM over
M_local, the number of copy blocks and the GEMM scheduler's sleep between chunk-flag polls
(TANDEM_TP_POLL_NS, read by the C++ host code at every launch); rank 0 prints a table.

    python -m tandem.launch -n 2 -- python tools/diag/ag_scaling.py [--quick]
"""

import os
import sys

import torch

from tandem.bench import common
from tandem.ops import tp
from tandem.transport import Communicator

comm = Communicator(heap_bytes=4 << 30, timeout_s=30)
rows = []
quick = "--quick" in sys.argv
shapes = [(4096, 4096, 8192)] if quick else [(1024, 4096, 4096), (4096, 4096, 4096), (4096, 4096, 8192)]
for m_local, n, k in shapes:
    a = torch.randn(m_local, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    for blocks in (4, 8, 16):
        for sleep_ns in (0, 256, 2000):
            os.environ["TANDEM_TP_POLL_NS"] = str(sleep_ns)
            comm.barrier()
            tf = common.time_launches(lambda: tp.ag_gemm(comm, a, b, mode="fused", comm_blocks=blocks), warmup=2, reps=5)
            comm.barrier()
            tu = common.time_launches(lambda: tp.ag_gemm(comm, a, b, mode="unfused", comm_blocks=blocks), warmup=2, reps=5)
            rows.append((m_local, n, k, blocks, sleep_ns, tf * 1e3, tu * 1e3))
    tp.release_workspaces(comm)
os.environ.pop("TANDEM_TP_POLL_NS", None)
comm.check()
if comm.rank == 0:
    print(f"world {comm.world_size}, {comm.sm_count} SMs a rank")
    print("| M_local x N x K | copy blocks | poll sleep ns | fused ms | unfused ms | unfused/fused |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]}x{r[1]}x{r[2]} | {r[3]} | {r[4]} | {r[5]:.3f} | {r[6]:.3f} | {r[6] / r[5]:.2f} |")
comm.destroy()
