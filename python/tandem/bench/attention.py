"""Ring attention benchmark, N ranks (MPS on one GPU), bf16, in the same run:

  world 1   tandem vs torch SDPA's cuDNN backend (the faster one on this GPU) and its flash backend on the same
            problem, forward and backward (rows per pass: fwd, bwd, fwd+bwd; backward timed alone, from a kept
            graph, and fwd+bwd as one training step's forward and backward together, 3.5 x the forward's FLOPs;
            tandem's backward is the unfused mode of tandem.ops.attention_backward, timed with its default block
            kernel and again with FlashAttention-2's), keys b, s, hq, hkv, d, causal, pass, tandem_tflops,
            cudnn_tflops, flash_tflops, tandem_fa2_blocks_tflops, bwd_block_kernels (backward FLOPs = 2.5 x
            forward's);
  world N   the global sequence of S rows sharded over the ranks (S / N rows a rank; zigzag when causal),
            tandem's one-kernel ring vs a torch ring in the same process: per step the K/V block goes to the next
            rank by a copy into its symmetric buffer (tandem Communicator peer views: NCCL refuses several ranks on
            one GPU) on a side stream, overlapped with flash attention on the block held
            (aten._scaled_dot_product_flash_attention, which returns the log-sum-exp), an fp32 log-sum-exp merge,
            then a device sync and a host barrier before the next step.

--seqs are global lengths S (every rank's share is S / N). TFLOP/s = 4 B Hq S^2 d (halved when causal) / N per
rank over its time; "max |o - baseline|" is rank 0's largest output difference (a sanity check). CUDA events,
warm-ups, median.

    python -m tandem bench attention -n 2 [--out DIR] [--seqs 8192,16384,32768] [--causal both|yes|no]
        [--batch 1] [--heads 16] [--heads-kv 16] [--head-dim 128] [--reps 10]
"""

from __future__ import annotations

import os


def _flash(q, k, v, causal, scale):
    """Flash attention of (B, H, S, d) views: (o (B, Hq, S_q, d), lse (B, Hq, S_q) fp32)."""
    import torch

    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    return out[0], out[1]


def _merge(out, lse, o_step, lse_step):
    """(out, lse) <- the softmax-weighted combination of themselves and one step's (o, lse), in place, fp32."""
    import torch

    new = torch.logaddexp(lse, lse_step)
    out.mul_(torch.exp(lse - new).unsqueeze(-1)).add_(o_step.float() * torch.exp(lse_step - new).unsqueeze(-1))
    lse.copy_(new)


class TorchRing:
    """Ring attention in torch over tandem's symmetric heap (module docstring): two K/V slots a rank, the next
    step's block copied into the successor's other slot while this step's attention runs."""

    def __init__(self, comm, kv_shape, dtype):
        import torch

        self.comm = comm
        self.slots = comm.zeros((2, 2) + tuple(kv_shape), dtype)  # slot, K/V, B, S_l, Hkv, d
        self.successor = comm.peer_view(self.slots, (comm.rank + 1) % comm.world_size)
        self.copy_stream = torch.cuda.Stream()

    def __call__(self, q, k, v, causal, scale):
        import torch

        world, rank = self.comm.world_size, self.comm.rank
        qt = q.transpose(1, 2)
        c = q.shape[1] // 2
        self.slots[0, 0].copy_(k)
        self.slots[0, 1].copy_(v)
        out = lse = None
        for step in range(world):
            held = step % 2
            if step + 1 < world:
                self.copy_stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.copy_stream):
                    self.successor[1 - held].copy_(self.slots[held])
            kt, vt = self.slots[held, 0].transpose(1, 2), self.slots[held, 1].transpose(1, 2)
            source = (rank - step) % world
            if step == 0:  # our own block: local order is global order in both layouts
                o_step, lse_step = _flash(qt, kt, vt, causal, scale)
                out, lse = o_step.float(), lse_step.clone()
            elif not causal:
                _merge(out, lse, *_flash(qt, kt, vt, False, scale))
            elif source < rank:  # zigzag: the block's first chunk precedes both of ours, its second follows both
                _merge(out, lse, *_flash(qt, kt[:, :, :c], vt[:, :, :c], False, scale))
            else:  # both of the block's chunks precede our second chunk and follow our first
                _merge(out[:, :, c:], lse[:, :, c:], *_flash(qt[:, :, c:], kt, vt, False, scale))
            # the block has landed in the successor and every read of the held slot is done before anyone reuses it
            torch.cuda.synchronize()
            self.comm.barrier()
        return out.to(q.dtype).transpose(1, 2), lse


def run_w1(comm, seqs, causals, batch, heads_q, heads_kv, head_dim, reps, out_dir, command):
    """World 1: tandem against SDPA's cuDNN and flash backends, forward and backward (module docstring)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..ops import attention, attention_backward, tp
    from . import common

    scale = head_dim ** -0.5
    gqa = dict(enable_gqa=True) if heads_kv != heads_q else {}
    rows, data = [], []
    for seq in seqs:
        for causal in causals:
            if causal and seq % 2:
                continue
            g = torch.Generator(device="cuda").manual_seed(1)
            q, k, v = (torch.randn(batch, seq, h, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
                       .requires_grad_(True) for h in (heads_q, heads_kv, heads_kv))
            do = torch.randn(batch, seq, heads_q, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)

            def sdpa():
                return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      is_causal=causal, scale=scale, **gqa).transpose(1, 2)

            def mine():
                return attention.ring_attention(comm, q, k, v, causal=causal)[0]

            def timed(name, fn):
                times[(name, "fwd")] = common.time_launches(lambda: fn(), warmup=3, reps=reps)
                o = fn()
                times[(name, "bwd")] = common.time_launches(
                    lambda o=o: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), warmup=3, reps=reps)
                # a training step's attention: the forward and its backward together (what issue 25 asks beside
                # the two passes alone)
                times[(name, "fwd+bwd")] = common.time_launches(
                    lambda: torch.autograd.grad(fn(), (q, k, v), do), warmup=3, reps=reps)
                return o, torch.autograd.grad(o, (q, k, v), do)

            times, results = {}, {}
            before = dict(attention_backward.block_kernel_counts)
            results["tandem"] = timed("tandem", mine)  # a tandem failure stops the bench
            ran = sorted(n for n, c in attention_backward.block_kernel_counts.items() if c > before[n])
            # the backward again with FlashAttention-2's block kernel (what the unfused mode used before cuDNN's)
            saved = os.environ.get("TANDEM_RING_BWD_BLOCK")
            os.environ["TANDEM_RING_BWD_BLOCK"] = "flash"
            try:
                o_fa2 = mine()
                times[("tandem_fa2", "bwd")] = common.time_launches(
                    lambda: torch.autograd.grad(o_fa2, (q, k, v), do, retain_graph=True), warmup=3, reps=reps)
            finally:
                os.environ.pop("TANDEM_RING_BWD_BLOCK")
                if saved is not None:
                    os.environ["TANDEM_RING_BWD_BLOCK"] = saved
            for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                try:
                    with sdpa_kernel(backend):
                        results[name] = timed(name, sdpa)
                except RuntimeError as e:  # a backend that refuses the shape is reported, not fatal
                    print(f"  {name} skipped at S={seq} causal={causal}: {str(e).splitlines()[0][:120]}")
            # a sanity check beside the times: tandem's output and gradients against the first SDPA backend that ran
            ref = results.get("cudnn") or results.get("flash")
            diffs = None
            if ref is not None:
                diffs = [float((a.float() - b.float()).abs().max())
                         for a, b in zip((results["tandem"][0],) + tuple(results["tandem"][1]), (ref[0],) + tuple(ref[1]))]
            comm.check()
            fwd_flop = 4.0 * batch * heads_q * seq * seq * head_dim / (2 if causal else 1)
            for pss, flop in (("fwd", fwd_flop), ("bwd", 2.5 * fwd_flop), ("fwd+bwd", 3.5 * fwd_flop)):
                tf = {n: (flop / times[(n, pss)] / 1e12 if (n, pss) in times else None)
                      for n in ("tandem", "tandem_fa2", "cudnn", "flash")}
                d = dict(b=batch, s=seq, hq=heads_q, hkv=heads_kv, d=head_dim, causal=causal, world=1, **{"pass": pss},
                         tandem_tflops=tf["tandem"], cudnn_tflops=tf["cudnn"], flash_tflops=tf["flash"],
                         tandem_fa2_blocks_tflops=tf["tandem_fa2"], bwd_block_kernels=ran if pss != "fwd" else None,
                         tandem_over_cudnn=(tf["tandem"] / tf["cudnn"]) if tf["tandem"] and tf["cudnn"] else None,
                         max_abs_diff=({"fwd": diffs[0], "bwd": max(diffs[1:])}.get(pss, max(diffs))) if diffs else None)
                data.append(d)
                fmt = lambda x: "-" if x is None else f"{x:.0f}"  # noqa: E731
                rows.append([str(seq), "yes" if causal else "no", f"{batch}/{heads_q}/{heads_kv}/{head_dim}", pss,
                             fmt(tf["tandem"]) + (f" ({'+'.join(ran)})" if pss != "fwd" else ""),
                             fmt(tf["tandem_fa2"]), fmt(tf["cudnn"]), fmt(tf["flash"]),
                             "-" if d["tandem_over_cudnn"] is None else f"{d['tandem_over_cudnn']:.2f}",
                             "-" if d["max_abs_diff"] is None else f"{d['max_abs_diff']:.2e}"])
                print("| " + " | ".join(rows[-1]) + " |", flush=True)
            tp.release_workspaces(comm)
    meta = common.header(command)
    table = common.markdown_table(["S", "causal", "B/Hq/Hkv/d", "pass", "tandem TFLOP/s (bwd: block kernels)",
                                   "tandem, FA2 blocks TFLOP/s", "SDPA cuDNN TFLOP/s",
                                   "SDPA flash TFLOP/s", "tandem/cuDNN", "max |tandem - SDPA| (o or dq/dk/dv)"],
                                  rows)
    print(f"# tandem attention, world 1 — {meta['device']}, commit {meta['commit']}, {meta['date']}")
    print(table)
    common.write_outputs(out_dir, "attention_w1", meta, table, data)


def run(seqs, causals, batch, heads_q, heads_kv, head_dim, reps, out_dir, command):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .. import ops  # noqa: F401
    from ..ops import attention, tp
    from ..transport import Communicator
    from . import common

    comm = Communicator(heap_bytes=8 << 30, timeout_s=60)
    world, rank = comm.world_size, comm.rank
    if world == 1:
        run_w1(comm, seqs, causals, batch, heads_q, heads_kv, head_dim, reps, out_dir, command)
        comm.destroy()
        return
    baseline = "torch ring"
    scale = head_dim ** -0.5
    rows, data = [], []
    for seq in seqs:
        for causal in causals:
            if seq % (2 * world if causal else world):
                if rank == 0:
                    print(f"skipped S={seq} causal={causal}: not {2 * world if causal else world} equal chunks",
                          flush=True)
                continue
            s_l = seq // world
            g = torch.Generator(device="cuda").manual_seed(1 + rank)
            q = torch.randn(batch, s_l, heads_q, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
            k = torch.randn(batch, s_l, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
            v = torch.randn(batch, s_l, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
            ring = TorchRing(comm, k.shape, k.dtype)

            def base_fn():
                return ring(q, k, v, causal, scale)[0]

            def tandem_fn():
                return attention.ring_attention(comm, q, k, v, causal=causal)

            res = {}
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                diff = float((tandem_fn()[0].float() - base_fn().float()).abs().max())
                for name, fn in (("tandem", tandem_fn), ("baseline", base_fn)):
                    comm.barrier()
                    res[name] = common.time_launches(fn, warmup=3, reps=reps)
            comm.check()
            flop = 4.0 * batch * heads_q * seq * seq * head_dim / (2 if causal else 1) / world
            d = dict(seq=seq, seq_local=s_l, causal=causal, batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                     head_dim=head_dim, world=world, baseline=baseline, tandem_ms=res["tandem"] * 1e3,
                     baseline_ms=res["baseline"] * 1e3, tandem_tflops=flop / res["tandem"] / 1e12,
                     baseline_tflops=flop / res["baseline"] / 1e12, speedup=res["baseline"] / res["tandem"],
                     max_abs_diff=diff)
            data.append(d)
            rows.append([str(seq), str(s_l), "yes" if causal else "no", f"{batch}/{heads_q}/{heads_kv}/{head_dim}",
                         f"{d['tandem_ms']:.3f}", f"{d['baseline_ms']:.3f}", f"{d['tandem_tflops']:.0f}",
                         f"{d['baseline_tflops']:.0f}", f"{d['speedup']:.2f}", f"{diff:.2e}"])
            if rank == 0:  # as it goes: a later shape that fails leaves the earlier rows on record
                print("| " + " | ".join(rows[-1]) + " |", flush=True)
            tp.release_workspaces(comm)
    if rank == 0:
        meta = common.header(command)
        table = common.markdown_table(
            ["S (global)", "S a rank", "causal", "B/Hq/Hkv/d", "tandem ms", f"{baseline} ms",
             "tandem TFLOP/s (rank)", f"{baseline} TFLOP/s (rank)", f"{baseline}/tandem", "max |o - baseline|"], rows)
        print(f"# tandem ring attention, world {world} ({comm.sm_count} SMs a rank) — {meta['device']}, commit "
              f"{meta['commit']}, {meta['date']}")
        print(table)
        common.write_outputs(out_dir, f"attention_w{world}", meta, table, dict(rows=data))
        if out_dir:
            plot(rows, world, baseline, os.path.join(out_dir, f"attention_w{world}.png"))
    comm.destroy()


def plot(rows, world, baseline, path):
    from . import common

    common.grouped_bars(path, [f"S={r[0]}\n{'causal' if r[2] == 'yes' else 'full'}" for r in rows],
                        [(name, [float(r[col]) for r in rows]) for name, col in (("tandem", 4), (baseline, 5))],
                        "ms per rank", f"tandem ring attention, world {world} (MPS ranks on one GPU)")


def main(argv=None) -> int:
    from . import common

    ap = common.parser("attention", __doc__, reps=10)
    ap.add_argument("--seqs", default="8192,16384,32768", help="global sequence lengths S")
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16, help="query heads Hq")
    ap.add_argument("--heads-kv", type=int, default=None, help="KV heads (default: Hq)")
    ap.add_argument("--head-dim", type=int, default=128, choices=[64, 128])
    a = ap.parse_args(argv)
    rc = common.relaunch("attention", a.nprocs, argv)
    if rc is not None:
        return rc
    causals = {"both": [False, True], "yes": [True], "no": [False]}[a.causal]
    run([int(s) for s in a.seqs.split(",")], causals, a.batch, a.heads, a.heads_kv or a.heads, a.head_dim, a.reps,
        a.out, common.command_line("attention", argv))
    return 0
