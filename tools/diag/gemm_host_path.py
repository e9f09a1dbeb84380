"""Where torch.ops.tandem.gemm's time goes at small and medium shapes (issue 23: the op ran 8-21 % slower than the
same CUTLASS configuration called directly, 2026-12-05): per shape, for the op, the same configuration through
its launcher with Args made once, and cuBLAS (torch.matmul):

  host us   wall time per call of 200 calls enqueued back to back (no sync inside; the GPU queue absorbs them
            while a call's host work is shorter than the queue), i.e. what one call costs the CPU
  dev ms    CUDA events around 20 calls back to back, per call (the host's time hidden unless it is longer)
  one ms    CUDA events around one call (bench gemm's method: the host's time before the launch counts)

    python tools/diag/gemm_host_path.py [--shapes 1000x1000x1008,5000x3000x8208,4096x14336x4096]
"""

from __future__ import annotations

import argparse

import torch

import tandem.ops  # noqa: F401
from tandem._native import native
from tandem.bench import common
from tandem.ops import _dispatcher, gemm_plan
from tandem.ops._runtime import stream_handle
from tandem.ops.gemm import gemm_args, variant_workspace


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1000x1000x1008,777x4104x4096,5000x3000x8208,4096x14336x4096")
    a = ap.parse_args()
    K = native().kernels
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"op path: {_dispatcher.status()} (op_python: the same op with its C++ kernels switched off)")
    print("| M x N x K | config | op host us | op_python host us | direct host us | cuBLAS host us | op dev ms | "
          "op_python dev ms | direct dev ms | cuBLAS dev ms | op one ms | op_python one ms | direct one ms | "
          "cuBLAS one ms |")
    print("|---" * 14 + "|")
    for s in a.shapes.split(","):
        m, n, k = (int(v) for v in s.split("x"))
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        cfg = gemm_plan.choose(m, n, k, sms)
        args = gemm_args(x, w, d, sms)
        ws = variant_workspace(cfg, args, x.device)
        wp = 0 if ws is None else ws.data_ptr()
        stream = stream_handle(x.device)
        fns = dict(op=lambda: torch.ops.tandem.gemm(x, w),
                   op_python=lambda: torch.ops.tandem.gemm(x, w),  # timed with the C++ kernels switched off
                   direct=lambda: K.gemm_variant(cfg, args, stream, wp),
                   cublas=lambda: torch.matmul(x, w, out=d))
        hu, dev, one = {}, {}, {}
        for key, f in fns.items():
            with _dispatcher.switched_off(key == "op_python"):
                hu[key] = common.host_launch_us(f, 200, warmup=True)
                dev[key] = common.time_launches(f, warmup=3, reps=7, inner=20) * 1e3
                one[key] = common.time_launches(f, warmup=3, reps=7) * 1e3
        print(f"| {s} | {cfg} | " + " | ".join(f"{hu[key]:.1f}" for key in fns) + " | "
              + " | ".join(f"{dev[key]:.4f}" for key in fns) + " | " + " | ".join(f"{one[key]:.4f}" for key in fns)
              + " |", flush=True)
    # The op's host path in pieces (us a call, 200 calls back to back), at the last shape: what the dispatcher,
    # the Python op body, the output allocation, the prepared-call key, a bare pybind call into the kernels layer
    # and the CUTLASS launch (initialize: TMA descriptors, kernel attribute; launch) each cost.
    from tandem.ops import _runtime
    from tandem.ops.gemm import gemm_with

    parts = dict(op=lambda: torch.ops.tandem.gemm(x, w),
                 at_empty=lambda: x.new_empty((m, n)),
                 gemm_with=lambda: gemm_with(x, w),
                 empty=lambda: torch.empty((m, n), dtype=x.dtype, device=x.device),
                 key_lookup=lambda: _runtime.prepared(("gemm", None, x.shape, x.stride(), x.dtype, x.device, w.shape,
                                                       w.stride(), w.dtype, w.device, None, None, None)),
                 set_addresses=lambda: (setattr(args, "a", x.data_ptr()), setattr(args, "b", w.data_ptr()),
                                        setattr(args, "d", d.data_ptr())),
                 stream=lambda: stream_handle(x.device),
                 pybind_check=lambda: K.can_implement(args),
                 direct=lambda: K.gemm_variant(cfg, args, stream, wp),
                 cublas=lambda: torch.matmul(x, w))
    # The CUTLASS launch in pieces, timed inside the module (modules before the host-path change lack it)
    if hasattr(K, "gemm_host_costs"):
        costs = K.gemm_host_costs(25, stream)
        print("launch pieces, us a call: " + ", ".join(f"{k[:-3]} {v:.2f}" for k, v in costs.items()))
    print(f"\nhost us a call at {s} ({cfg}): "
          + ", ".join(f"{name} {common.host_launch_us(f, 200, warmup=True):.2f}" for name, f in parts.items()))


if __name__ == "__main__":
    main()
