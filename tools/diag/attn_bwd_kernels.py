#!/usr/bin/env python3
"""Which kernels ring attention's backward launches at world 1, beside SDPA's cuDNN backward (issue 25).

At world 1 the backward is one cuDNN block call (attention_backward.block_backward: the whole shard, causally or
not), yet bench attention measured it at 0.69-0.97 of SDPA's cuDNN backward on the same shapes without GQA
(docs/results.md, 2026-12-06) and 0.40-0.65 with GQA/MQA. Same library, same problem: either other kernels run
around it (copies, casts, the GQA repeat and sums), or cuDNN picks another engine for tandem's tensors (strides,
alignment, the statistics' layout). This prints, per shape and per path (SDPA cuDNN; tandem; tandem with
TANDEM_RING_BWD_GQA=repeat for GQA shapes), every CUDA kernel one backward launched and its device time
(torch.profiler after warm-ups), as JSON lines, and with --out into a file. Each row also has the backward's time
as bench attention takes it (`single_call_us`: CUDA events around one call, median of 20, the host path before the
first kernel included), back to back (`back_to_back_us`: 10 calls between the events, divided: the host path
hidden behind the device's queue when the device is the slower), and the host's wall time to enqueue one call
(`host_us`, median of 20, the device synchronized before each): kernels' sum equal to SDPA's but single_call_us not
says the difference is the host path (autograd's Python backward, the op's checks), not cuDNN.

    python3 -m tandem.launch -n 1 -- python3 tools/diag/attn_bwd_kernels.py [--shapes B/Hq/Hkv/d/S/causal,...]
        [--out FILE] [--host-profile N]

--host-profile N adds `host_profile` to each row: the N functions with the most cumulative host time over 20 calls
of the backward (cProfile, the device synchronized before each call, so the device's queue never blocks the host):
where the host path's time goes (2026-12-07: tandem's world-1 backward spent 750-870 us enqueueing one call against
SDPA cuDNN's 380-500, with the same cuDNN kernels).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

# bench attention's rows furthest behind cuDNN (B/Hq/Hkv/d/S/causal)
DEFAULT_SHAPES = "1/16/16/128/8192/1,8/32/8/128/2048/1,1/8/1/128/16384/1,4/32/32/64/4096/0"


def parse(spec: str):
    b, hq, hkv, d, s, causal = (int(x) for x in spec.split("/"))
    return b, hq, hkv, d, s, bool(causal)


def host_profile(call, top: int, calls: int = 20) -> list:
    """[{fn, ncalls, tottime_us, cumtime_us}] per call of `call`, the `top` functions by cumulative time (cProfile
    around `calls` calls, each after a device synchronize, which is outside the profile)."""
    import cProfile
    import pstats

    import torch

    pr = cProfile.Profile()
    for _ in range(calls):
        torch.cuda.synchronize()
        pr.enable()
        call()
        pr.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(pr)
    rows = []
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in st.stats.items():
        where = f"{os.path.basename(file)}:{line}({fn})" if file != "~" else fn
        rows.append(dict(fn=where[:120], ncalls=nc / calls, tottime_us=round(tt / calls * 1e6, 1),
                         cumtime_us=round(ct / calls * 1e6, 1)))
    rows.sort(key=lambda r: -r["cumtime_us"])
    return rows[:top]


def main(argv=None) -> int:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from cublas_kernels import kernels_of
    from tandem.bench import common
    from tandem.ops import attention
    from tandem.transport import Communicator

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--out", default=None)
    ap.add_argument("--host-profile", type=int, default=0, metavar="N")
    a = ap.parse_args(argv)
    comm = Communicator(heap_bytes=1 << 30, timeout_s=60)
    if comm.world_size != 1:
        raise SystemExit("world 1 only (python3 -m tandem.launch -n 1 -- ...)")
    lines = []
    for spec in a.shapes.split(","):
        b, hq, hkv, d, s, causal = parse(spec)
        g = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
                   for h in (hq, hkv, hkv))
        do = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        gqa = dict(enable_gqa=True) if hkv != hq else {}

        def sdpa():
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal, **gqa).transpose(1, 2)

        def mine():
            return attention.ring_attention(comm, q, k, v, causal=causal)[0]

        paths = [("sdpa_cudnn", sdpa, {}), ("tandem", mine, {})]
        if hkv != hq:
            paths.append(("tandem_repeat", mine, {"TANDEM_RING_BWD_GQA": "repeat"}))
        for name, fwd, env in paths:
            saved = {n: os.environ.get(n) for n in env}
            os.environ.update(env)
            try:
                ctx = sdpa_kernel(SDPBackend.CUDNN_ATTENTION) if name == "sdpa_cudnn" else torch.enable_grad()
                with ctx:
                    o = fwd()
                    call = lambda o=o: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # noqa: E731
                    ks = kernels_of(call)
                    single = statistics.median(common.launch_samples(call, warmup=3, reps=20)) * 1e6
                    b2b = statistics.median(common.launch_samples(call, warmup=1, reps=5, inner=10)) * 1e6
                    # one call at a time from an idle device (host_launch_us syncs before and after)
                    host = [common.host_launch_us(call, 1) for _ in range(20)]
                    prof = host_profile(call, a.host_profile) if a.host_profile else None
            finally:
                for n, val in saved.items():
                    os.environ.pop(n, None)
                    if val is not None:
                        os.environ[n] = val
            row = dict(shape=spec, path=name, total_us=round(sum(t for _, t in ks), 1),
                       single_call_us=round(single, 1), back_to_back_us=round(b2b, 1),
                       host_us=round(statistics.median(host), 1),
                       kernels=[dict(name=n[:160], us=t) for n, t in ks])
            if prof is not None:
                row["host_profile"] = prof
            lines.append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(json.dumps(r) for r in lines) + "\n")
    comm.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
