"""Child entry of tandem.launch.run_function: run module:function(**args), write the result as JSON."""

import faulthandler
import importlib
import json
import os
import signal
import sys
import traceback


def main():
    target, args, out_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    mod_name, fn_name = target.split(":")
    rank = int(os.environ.get("RANK", "0"))
    faulthandler.enable()  # a crash prints the Python stack of every thread to stderr
    # The launcher stops ranks with SIGTERM (a failed peer, its timeout, a signal to the launcher): say where this
    # one was, then die of the signal as before (chain=True re-raises it with the default action).
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    hang = float(os.environ.get("TANDEM_RANK_DUMP_AFTER_S", "0"))
    if hang > 0:  # a rank still running then prints every thread's stack (the launcher kills it later)
        faulthandler.dump_traceback_later(hang, exit=False)
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
