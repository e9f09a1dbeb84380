"""Child entry of tandem.launch.run_function: run module:function(**args), write the result as JSON."""

import importlib
import json
import os
import sys
import traceback


def main():
    target, args, out_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    mod_name, fn_name = target.split(":")
    rank = int(os.environ.get("RANK", "0"))
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
        result = fn(**args)
        code = 0
    except BaseException as e:  # report, don't hide: the parent asserts on it
        result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(),
                  "status": getattr(e, "status", None), "op": getattr(e, "op", None),
                  "peer": getattr(e, "peer", None), "rank": getattr(e, "rank", None)}
        code = 1
    tmp = os.path.join(out_dir, f"{rank}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, os.path.join(out_dir, f"{rank}.json"))
    sys.stdout.flush()
    os._exit(code)  # skip interpreter teardown: CUDA state is released by the driver


if __name__ == "__main__":
    main()
