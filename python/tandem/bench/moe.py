"""MoE dispatch + grouped GEMM benchmark, N ranks (MPS on one GPU): fused (one kernel) vs unfused (the dispatch
kernel, then the grouped GEMM) vs torch's per-expert matmul on the same received rows (the compute floor without
any communication), in the same run. CUDA events, warm-ups, median. NCCL refuses several ranks on one GPU, so the
torch.distributed all_to_all_single baseline waits for a multi-GPU machine.

    python -m tandem bench moe -n 2 [--out DIR] [--tokens 1024,4096,16384] [--configs deepseek,small]

--layer times the whole layer instead (issue 26): tandem.ops.moe_ffn (dispatch + GEMM 1, SwiGLU, GEMM 2,
combine; mode "unfused", the chain) against a torch reference written as a user would without tandem: the
routed rows sorted by destination into a symmetric buffer, the counts read on the host, every rank pulling its
rows from the peers' buffers (peer views), per-expert matmuls (GEMM 1, SwiGLU, GEMM 2), the results written back
into the source ranks' buffers, and the weighted sum on the token's rank; tandem's stream barrier around each
exchange (moe_layer_w{N}.json: config, tokens, world, layer_unfused_ms, torch_reference_ms, max_abs_diff).
"""

from __future__ import annotations

import os

# name: (H, I, experts in all, top-k)
CONFIGS = {"deepseek": (7168, 2048, 256, 8), "small": (2048, 1024, 64, 6)}


def _communicator():
    """Both runners' communicator: 64k tokens of the deepseek config are 15 GiB of received rows (heap_bytes_for
    caps the ask at what the GPU holds for its ranks)."""
    from ..transport import Communicator
    from . import common

    return Communicator(heap_bytes=common.heap_bytes_for(40 << 30), timeout_s=60)


def _configs(names, world):
    """(name, hidden, inter, experts, k, experts per rank) of each named config whose experts split evenly over the
    world (the others are skipped)."""
    for name in names:
        hidden, inter, experts, k = CONFIGS[name]
        if experts % world == 0:
            yield name, hidden, inter, experts, k, experts // world


def run(configs, tokens_list, reps, out_dir, command):
    import torch

    from .. import ops  # noqa: F401
    from ..ops import moe, tp
    from . import common

    comm = _communicator()
    world, rank = comm.world_size, comm.rank
    rows, data = [], []
    for name, hidden, inter, experts, k, epr in _configs(configs, world):
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


class TorchMoeLayer:
    """The torch reference of the whole layer over peer views (module docstring, --layer), for one shape."""

    def __init__(self, comm, tokens, hidden, k, epr):
        import torch

        from .tp import stream_barrier

        self.comm, self.k, self.epr, self.hidden = comm, k, epr, hidden
        world = comm.world_size
        self.send = comm.empty((tokens * k, hidden), torch.bfloat16)       # this rank's rows, by destination
        self.back = comm.empty((tokens * k, hidden), torch.bfloat16)       # their results, written by the experts
        self.meta = comm.empty((tokens * k + world,), torch.int32)         # local expert id per row, then counts
        self.send_v = [comm.peer_view(self.send, q) for q in range(world)]
        self.back_v = [comm.peer_view(self.back, q) for q in range(world)]
        self.meta_v = [comm.peer_view(self.meta, q) for q in range(world)]
        self.barrier, self._keep = stream_barrier(comm)
        self.tk = tokens * k

    def __call__(self, x, ids, wts, w1, w2):
        import torch

        k, epr, world, rank = self.k, self.epr, self.comm.world_size, self.comm.rank
        inter = w2.shape[1]
        flat = ids.reshape(-1).long()
        dest = flat // epr
        order = torch.argsort(dest, stable=True)
        n = flat.numel()
        self.send[:n].copy_(x[order // k])
        self.meta[:n].copy_((flat % epr)[order].to(torch.int32))
        self.meta[self.tk:self.tk + world].copy_(torch.bincount(dest, minlength=world).to(torch.int32))
        self.barrier()  # every rank's rows and counts written
        counts = torch.stack([self.meta_v[r][self.tk:self.tk + world] for r in range(world)]).tolist()  # host sync
        rows, experts, where = [], [], []
        for r in range(world):
            start = sum(counts[r][:rank])
            cnt = counts[r][rank]
            rows.append(self.send_v[r][start:start + cnt])
            experts.append(self.meta_v[r][start:start + cnt].long())
            where.append((r, start, cnt))
        a = torch.cat(rows)
        e = torch.cat(experts)
        res = torch.empty_like(a)
        for j in range(epr):
            sel = (e == j).nonzero().view(-1)
            if sel.numel():
                y = a[sel] @ w1[j]
                res[sel] = (torch.nn.functional.silu(y[:, :inter].float()) * y[:, inter:].float()).to(a.dtype) @ w2[j]
        off = 0
        for r, start, cnt in where:  # each source's rows back into its buffer, where it sent them from
            self.back_v[r][start:start + cnt].copy_(res[off:off + cnt])
            off += cnt
        self.barrier()  # every result written back
        out_flat = torch.empty(n, self.hidden, dtype=torch.float32, device=x.device)
        out_flat[order] = self.back[:n].float()
        return (out_flat.view(-1, k, self.hidden) * wts.float().unsqueeze(-1)).sum(1).to(x.dtype)


def run_layer(configs, tokens_list, reps, out_dir, command):
    """--layer: moe_ffn (the unfused chain) against the torch reference, same run (module docstring)."""
    import torch

    from ..ops import moe_layer, tp
    from . import common

    comm = _communicator()
    world, rank = comm.world_size, comm.rank
    rows, data = [], []
    for name, hidden, inter, experts, k, epr in _configs(configs, world):
        g = torch.Generator(device="cuda").manual_seed(5 + rank)
        w1 = torch.randn(epr, hidden, 2 * inter, device="cuda", dtype=torch.bfloat16, generator=g) / hidden ** 0.5
        w2 = torch.randn(epr, inter, hidden, device="cuda", dtype=torch.bfloat16, generator=g) / inter ** 0.5
        for tokens in tokens_list:
            x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, generator=g)
            ids = torch.rand(tokens, experts, device="cuda", generator=g).topk(k, dim=1).indices.to(torch.int32)
            wts = torch.softmax(torch.randn(tokens, k, device="cuda", generator=g), dim=1)
            ref = TorchMoeLayer(comm, tokens, hidden, k, epr)
            res = {}
            mine = moe_layer.moe_ffn(comm, x, ids, wts, w1, w2, max_tokens=tokens, mode="unfused")
            theirs = ref(x, ids, wts, w1, w2)
            torch.cuda.synchronize()
            diff = float((mine.float() - theirs.float()).abs().max()) if tokens else 0.0
            for key, fn in (("layer_unfused", lambda: moe_layer.moe_ffn(comm, x, ids, wts, w1, w2, max_tokens=tokens,
                                                                          mode="unfused")),
                            ("torch_reference", lambda: ref(x, ids, wts, w1, w2))):
                comm.barrier()
                res[key] = common.time_launches(fn, warmup=2, reps=reps) * 1e3
            comm.check()
            d = dict(config=name, hidden=hidden, inter=inter, experts=experts, k=k, tokens=tokens, world=world,
                     layer_unfused_ms=res["layer_unfused"], torch_reference_ms=res["torch_reference"],
                     reference_over_unfused=res["torch_reference"] / res["layer_unfused"], max_abs_diff=diff)
            data.append(d)
            rows.append([name, f"{hidden}/{inter}/{experts}/{k}", str(tokens), f"{d['layer_unfused_ms']:.3f}",
                         f"{d['torch_reference_ms']:.3f}", f"{d['reference_over_unfused']:.2f}", f"{diff:.2e}"])
            if rank == 0:
                print("| " + " | ".join(rows[-1]) + " |", flush=True)
            ref = None  # its symmetric buffers go before the next shape's
            tp.release_workspaces(comm)
    if rank == 0:
        meta = common.header(command)
        table = common.markdown_table(["config", "H/I/E/k", "tokens a rank", "moe_ffn unfused ms",
                                       "torch reference ms", "reference/unfused", "max |diff|"], rows)
        print(f"# tandem MoE layer, world {world} ({comm.sm_count} SMs a rank) — {meta['device']}, commit "
              f"{meta['commit']}, {meta['date']}")
        print(table)
        common.write_outputs(out_dir, f"moe_layer_w{world}", meta, table, data)
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
    ap.add_argument("--tokens", default="1024,4096,16384",
                    help="tokens a rank (default %(default)s, issue 26's range; 65536 needs about 41 GiB a rank at the "
                         "deepseek config: two ranks do not fit one 80 GB GPU)")
    ap.add_argument("--configs", default="small,deepseek")
    ap.add_argument("--layer", action="store_true", help="the whole layer: moe_ffn against a torch reference")
    a = ap.parse_args(argv)
    rc = common.relaunch("moe", a.nprocs, argv)
    if rc is not None:
        return rc
    (run_layer if a.layer else run)(a.configs.split(","), [int(t) for t in a.tokens.split(",")], a.reps, a.out,
                                    common.command_line("moe", argv))
    return 0
