"""Diagnostic: where does the fused AG+GEMM fall behind the unfused path? Times fused and unfused AG+GEMM over
M_local (full-grid and partial-grid shapes) and over the number of copy blocks, rank 0 prints a table.

    python -m tandem.launch -n 2 -- python tools/diag/ag_scaling.py
"""

import torch

from tandem.bench import common
from tandem.ops import tp
from tandem.transport import Communicator

comm = Communicator(heap_bytes=4 << 30, timeout_s=30)
rows = []
n, k = 4096, 4096
for m_local in (256, 512, 1024, 2048, 4096):
    for blocks in (2, 8):
        a = torch.randn(m_local, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        comm.barrier()
        tf = common.time_launches(lambda: tp.ag_gemm(comm, a, b, mode="fused", comm_blocks=blocks), warmup=2, reps=5)
        comm.barrier()
        tu = common.time_launches(lambda: tp.ag_gemm(comm, a, b, mode="unfused", comm_blocks=blocks), warmup=2, reps=5)
        rows.append((m_local, blocks, tf * 1e3, tu * 1e3))
        tp.release_workspaces(comm)
comm.check()
if comm.rank == 0:
    print(f"world {comm.world_size}, {comm.sm_count} SMs a rank, N={n} K={k}")
    print("| M_local | copy blocks | fused ms | unfused ms |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.3f} |")
comm.destroy()
