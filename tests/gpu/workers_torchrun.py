"""A tandem job as a user writes it for torchrun (tests/gpu/test_torchrun.py launches it):

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/gpu/workers_torchrun.py OUT_DIR [BOOTSTRAP]

Every rank builds tandem.Communicator() from the environment torchrun gives it (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/MASTER_PORT), runs tandem.ops.ag_gemm / gemm_rs / gemm_ar on random bf16 data, compares with a torch
fp32 reference computed from data every rank regenerates from a seed, and writes OUT_DIR/<rank>.json.
BOOTSTRAP: "env" (default: Communicator() alone, the store from MASTER_ADDR/MASTER_PORT) or "process_group"
(torch.distributed.init_process_group("gloo") first; Communicator() then uses the default group's store).

It sets no CUDA or MPS variable itself: the launching side does (CUDA_MPS_PIPE_DIRECTORY and
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in torchrun's environment, which every rank inherits).
A standalone script (no package-relative imports): torchrun runs it by path.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import sys
import traceback

SEED = 20240611
M_LOCAL, N, K_LOCAL = 256, 512, 512  # small; M_LOCAL % 256 == 0, so mode="fused" can run every op
TOL = 2e-2  # relative Frobenius error against the fp32 reference (bf16 output rounding is ~3e-3)


def _rand(gen, rows, cols):
    # CPU generator: the same numbers on every rank whatever its device; bf16 inputs, exactly representable
    import torch

    return torch.randn(rows, cols, generator=gen, dtype=torch.float32).to(torch.bfloat16)


def _rel(out, ref) -> float:
    return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-6))


def _digest(t) -> str:
    import torch

    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def run(bootstrap: str) -> dict:
    import torch

    if bootstrap == "process_group":
        import torch.distributed as dist

        dist.init_process_group("gloo")  # env:// from torchrun; tandem then takes the default group's store

    import tandem
    import tandem.ops

    comm = tandem.Communicator(timeout_s=30)
    rank, world = comm.rank, comm.world_size
    dev = torch.device("cuda", comm.device)
    out = dict(rank=rank, world=world, device=comm.device, sm_count=comm.sm_count, bootstrap=bootstrap,
               local_rank=int(os.environ.get("LOCAL_RANK", "-1")),
               mps_percent=os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
               shape=[M_LOCAL, N, K_LOCAL], cases=[])

    gen = torch.Generator().manual_seed(SEED)
    # AllGather + GEMM: A's rows are sharded by rank; B is the same on every rank.
    a_full = _rand(gen, world * M_LOCAL, K_LOCAL)
    b = _rand(gen, K_LOCAL, N)
    ag_ref = a_full.float() @ b.float()
    # GEMM + ReduceScatter / AllReduce: rank q holds a partial product A_q @ B_q (K sharded by rank).
    parts = [(_rand(gen, world * M_LOCAL, K_LOCAL), _rand(gen, K_LOCAL, N)) for _ in range(world)]
    sum_ref = sum(pa.float() @ pb.float() for pa, pb in parts)

    a_local = a_full[rank * M_LOCAL:(rank + 1) * M_LOCAL].contiguous().to(dev)
    b_dev = b.to(dev)
    pa, pb = (t.to(dev) for t in parts[rank])
    rows = slice(rank * M_LOCAL, (rank + 1) * M_LOCAL)
    for mode in ("auto", "fused"):
        c = tandem.ops.ag_gemm(comm, a_local, b_dev, mode=mode)
        o = tandem.ops.gemm_rs(comm, pa, pb, mode=mode)
        y = tandem.ops.gemm_ar(comm, pa, pb, mode=mode)
        torch.cuda.synchronize()
        comm.check()
        out["cases"] += [
            dict(op="ag_gemm", mode=mode, shape=list(c.shape), rel=_rel(c.cpu(), ag_ref),
                 finite=bool(torch.isfinite(c).all())),
            dict(op="gemm_rs", mode=mode, shape=list(o.shape), rel=_rel(o.cpu(), sum_ref[rows]),
                 finite=bool(torch.isfinite(o).all())),
            dict(op="gemm_ar", mode=mode, shape=list(y.shape), rel=_rel(y.cpu(), sum_ref),
                 finite=bool(torch.isfinite(y).all()), digest=_digest(y)),
        ]
    comm.barrier()
    from tandem.ops import tp

    tp.release_workspaces(comm)
    comm.destroy()
    return out


def main() -> int:
    out_dir = sys.argv[1]
    bootstrap = sys.argv[2] if len(sys.argv) > 2 else "env"
    rank = int(os.environ.get("RANK", "0"))
    faulthandler.enable()  # a crash prints every thread's Python stack
    hang = float(os.environ.get("TANDEM_RANK_DUMP_AFTER_S", "0"))
    if hang > 0:  # still running then: print every thread's stack (the test kills the job later)
        faulthandler.dump_traceback_later(hang, exit=False)
    try:
        result, code = run(bootstrap), 0
    except BaseException as e:  # report, don't hide: the test asserts on it
        result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(), "rank": rank}
        code = 1
    tmp = os.path.join(out_dir, f"{rank}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, os.path.join(out_dir, f"{rank}.json"))
    print(f"rank {rank}: {json.dumps(result)[:2000]}", flush=True)
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown, as tandem's own rank entry does: the driver releases CUDA state


if __name__ == "__main__":
    raise SystemExit(main())
