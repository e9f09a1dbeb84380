"""Proxy path over TCP between two network namespaces (host memory on both sides): put bandwidth vs message
size (put + quiet, i.e. until the destination acknowledged) and signal round trip. CPU only; needs root and
iproute2. The GPU version is `python -m tandem bench transport -n 2 --ranks-per-node 1`.

usage: python tools/bench_proxy_netns.py [--out docs/results]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def rank_main(d, rank, host, reps):
    import numpy as np

    from tandem._native import native

    heap = np.zeros((64 << 20) + (1 << 20), dtype=np.uint8)
    ep = native().ProxyEndpoint(d, rank, 2, host, heap, 1024, 10.0)
    out = {}
    flag, data = 0, 1 << 20
    if rank == 0:
        heap[data:] = 7
        for n in SIZES:
            times = []
            for r in range(reps + 2):
                t0 = time.perf_counter()
                ep.put(1, data, data, n)
                ep.quiet()
                if r >= 2:
                    times.append(time.perf_counter() - t0)
            out[n] = statistics.median(times)
        rtts = []
        for i in range(1, 2001):
            t0 = time.perf_counter()
            ep.signal(1, flag, i, 0)
            ep.wait_ge(8, i, 10.0)
            rtts.append(time.perf_counter() - t0)
        out["rtt"] = statistics.median(rtts[100:])
        ep.signal(1, 16, 1, 0)  # done
    else:
        for i in range(1, 2001):
            ep.wait_ge(flag, i, 30.0)
            ep.signal(0, 8, i, 0)
        ep.wait_ge(16, 1, 60.0)
    ep.close()
    print(json.dumps({str(k): v for k, v in out.items()}), flush=True)


def ip(*a):
    subprocess.run(["ip", *a], check=True, capture_output=True, text=True, timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--host", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank is not None:
        return rank_main(a.dir, a.rank, a.host, a.reps)
    tag = str(os.getpid() % 100000)
    ns = (f"tdm-ba{tag}", f"tdm-bb{tag}")
    dev = (f"tba{tag}", f"tbb{tag}")
    addr = ("10.231.9.1", "10.231.9.2")
    try:
        for n in ns:
            ip("netns", "add", n)
        ip("link", "add", dev[0], "type", "veth", "peer", "name", dev[1])
        for n, d_, ad in zip(ns, dev, addr):
            ip("link", "set", d_, "netns", n)
            ip("-n", n, "addr", "add", f"{ad}/30", "dev", d_)
            ip("-n", n, "link", "set", d_, "up")
            ip("-n", n, "link", "set", "lo", "up")
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, PYTHONPATH=ROOT)
            ps = [subprocess.Popen(["ip", "netns", "exec", ns[r], sys.executable, os.path.abspath(__file__), "--rank",
                                    str(r), "--dir", d, "--host", addr[r], "--reps", str(a.reps)],
                                   stdout=subprocess.PIPE, text=True, env=env) for r in (0, 1)]
            res = json.loads(ps[0].communicate(timeout=600)[0].strip().splitlines()[-1])
            ps[1].communicate(timeout=60)
    finally:
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
    rows = ["| size | put + quiet | GB/s |", "|---|---|---|"]
    for n in SIZES:
        t = res[str(n)]
        label = f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
        rows.append(f"| {label} | {t * 1e6:.0f} us | {n / t / 1e9:.2f} |")
    table = "\n".join(rows) + f"\n\nsignal round trip (median of 1900): {res['rtt'] * 1e6:.1f} us"
    print(table)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "proxy_tcp_netns.md"), "w") as f:
            f.write(f"proxy path, TCP over veth between two network namespaces, host memory, "
                    f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n`python tools/bench_proxy_netns.py`\n\n")
            f.write(table + "\n")


if __name__ == "__main__":
    main()
