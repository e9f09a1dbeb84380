"""The comm roles alone, per SM: tandem's all-gather copy (AG), reduce-scatter reduction (RS) and all-reduce
(reduction + gather of the reduced rows, AR) on c SMs of each rank, next to a plain vectorized block copy on
the same c SMs, the bulk-copy (TMA) block put on c SMs, and cudaMemcpy (the copy engines), all moving the same
chunk to or from the peers, every rank at once (N ranks under MPS on one GPU: peers' memory is this GPU's HBM).

GB/s counts the bytes the role must move through memory once: AG (W-1) chunks written to peers and the own
chunk copied (read + written once each); RS W partial chunks read + one written; AR that plus W-1 reduced chunks
copied; the copies their bytes read + written. Per SM = that / c.

    python -m tandem bench roles -n 4 [--out DIR] [--sms 2,4,8,16]
"""

from __future__ import annotations


def run(sms_list, reps, out_dir, command, m_total, n, k):
    import torch

    from .. import ops  # noqa: F401
    from ..ops import tp
    from ..transport import Communicator, probe
    from . import common

    comm = Communicator(heap_bytes=8 << 30, timeout_s=60)
    world, rank = comm.world_size, comm.rank
    peer = (rank + 1) % world
    esz = 2
    m_local = m_total // world
    a_ag = torch.randn(m_local, k, device="cuda", dtype=torch.bfloat16)
    b_ag = torch.randn(k, 256, device="cuda", dtype=torch.bfloat16)
    a_rs = torch.randn(m_total, 64, device="cuda", dtype=torch.bfloat16)
    b_rs = torch.randn(64, n, device="cuda", dtype=torch.bfloat16)
    ag_chunk = m_local * k * esz
    rs_chunk = m_local * n * esz
    src = torch.randn(ag_chunk // esz, device="cuda", dtype=torch.bfloat16)
    dst = comm.empty(ag_chunk // esz, torch.bfloat16)
    dst_view = comm.peer_view(dst, peer)
    sms_all = comm.sm_count & ~1
    sms_list = sorted({min(c, sms_all) for c in sms_list} | {sms_all})
    # bytes through memory (read + written) of one call of each, per rank
    moved = dict(
        ag=2 * ag_chunk * world,                          # own chunk copied + (W-1) peer writes (read + write)
        rs=rs_chunk * (world + 1),                        # W partials read, own rows written
        ar=rs_chunk * (world + 1) + 2 * rs_chunk * (world - 1),
        copy=2 * ag_chunk, bulk=2 * ag_chunk, memcpy=2 * ag_chunk)

    def timed(fn):
        comm.barrier()
        return common.time_launches(fn, warmup=3, reps=reps)

    rows, data = [], []
    t_memcpy = timed(lambda: probe.memcpy_d2d(dst_view, src, ag_chunk))
    for c in sms_list:
        t = dict(
            ag=timed(lambda: tp.collective_alone(comm, "ag_gemm", a_ag, b_ag, sm_count=c)),
            rs=timed(lambda: tp.collective_alone(comm, "gemm_rs", a_rs, b_rs, sm_count=c)),
            ar=timed(lambda: tp.collective_alone(comm, "gemm_ar", a_rs, b_rs, sm_count=c)),
            copy=timed(lambda: probe.put(comm, dst, src, ag_chunk, peer=peer, mode="block", blocks=c)),
            bulk=timed(lambda: probe.put(comm, dst, src, ag_chunk, peer=peer, mode="bulk", blocks=c)),
            memcpy=t_memcpy)
        comm.check()
        d = dict(world=world, sms=c, **{f"{key}_ms": v * 1e3 for key, v in t.items()},
                 **{f"{key}_gbs": moved[key] / v / 1e9 for key, v in t.items()},
                 **{f"{key}_gbs_per_sm": moved[key] / v / 1e9 / c for key, v in t.items() if key != "memcpy"})
        data.append(d)
        rows.append([str(c)] + [f"{d[f'{key}_gbs']:.0f} ({d[f'{key}_gbs_per_sm']:.1f})"
                                for key in ("ag", "rs", "ar", "copy", "bulk")] + [f"{d['memcpy_gbs']:.0f}"])
    tp.release_workspaces(comm)
    if rank == 0:
        meta = common.header(command)
        table = common.markdown_table(
            ["SMs a rank", "AG role GB/s (per SM)", "RS role", "AR role", "plain block copy", "bulk (TMA) copy",
             "cudaMemcpy (copy engine)"], rows)
        print(f"# tandem comm roles, world {world} ({comm.sm_count} SMs a rank; AG chunk {ag_chunk >> 20} MiB, "
              f"RS chunk {rs_chunk >> 20} MiB) — {meta['device']}, commit {meta['commit']}, {meta['date']}")
        print("GB/s of one rank (bytes read + written once); all ranks run at once on one GPU")
        print(table)
        common.write_outputs(out_dir, f"roles_w{world}", meta, table, dict(rows=data))
    comm.destroy()


def main(argv=None) -> int:
    from . import common

    ap = common.parser("roles", __doc__, reps=10)
    ap.add_argument("--sms", default="2,4,8,16", help="SMs a rank for the roles (the rank's share is added)")
    ap.add_argument("--m", type=int, default=16384, help="rows of the layer (AG: A is M x K; RS: out M x N)")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=4096)
    a = ap.parse_args(argv)
    rc = common.relaunch("roles", a.nprocs, argv)
    if rc is not None:
        return rc
    run([int(x) for x in a.sms.split(",")], a.reps, a.out, common.command_line("roles", argv), a.m, a.n, a.k)
    return 0
