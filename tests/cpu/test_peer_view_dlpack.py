"""Peer views go to torch through DLPack (tandem.transport.Communicator.peer_view): the capsule names this rank's
device, so torch takes the mapping as is instead of inferring the peer's GPU from the address and copying.
The GPU side (the view aliases the mapping; writes land at the peer) is tests/gpu/test_transport.py; here, the
capsule's ownership: it holds the owner while unconsumed and lets it go when dropped."""

from __future__ import annotations

import gc
import sys

import pytest

from tandem._native import available, native

pytestmark = pytest.mark.skipif(not available(), reason="tandem._C not built")


class Owner:
    pass


def test_an_unconsumed_capsule_holds_its_owner_and_releases_it():
    o = Owner()
    base = sys.getrefcount(o)
    cap = native()._dlpack_bytes(0x10000, 4096, 0, o)
    assert sys.getrefcount(o) == base + 1
    assert "dltensor" in repr(cap)
    del cap
    gc.collect()
    assert sys.getrefcount(o) == base
