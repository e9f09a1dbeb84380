"""The worked example (tests/consumer/allgather_epilogue.cu), built against the installed package, runs at
world 1, 2 and 4 and matches its CPU reference on every element of every launch."""

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


@pytest.mark.parametrize("world", [1, 2, 4])
def test_allgather_epilogue_worked_example(consumer_exe, mps_session, world, tmp_path):
    logs = [tmp_path / f"r{r}.log" for r in range(world)]
    cmd = [sys.executable, "-m", "tandem.launch", "-n", str(world), "--timeout", "180", "--",
           "sh", "-c", f'exec "{consumer_exe}" 1000003 12 > "{tmp_path}/r$RANK.log" 2>&1']
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = "".join(open(p).read() for p in logs if os.path.exists(p))
    assert r.returncode == 0, out + r.stderr
    lines = re.findall(r"allgather_epilogue: rank (\d+) world (\d+) .* wrong (\d+)", out)
    assert sorted(int(x[0]) for x in lines) == list(range(world)), out
    assert all(int(x[1]) == world and int(x[2]) == 0 for x in lines), out
