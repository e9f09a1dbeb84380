"""Diagnostic: are cuBLAS's bf16/fp16 GEMMs exact on a rank's MPS share of the SMs?

Seen on the H200 (2026-12-04, world 3 = 44 SMs a rank): the TP tests' GEMM outputs differed from their
references in 20-50% of the elements of some slices while the gathered inputs were right. The data is exact in
fp32 (multiples of 1/8, K <= 1024: every partial sum is representable), so any fp32-accumulating GEMM rounds
once and must equal the reference bit for bit. Each rank, every rank at once, for each shape:

* cuBLAS (torch.matmul, bf16 and fp16) against a CPU fp32 reference rounded once (wrong elements);
* the GPU fp32 reference (torch.matmul on .float()) against the CPU one;
* the same GEMM as row slices (as the pipelined mode computes it), and with beta = 1 (addmm into a copy).

    python -m tandem.launch -n 3 -- python tools/diag/cublas_mps_check.py [--out DIR]
Writes cublas_mps_r{rank}.json into --out; rank 0 prints its table.
"""

import argparse
import os

import torch

from tandem.bench import common
from tandem.transport import Communicator

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", default="3000x1024x512,1000x1024x512,768x1024x1024,256x1024x1024,1024x512x512,"
                                    "4096x2048x1024")
ap.add_argument("--out", default=os.environ.get("OUT"))
args = ap.parse_args()

comm = Communicator(heap_bytes=16 << 20)
rank, world = comm.rank, comm.world_size
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False


def ints(rows, cols, salt, dtype, mod, half):
    i = torch.arange(rows).view(-1, 1)
    j = torch.arange(cols).view(1, -1)
    return ((((i * 7 + j * 3 + salt * 5) % mod) - half).to(torch.float32) / 8).to(dtype)


props = torch.cuda.get_device_properties(torch.cuda.current_device())
rows = []
for shape in args.shapes.split(","):
    m, n, k = (int(x) for x in shape.split("x"))
    for dtype in (torch.bfloat16, torch.float16):
        a_cpu = ints(m, k, 0, dtype, 17, 8)
        b_cpu = ints(k, n, 1, dtype, 13, 6)
        c_cpu = ints(m, n, 2, dtype, 11, 5)
        exact = a_cpu.float() @ b_cpu.float()
        ref = exact.to(dtype)
        ref_beta = (exact + c_cpu.float()).to(dtype)
        a, b, c0 = a_cpu.cuda(), b_cpu.cuda(), c_cpu.cuda()
        got = torch.matmul(a, b)
        gpu_fp32 = (a.float() @ b.float()).cpu()
        sl = torch.empty_like(got)
        step = -(-m // 3)
        for r0 in range(0, m, step):
            torch.matmul(a[r0:r0 + step], b, out=sl[r0:r0 + step])
        beta = c0.clone()
        beta.addmm_(a, b)
        beta3 = c0.clone()  # three times the magnitudes: more of the sum's bits are rounded away
        beta3.addmm_(a * 3, b)
        ref_beta3 = ((a_cpu.float() * 3) @ b_cpu.float() + c_cpu.float()).to(dtype)
        torch.cuda.synchronize()
        rows.append(dict(shape=[m, n, k], dtype=str(dtype).split(".")[-1],
                         cublas_wrong=int((got.cpu() != ref).sum()),
                         gpu_fp32_wrong=int((gpu_fp32 != exact).sum()),
                         sliced_wrong=int((sl.cpu() != ref).sum()),
                         beta1_wrong=int((beta.cpu() != ref_beta).sum()),
                         beta1_x3_wrong=int((beta3.cpu() != ref_beta3).sum()),
                         of=m * n))
out = dict(rank=rank, world=world, sms=props.multi_processor_count,
           mps_pct=os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
           tf32=torch.backends.cuda.matmul.allow_tf32, rows=rows)
common.write_json(args.out, f"cublas_mps_r{rank}.json", out)
if rank == 0:
    print(f"# cuBLAS exactness, world {world}, {out['sms']} SMs a rank (MPS {out['mps_pct']}%), tf32 {out['tf32']}")
    print("| shape | dtype | cuBLAS wrong | fp32 GPU wrong | sliced wrong | beta=1 wrong | beta=1, 3a wrong | of |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {'x'.join(map(str, r['shape']))} | {r['dtype']} | {r['cublas_wrong']} | {r['gpu_fp32_wrong']} | "
              f"{r['sliced_wrong']} | {r['beta1_wrong']} | {r['beta1_x3_wrong']} | {r['of']} |")
comm.barrier()
comm.destroy()
