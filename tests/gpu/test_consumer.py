"""The worked examples (tests/consumer/allgather_epilogue.cu on the device API alone, allgather_epilogue_roles.cu on
the persistent-kernel runtime), built against the installed package, run at world 1, 2 and 4 and match their CPU
reference on every element of every launch."""

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def consumer_exe(tmp_path_factory):
    from tests.consumer_build import build_consumer

    return build_consumer(str(tmp_path_factory.mktemp("consumer")))


@pytest.mark.parametrize("example", ["allgather_epilogue", "allgather_epilogue_roles"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_allgather_epilogue_worked_example(consumer_exe, mps_session, world, example, tmp_path):
    # allgather_epilogue: the device API alone; allgather_epilogue_roles: the same op on the persistent-kernel
    # runtime (roles over the grid, epochs on the device; it also checks the control block's epoch at the end)
    exe = os.path.join(os.path.dirname(consumer_exe), example)
    logs = [tmp_path / f"r{r}.log" for r in range(world)]
    cmd = [sys.executable, "-m", "tandem.launch", "-n", str(world), "--timeout", "180", "--",
           "sh", "-c", f'exec "{exe}" 1000003 12 > "{tmp_path}/r$RANK.log" 2>&1']
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = "".join(open(p).read() for p in logs if os.path.exists(p))
    assert r.returncode == 0, out + r.stderr
    lines = re.findall(example + r": rank (\d+) world (\d+) .* wrong (\d+)", out)
    assert sorted(int(x[0]) for x in lines) == list(range(world)), out
    assert all(int(x[1]) == world and int(x[2]) == 0 for x in lines), out
