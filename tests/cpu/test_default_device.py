"""Which GPU a Communicator made without `device` takes (tandem.transport.default_device): the launchers' local
rank variables, so that ranks of one host under torchrun, mpirun or srun do not all land on GPU 0."""

from __future__ import annotations

import pytest

transport = pytest.importorskip("tandem.transport")


@pytest.mark.parametrize("variable", ["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"])
def test_each_launchers_local_rank_picks_the_device(variable):
    assert transport.default_device(8, 0, {variable: "5"}) == 5
    assert transport.default_device(4, 0, {variable: "5"}) == 1  # modulo the visible devices


def test_order_of_precedence():
    env = {"TANDEM_DEVICE": "3", "LOCAL_RANK": "1", "SLURM_LOCALID": "2"}
    assert transport.default_device(8, 0, env) == 3
    del env["TANDEM_DEVICE"]
    assert transport.default_device(8, 0, env) == 1  # torchrun's LOCAL_RANK before Slurm's
    assert transport.default_device(8, 7, {}) == 7  # nothing exported: the current device
    assert transport.default_device(8, 7, {"LOCAL_RANK": ""}) == 7
