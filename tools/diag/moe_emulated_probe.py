"""Why tests/gpu/test_moe.py::test_moe_across_emulated_nodes stalls (2 emulated nodes x 2 ranks, counts 21/40/0/33):
the same worker, once with lazy CUDA module loading (the default) and once with CUDA_MODULE_LOADING=EAGER, each
rank dumping its Python stacks after 20 s. Lazy-only stalls point at a first kernel launch (a module load) behind
a kernel that waits for proxy traffic (docs/moe.md, tandem.ops._runtime.preload).

    python tools/diag/moe_emulated_probe.py        (on the H200, MPS started by the launcher)
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tandem.launch import run_function  # noqa: E402

for loading in ("LAZY", "EAGER"):
    env = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "TANDEM_RANK_DUMP_AFTER_S": "20",
           "CUDA_MODULE_LOADING": loading}
    try:
        res, launched = run_function("tests.gpu.workers_moe:correctness", 4,
                                     dict(counts=[21, 40, 0, 33], hidden=128, inter=256, epr=2,
                                          cases=[["uniform", 2], ["skewed", 2]]),
                                     ranks_per_node=2, env=env, timeout_s=60, on_failure="kill", grace_s=5)
        print(f"== {loading}: exit codes {launched.returncodes}")
        for r, x in enumerate(res):
            if x is None or (isinstance(x, dict) and "error" in x):
                print(f"  rank {r}: {x if x is None else x.get('error', '')[:300]}")
            else:
                print(f"  rank {r}: ok, wrong={[ (c['wrong_y'], c['wrong_layout'], c['wrong_out']) for c in x]}")
    except Exception as e:  # noqa: BLE001
        print(f"== {loading}: {type(e).__name__}: {str(e)[:300]}")
    sys.stdout.flush()
