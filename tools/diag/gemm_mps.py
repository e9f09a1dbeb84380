"""Diagnostic: why does tandem's GEMM core run below cuBLAS on a rank's MPS share of the SMs?

On the H200 under MPS (world 4, 32 SMs a rank) the core (128x256x64 tiles, 2x1 clusters, cooperative,
persistent grid of sm_count CTAs) took about twice cuBLAS's time at the TP ops' rank GEMMs, while on the whole
GPU it matched cuBLAS (docs/results.md, issue 21). Every rank runs the same GEMMs at the same time (as the TP
ops do), and this script reports, per rank and shape:

* cuBLAS (torch.matmul): time, and the kernel it launched (its name carries tile, cluster and schedule);
* each configuration of tandem's core (gemm_variants.h) at the rank's sm_count: time, relative error against
  cuBLAS's result, persistent grid, and what cudaOccupancyMaxActiveClusters says fits;
* the core at the device's whole SM count (an oversubscribed persistent grid, as a kernel unaware of MPS
  would launch);
* a residency probe: sm_count CTAs with the core's shared memory, in clusters of 1 and of 2, each spinning
  2 ms; how many were resident at once (1 = all of them).

    python -m tandem.launch -n 4 -- python tools/diag/gemm_mps.py [--shapes MxNxK,...] [--out DIR] [--reps 5]

Each rank writes gemm_mps_r{rank}.json into --out (default $OUT when set); rank 0 prints its table.
"""

import argparse
import os
import sys

import torch

import tandem._native as n
from tandem.bench import common
from tandem.ops.gemm import gemm_args
from tandem.transport import Communicator

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", default="16384x8192x4096,16384x8192x1024,8192x4096x8192,8192x7168x8192,2048x8192x7168",
                help="the ranks' GEMMs M x N x K (defaults: bench tp's rank GEMMs at worlds 2 and 4)")
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--out", default=os.environ.get("OUT"))
ap.add_argument("--probe-grids", default="",
                help="also run the residency probe (1-CTA clusters, the core's shared memory) at these grid sizes, "
                     "e.g. 16,18,24,28,30,32: how many of a rank's blocks start at once, and on which SMs "
                     "(the late blocks of docs/results.md 2026-12-06 were not caused by 2-CTA clusters)")
ap.add_argument("--device-sms", type=int, default=132,
                help="the GPU's SM count (under MPS the device properties report the rank's share)")
args = ap.parse_args()

K = n.native().kernels
comm = Communicator(heap_bytes=64 << 20, timeout_s=60)
rank, world, sms = comm.rank, comm.world_size, comm.sm_count
device_sms = args.device_sms
stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731


def timed(fn):
    comm.barrier()  # every rank's GEMMs run together, as in the TP ops
    return common.time_launches(fn, warmup=3, reps=args.reps) * 1e3


def cublas_kernel(fn):
    """Names of the CUDA kernels one call launches (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in p.events() if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()})


def residency(blocks, cluster, smem, spin_us=2000):
    tl = torch.zeros(blocks * 3, dtype=torch.int64, device="cuda")
    comm.barrier()
    try:
        K.residency_probe(blocks, cluster, smem, spin_us, tl.data_ptr(), stream())
    except RuntimeError as e:  # TandemError, with the launcher's status
        return dict(error=str(e))
    torch.cuda.synchronize()
    t = tl.view(blocks, 3).cpu()
    events = sorted([(int(s), 1) for s in t[:, 0]] + [(int(e), -1) for e in t[:, 1]], key=lambda x: (x[0], x[1]))
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    first = int(t[:, 0].min())
    span_us = (int(t[:, 1].max()) - first) / 1e3
    late = {i for i in range(blocks) if (int(t[i, 0]) - first) / 1e3 > spin_us / 2}
    return dict(blocks=blocks, cluster=cluster, smem=smem, peak_resident=peak, distinct_sms=len(set(t[:, 2].tolist())),
                span_us=span_us, waves=span_us / spin_us, late_blocks=len(late),
                sms_first_wave=sorted({int(t[i, 2]) for i in range(blocks) if i not in late}),
                sms_late=sorted({int(t[i, 2]) for i in late}))


rows = []
for shape in [x for x in args.shapes.split(",") if x]:
    m, nn, k = (int(x) for x in shape.split("x"))
    torch.manual_seed(rank)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, nn, device="cuda", dtype=torch.bfloat16)
    ref = torch.empty(m, nn, device="cuda", dtype=torch.bfloat16)
    d = torch.empty_like(ref)
    flop = 2.0 * m * nn * k
    r = dict(shape=shape, rank=rank, world=world, sm_count=sms, device_sms=device_sms)
    r["cublas_ms"] = timed(lambda: torch.matmul(a, b, out=ref))
    try:
        r["cublas_kernels"] = cublas_kernel(lambda: torch.matmul(a, b, out=ref))
    except Exception as e:  # noqa: BLE001 - the profiler is a nicety here
        r["cublas_kernels"] = [f"profiler failed: {e}"]
    r["variants"] = {}
    for name in K.gemm_variant_names():
        try:
            occ = K.gemm_variant_occupancy(name, gemm_args(a, b, d, sms))
        except RuntimeError as e:  # TandemError: the configuration cannot take this shape
            occ = dict(error=str(e))

        def run(name=name, x=gemm_args(a, b, d, sms)):  # the Args made once, outside the timed calls
            K.gemm_variant(name, x, stream())  # TandemError (a RuntimeError) if it cannot run

        v = dict(occupancy=occ)
        try:
            v["ms"] = timed(run)
            d.zero_()
            run()
            torch.cuda.synchronize()
            v["rel_err_vs_cublas"] = float((d.float() - ref.float()).norm() / ref.float().norm())
            v["tflops"] = flop / v["ms"] / 1e9
            v["over_cublas"] = v["ms"] / r["cublas_ms"]
        except RuntimeError as e:
            v["error"] = str(e)
        r["variants"][name] = v
    whole_args = gemm_args(a, b, d, device_sms)

    def whole_device():
        K.gemm_variant("coop_128x256_c2", whole_args, stream())

    try:
        r["core_whole_device_ms"] = timed(whole_device)
    except RuntimeError as e:
        r["core_whole_device_ms"] = str(e)
    rows.append(r)

_sq = torch.empty(4096, 4096, device="cuda", dtype=torch.bfloat16)
core_smem = K.gemm_variant_occupancy("coop_128x256_c2", gemm_args(_sq, _sq, _sq, sms)).get("smem_bytes", 200 * 1024)
probe = [residency(sms - sms % 2, c, core_smem) for c in (1, 2)]
probe.append(residency(device_sms - device_sms % 2, 2, core_smem))
for g in [int(x) for x in args.probe_grids.split(",") if x]:
    probe.append(residency(g, 1, core_smem))
comm.check()

result = dict(meta=common.header("tools/diag/gemm_mps.py " + " ".join(sys.argv[1:])), rank=rank, world=world,
              sm_count=sms, device_sms=device_sms, rows=rows, residency=probe)
common.write_json(args.out, f"gemm_mps_r{rank}.json", result)
if rank == 0:
    print(f"# GEMM under MPS: world {world}, {sms} SMs a rank (device {device_sms}); ms, every rank at once")
    names = K.gemm_variant_names()
    print("| shape | cuBLAS | " + " | ".join(names) + " | core on all SMs | cuBLAS kernel |")
    print("|---|---|" + "---|" * len(names) + "---|---|")
    for r in rows:
        cells = []
        for nm in names:
            v = r["variants"][nm]
            cells.append(v.get("error", "")[:30] if "ms" not in v else
                         f"{v['ms']:.3f} ({v['over_cublas']:.2f}x, clusters {v['occupancy'].get('max_active_clusters')}"
                         f"/{v['occupancy'].get('grid_ctas')} CTAs)")
        whole = r["core_whole_device_ms"]
        print(f"| {r['shape']} | {r['cublas_ms']:.3f} | " + " | ".join(cells) +
              f" | {whole if isinstance(whole, str) else f'{whole:.3f}'} | {'; '.join(r['cublas_kernels'])[:160]} |")
    for p in probe:
        print(f"residency: {p}")
comm.destroy()
