"""Diagnostic: where does the TP ops' fixed cost at small shapes go -- host (Python, launches) or device?

bench tp (2026-12-04) had every tandem mode 0.15-0.3 ms above naive at M 256 / M 1024 / Llama M2048 while the GEMM
and the collective alone summed to less. bench times one call between two CUDA events, so host time spent
between them (Python, agreement lookups, launches) counts when the GPU runs ahead of the host. Per op, mode and
shape, every rank at once:

* host_us: wall time of enqueuing one call (perf_counter around 50 calls, no sync inside, divided);
* eager_ms: CUDA events around one call (what bench tp reports);
* eager_inner_ms: CUDA events around 20 back-to-back calls, divided (host and device overlap);
* graph_ms: the same call captured in a CUDA graph, events around one replay (no host work at all);
* naive_ms / naive_graph_ms: cuBLAS then the torch peer-view collective, eager and captured.

If graph_ms is far below eager_ms, the gap is host time, and what to cut is on the host (or users capture
graphs); if not, it is on the device (synchronization between ranks, launch gaps).

    python -m tandem.launch -n 4 -- python tools/diag/tp_overhead.py [--out DIR] [--shapes MxNxK,...]
Writes tp_overhead_r{rank}.json into --out; rank 0 prints its table.
"""

import argparse
import os

import torch

from tandem import ops  # noqa: F401  (registers the ops)
from tandem.bench import common
from tandem.bench.tp import _torch_collective, gemm_alone_operands, rank_problem
from tandem.ops import tp
from tandem.transport import Communicator

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", default="1024x4096x8192,256x7168x8192,2048x7168x8192")
ap.add_argument("--modes", default="unfused,pipelined,auto")
ap.add_argument("--out", default=os.environ.get("OUT"))
args = ap.parse_args()

comm = Communicator(heap_bytes=4 << 30, timeout_s=60)
rank, world = comm.rank, comm.world_size


def graph_ms(fn):
    fn()  # workspaces exist before capture
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    comm.barrier()
    ms = common.time_launches(g.replay, warmup=3, reps=9) * 1e3
    del g
    return ms


rows = []
for shape in args.shapes.split(","):
    m, n, k = (int(x) for x in shape.split("x"))
    for op in ("ag_gemm", "gemm_rs", "gemm_ar"):
        if m % world:
            continue
        fn, a, b = rank_problem(op, m, n, k, world)
        for mode in args.modes.split(","):
            call = lambda: fn(comm, a, b, mode=mode)  # noqa: E731
            r = dict(op=op, m=m, n=n, k=k, world=world, mode=mode)
            try:
                comm.barrier()
                r["eager_ms"] = common.time_launches(call, warmup=3, reps=9) * 1e3
                comm.barrier()
                r["eager_inner_ms"] = common.time_launches(call, warmup=1, reps=5, inner=20) * 1e3
                r["host_us"] = common.host_launch_us(call, 50, before=comm.barrier)
                r["graph_ms"] = graph_ms(call)
            except Exception as e:  # noqa: BLE001 - report, go on
                r["error"] = str(e).splitlines()[0][:160]
            comm.check()
            rows.append(r)
        coll, keep = _torch_collective(comm, op, m, n, k)
        a_gemm, out = gemm_alone_operands(op, m, n, k, a)
        naive = lambda: (torch.matmul(a_gemm, b, out=out), coll())  # noqa: E731
        comm.barrier()
        r = dict(op=op, m=m, n=n, k=k, world=world, mode="naive",
                 eager_ms=common.time_launches(naive, warmup=3, reps=9) * 1e3,
                 host_us=common.host_launch_us(naive, 50, before=comm.barrier),
                 graph_ms=graph_ms(naive))
        rows.append(r)
        del keep
        tp.release_workspaces(comm)
common.write_json(args.out, f"tp_overhead_r{rank}.json", dict(meta=common.header("tools/diag/tp_overhead.py"),
                                                              rows=rows))
if rank == 0:
    print(f"# TP ops, host vs device, world {world} ({comm.sm_count} SMs a rank)")
    print("| op | M x N x K | mode | host us/call | eager ms | eager x20 ms/call | graph ms | error |")
    print("|---|---|---|---|---|---|---|---|")
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    for r in rows:
        print(f"| {r['op']} | {r['m']}x{r['n']}x{r['k']} | {r['mode']} | {f(r.get('host_us'))} | "
              f"{f(r.get('eager_ms'))} | {f(r.get('eager_inner_ms'))} | {f(r.get('graph_ms'))} | {r.get('error', '')} |")
comm.barrier()
comm.destroy()
