"""Put the load/store path and the proxy path side by side: one table and one plot from the JSON files that
`python -m tandem bench transport --out DIR` wrote (transport_wN.json and transport_wN_proxy.json).

usage: python tools/plot_transport.py DIR [--world 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = a.out or a.dir
    runs = {}
    for name, label in ((f"transport_w{a.world}", "load/store"), (f"transport_w{a.world}_proxy", "proxy")):
        path = os.path.join(a.dir, name + ".json")
        if os.path.exists(path):
            with open(path) as f:
                runs[label] = json.load(f)
    if len(runs) < 2:
        raise SystemExit(f"need both transport_w{a.world}.json and transport_w{a.world}_proxy.json in {a.dir}")
    by_size = {}
    for label, r in runs.items():
        for row in r["data"]["rows"]:
            by_size.setdefault(row["bytes"], {})[label] = row["put_block_GBps"]
    lines = ["| size | load/store put GB/s | proxy put GB/s | proxy / load-store |", "|---|---|---|---|"]
    for n in sorted(by_size):
        v = by_size[n]
        if "load/store" in v and "proxy" in v:
            lines.append(f"| {n} | {v['load/store']:.1f} | {v['proxy']:.2f} | {v['proxy'] / v['load/store']:.3f} |")
    rtt = {k: (r["data"].get("rtt_us") or {}).get("api") for k, r in runs.items()}
    lines.append("")
    lines.append("flag round trip: " + ", ".join(f"{k} {v:.2f} us" for k, v in rtt.items() if v))
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(out, f"transport_paths_w{a.world}.md"), "w") as f:
        meta = runs["proxy"]["meta"]
        f.write(f"load/store vs proxy path, world {a.world}: {meta['date']}, {meta['device']}, commit {meta['commit']}\n\n")
        f.write(table + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label in ("load/store", "proxy"):
        xs = sorted(n for n in by_size if label in by_size[n])
        ax.plot(xs, [by_size[n][label] for n in xs], marker="o", label=f"put, {label} path")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("GB/s")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(f"tandem put: load/store vs proxy (TCP), world {a.world}", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"transport_paths_w{a.world}.png"), dpi=120)


if __name__ == "__main__":
    main()
