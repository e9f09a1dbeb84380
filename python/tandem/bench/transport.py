"""Transport benchmark: put bandwidth vs message size and flag round-trip latency, with cudaMemcpy
device-to-device measured in the same process as the baseline.

Runs in every rank (start it with tandem.launch, or `python -m tandem bench transport -n 2`); rank 0 puts to
rank 1 (to itself at world 1) and prints the table. Bandwidth counts each byte once (bytes / time).
"""

from __future__ import annotations

import os
import sys

DEFAULT_SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]


def run(sizes, reps: int, rtt_iters: int, out_dir: str | None, command: str, bulk_blocks: int):
    import torch

    from ..transport import Communicator, probe
    from . import common

    max_size = max(sizes)
    comm = Communicator(heap_bytes=2 * max_size + (64 << 20), timeout_s=60)
    rank, world = comm.rank, comm.world_size
    peer = 1 if world > 1 else 0
    active = rank == 0
    remote = peer not in comm.local_ranks  # another (emulated) node: the proxy path
    dst = comm.empty(max_size, torch.uint8)
    src = comm.empty(max_size, torch.uint8)  # symmetric: the proxy path reads sources by heap offset
    src.random_(0, 256)
    local_dst = torch.empty(max_size, dtype=torch.uint8, device="cuda")
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    flag = comm.zeros(16, torch.int64)
    torch.cuda.synchronize()
    comm.barrier()

    rows, data = [], []
    for n in sizes:
        inner = max(1, min(50, (4 << 20) // n))  # small messages: many launches per timed interval
        if active:
            def put(mode, blocks=0, threads=512):
                def go():
                    probe.put(comm, dst, src, n, peer=peer, mode=mode, blocks=blocks, threads=threads, status=status)
                    if remote:
                        probe.quiet(comm, status)  # time until the data is at the peer
                return go

            t_block = common.time_launches(put("block"), reps=reps, inner=inner)
            t_bulk = common.time_launches(put("bulk", threads=128), reps=reps, inner=inner)
            t_bulk_few = common.time_launches(put("bulk", blocks=bulk_blocks, threads=128), reps=reps, inner=inner)
            t_memcpy = common.time_launches(lambda: probe.memcpy_d2d(local_dst, src, n), reps=reps, inner=inner)
            if remote:
                t_memcpy_peer = float("nan")  # no load/store mapping of a peer on another node
            else:
                peer_dst = comm.peer_view(dst, peer)
                t_memcpy_peer = common.time_launches(lambda: probe.memcpy_d2d(peer_dst, src, n), reps=reps,
                                                     inner=inner)
            torch.cuda.synchronize()
            comm.check()
            if int(status.item()) != 0:
                raise RuntimeError(f"put reported status {int(status.item())}")
            gb = lambda t: n / t / 1e9  # noqa: E731
            d = dict(bytes=n, put_block_GBps=gb(t_block), put_bulk_GBps=gb(t_bulk),
                     put_bulk_few_GBps=gb(t_bulk_few), memcpy_GBps=gb(t_memcpy), memcpy_peer_GBps=gb(t_memcpy_peer),
                     put_block_us=t_block * 1e6)
            data.append(d)
            rows.append([common.fmt_bytes(n), f"{d['put_block_GBps']:.1f}", f"{d['put_bulk_GBps']:.1f}",
                         f"{d['put_bulk_few_GBps']:.1f}", f"{d['memcpy_GBps']:.1f}", f"{d['memcpy_peer_GBps']:.1f}",
                         f"{d['put_block_GBps'] / d['memcpy_GBps']:.2f}",
                         f"{max(d['put_block_GBps'], d['put_bulk_GBps']) / d['memcpy_GBps']:.2f}"])
        comm.barrier()

    # Flag round trip between rank 0 and rank 1: rtt_iters ping-pongs inside one launch, median of 5 launches,
    # for the public API and two reference variants (see probe.pingpong).
    rtt = {}
    base = 0
    if world > 1 and rank in (0, 1):
        rtt_remote = 1 not in comm.local_ranks or 0 not in comm.local_ranks  # the same answer on both ranks
        for variant in ("api",) if rtt_remote else tuple(probe.PINGPONG_VARIANTS):
            times = []
            for rep in range(6):
                torch.cuda.synchronize()
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                probe.pingpong(comm, flag, peer=1 - rank, iters=rtt_iters, base=base, initiator=rank == 0,
                               status=status, variant=variant)
                b.record()
                b.synchronize()
                base += rtt_iters
                if rep > 0:  # the first launch is the warm-up
                    times.append(a.elapsed_time(b) * 1e-3 / rtt_iters)
            comm.check()
            if int(status.item()) != 0:
                raise RuntimeError(f"pingpong {variant} reported status {int(status.item())}")
            times.sort()
            rtt[variant] = times[len(times) // 2] * 1e6
    rtt_us = rtt.get("api")
    comm.barrier()

    # Copy-loop occupancy sweep at the largest size: blocks per SM x threads per block.
    sweep = []
    if active and not remote:
        n = max_size
        for per_sm in (1, 2, 4):
            for threads in (256, 512, 1024):
                t = common.time_launches(lambda: probe.put(comm, dst, src, n, peer=peer, mode="block",
                                                           blocks=per_sm * comm.sm_count, threads=threads,
                                                           status=status), reps=reps)
                sweep.append(dict(blocks_per_sm=per_sm, threads=threads, GBps=n / t / 1e9))
        comm.check()
    comm.barrier()

    if rank == 0:
        meta = common.header(command)
        meta.update(world=world, sm_count=comm.sm_count, heap=comm.heap_kind, bulk_blocks=bulk_blocks,
                    peer=peer, mps=bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
                    path="proxy:" + comm.native.proxy_backend if remote else "load/store")
        cols = ["size", "put block GB/s", "put bulk GB/s", f"put bulk {bulk_blocks} blk GB/s", "cudaMemcpy D2D GB/s",
                "cudaMemcpy to peer GB/s", "block/memcpy", "best/memcpy"]
        table = common.markdown_table(cols, rows)
        rtt_line = ("flag round trip rank0<->rank1 (median of 5 launches x {}): ".format(rtt_iters) +
                    ", ".join(f"{k} {v:.2f} us" for k, v in rtt.items())) if rtt else "flag round trip: n/a at world 1"
        sweep_line = "occupancy sweep: n/a on the proxy path"
        if sweep:
            best = max(sweep, key=lambda r: r["GBps"])
            ref = max(data, key=lambda d: d["bytes"])["memcpy_GBps"]
            sweep_line = (f"put block at {common.fmt_bytes(max_size)} by blocks/SM x threads: " +
                          ", ".join(f"{r['blocks_per_sm']}x{r['threads']} {r['GBps']:.0f}" for r in sweep) +
                          f" GB/s (best {best['GBps'] / ref:.2f}x cudaMemcpy)")
        print(f"# tandem transport bench — {meta['device']}, world {world}, {comm.sm_count} SMs/rank, heap "
              f"{comm.heap_kind}, path to rank {peer}: {meta['path']}, commit {meta['commit']}, {meta['date']}")
        print(table)
        print(rtt_line)
        print(sweep_line)
        name = f"transport_w{world}" + ("_proxy" if remote else "")
        common.write_outputs(out_dir, name, meta, table + "\n\n" + rtt_line + "\n\n" + sweep_line,
                             dict(rows=data, rtt_us=rtt, sweep=sweep))
        if out_dir:
            plot(os.path.join(out_dir, f"{name}.png"), data, meta, rtt_us)
    comm.destroy()
    return rtt_us


def plot(path, data, meta, rtt_us):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    x = [d["bytes"] for d in data]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key, label in (("put_block_GBps", "put (block, all SMs)"), ("put_bulk_GBps", "put (TMA bulk, all SMs)"),
                       ("put_bulk_few_GBps", f"put (TMA bulk, {meta['bulk_blocks']} blocks)"),
                       ("memcpy_GBps", "cudaMemcpy D2D (local)"), ("memcpy_peer_GBps", "cudaMemcpy to peer")):
        ax.plot(x, [d[key] for d in data], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("GB/s (bytes once)")
    rtt = f", RTT {rtt_us:.2f} us" if rtt_us else ""
    ax.set_title(f"tandem put, world {meta['world']}, {meta['device']}{rtt}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    from . import common

    ap = common.parser("transport", __doc__, reps=10)
    ap.add_argument("--sizes", type=str, default=None, help="comma-separated byte counts")
    ap.add_argument("--rtt-iters", type=int, default=10000)
    ap.add_argument("--bulk-blocks", type=int, default=8, help="blocks of the few-SM TMA put column")
    ap.add_argument("--ranks-per-node", type=int, default=None,
                    help="emulate nodes of this many ranks (1: rank 1 is on another node, the proxy path)")
    a = ap.parse_args(argv)
    rc = common.relaunch("transport", a.nprocs, argv, ranks_per_node=a.ranks_per_node)
    if rc is not None:
        return rc
    sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else DEFAULT_SIZES
    if not a.sizes and (os.environ.get("TANDEM_RANKS_PER_NODE") == "1"):
        sizes = [s for s in DEFAULT_SIZES if s <= 64 << 20]  # the proxy path over TCP: keep the run short
    run(sizes, a.reps, a.rtt_iters, a.out, common.command_line("transport", argv), a.bulk_blocks)
    return 0
