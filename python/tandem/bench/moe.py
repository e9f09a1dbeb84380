"""MoE dispatch + grouped GEMM benchmark, N ranks (MPS on one GPU): fused (one kernel) vs unfused (the dispatch
kernel, then the grouped GEMM) vs torch's per-expert matmul on the same received rows (the compute floor without
any communication), in the same run. CUDA events, warm-ups, median. NCCL refuses several ranks on one GPU, so the
torch.distributed all_to_all_single baseline waits for a multi-GPU machine.

    python -m tandem bench moe -n 2 [--out DIR] [--tokens 1024,4096,16384,65536] [--configs deepseek,small]
"""

from __future__ import annotations

import os

# name: (H, I, experts in all, top-k)
CONFIGS = {"deepseek": (7168, 2048, 256, 8), "small": (2048, 1024, 64, 6)}


def run(configs, tokens_list, reps, out_dir, command):
    import torch

    from .. import ops  # noqa: F401
    from ..ops import moe, tp
    from ..transport import Communicator
    from . import common

    # 64k tokens of the deepseek config: 15 GiB of received rows
    comm = Communicator(heap_bytes=40 << 30, timeout_s=60)
    world, rank = comm.world_size, comm.rank
    rows, data = [], []
    for name in configs:
        hidden, inter, experts, k = CONFIGS[name]
        if experts % world:
            continue
        epr = experts // world
        w = torch.randn(epr, hidden, inter, device="cuda", dtype=torch.bfloat16) / hidden ** 0.5
        for tokens in tokens_list:
            x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
            ids = torch.rand(tokens, experts, device="cuda").topk(k, dim=1).indices.to(torch.int32)
            y, layout = moe.moe_dispatch_gemm(comm, x, ids, w, max_tokens=tokens)
            torch.cuda.synchronize()
            lv = moe.layout_view(comm, layout, epr, tokens, k)
            offs = lv["expert_offset"].tolist()
            received = offs[-1]
            recv = torch.randn(max(received, 1), hidden, device="cuda", dtype=torch.bfloat16)

            def per_expert():
                for j in range(epr):
                    if offs[j + 1] > offs[j]:
                        torch.matmul(recv[offs[j]:offs[j + 1]], w[j])

            res = {}
            for op, fn in (("fused", lambda: moe.moe_dispatch_gemm(comm, x, ids, w, max_tokens=tokens, mode="fused")),
                           ("unfused", lambda: moe.moe_dispatch_gemm(comm, x, ids, w, max_tokens=tokens,
                                                                     mode="unfused")),
                           ("torch_experts", per_expert)):
                comm.barrier()
                res[op] = common.time_launches(fn, warmup=3, reps=reps)
            comm.check()
            flop = 2.0 * received * hidden * inter
            d = dict(config=name, hidden=hidden, inter=inter, experts=experts, k=k, tokens=tokens, world=world,
                     received=received, **{f"{key}_ms": v * 1e3 for key, v in res.items()})
            d["fused_tflops"] = flop / res["fused"] / 1e12
            d["unfused_over_fused"] = res["unfused"] / res["fused"]
            data.append(d)
            rows.append([name, f"{hidden}/{inter}/{experts}/{k}", str(tokens), str(received),
                         f"{res['fused'] * 1e3:.3f}", f"{res['unfused'] * 1e3:.3f}",
                         f"{res['torch_experts'] * 1e3:.3f}", f"{d['fused_tflops']:.0f}",
                         f"{d['unfused_over_fused']:.2f}", f"{res['torch_experts'] / res['fused']:.2f}"])
            if rank == 0:  # as it goes: a later shape that fails leaves the earlier rows on record
                print("| " + " | ".join(rows[-1]) + " |", flush=True)
            del y, layout, recv
            tp.release_workspaces(comm)
    if rank == 0:
        meta = common.header(command)
        table = common.markdown_table(
            ["config", "H/I/E/k", "tokens a rank", "rows received (rank 0)", "fused ms", "unfused ms",
             "torch per-expert matmul ms", "fused TFLOP/s (rank)", "unfused/fused", "torch experts/fused"], rows)
        print(f"# tandem MoE dispatch+GEMM, world {world} ({comm.sm_count} SMs a rank) — {meta['device']}, commit "
              f"{meta['commit']}, {meta['date']}")
        print(table)
        common.write_outputs(out_dir, f"moe_w{world}", meta, table, dict(rows=data))
        if out_dir:
            plot(rows, world, os.path.join(out_dir, f"moe_w{world}.png"))
    comm.destroy()


def plot(rows, world, path):
    from . import common

    common.grouped_bars(path, [f"{r[0]}\nT={r[2]}" for r in rows],
                        [(name, [float(r[col]) for r in rows])
                         for name, col in (("fused", 4), ("unfused", 5), ("torch per-expert (no comm)", 6))],
                        "ms per rank", f"tandem MoE dispatch + grouped GEMM, world {world} (MPS ranks on one GPU)")


def main(argv=None) -> int:
    from . import common

    ap = common.parser("moe", __doc__, reps=7)
    ap.add_argument("--tokens", default="1024,4096,16384,65536")
    ap.add_argument("--configs", default="small,deepseek")
    a = ap.parse_args(argv)
    rc = common.relaunch("moe", a.nprocs, argv)
    if rc is not None:
        return rc
    run(a.configs.split(","), [int(t) for t in a.tokens.split(",")], a.reps, a.out,
        common.command_line("moe", argv))
    return 0
