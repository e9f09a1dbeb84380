"""Communicator(inter_node=...): a bad value, or the verbs backend without pyverbs or without an RDMA NIC, is a
clear TandemError raised before any collective setup (so on this CPU machine before the missing GPU matters)."""

import pytest

from tandem.errors import UNSUPPORTED, TandemError
from tandem.transport import Communicator


def test_unknown_inter_node_backend_is_rejected():
    with pytest.raises(TandemError) as ei:
        Communicator(inter_node="udp")
    assert ei.value.op == "communicator.init" and "inter_node" in str(ei.value)


def test_verbs_without_pyverbs_or_nic_is_a_clear_error():
    with pytest.raises(TandemError) as ei:
        Communicator(inter_node="verbs")
    # no pyverbs here: verbs.import; with pyverbs but no device: verbs.discover / verbs.select
    assert ei.value.status == UNSUPPORTED, ei.value
    assert ei.value.op in ("verbs.import", "verbs.discover", "verbs.select"), ei.value
    assert "TCP" in str(ei.value) or "RDMA" in str(ei.value)
