"""bench tp's synchronized naive pipeline: its stream barrier signals this rank's slot on every peer and waits for
every peer's slot, all against one epoch counter (CPU: a fake kernel layer records the launches)."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
tp_bench = pytest.importorskip("tandem.bench.tp")


def test_stream_barrier_signals_own_slot_and_waits_for_every_peer(monkeypatch):
    calls = []
    kernels = types.SimpleNamespace(
        stream_advance=lambda counter, s: calls.append(("advance", counter)),
        stream_signal=lambda comm, flag, peers, counter, off, s: calls.append(("signal", flag, tuple(peers), counter,
                                                                               off)),
        stream_wait=lambda comm, flags, writers, counter, off, s: calls.append(("wait", tuple(flags), tuple(writers),
                                                                             counter, off)))
    import tandem._native as nat

    monkeypatch.setattr(nat, "native", lambda: types.SimpleNamespace(kernels=kernels))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: types.SimpleNamespace(cuda_stream=7))
    ws = torch.zeros(8 * 5, dtype=torch.uint8)
    comm = types.SimpleNamespace(world_size=4, rank=2, native=object(), barrier=lambda: None,
                                 zeros=lambda n, dtype: ws[:n])
    run, keep = tp_bench.stream_barrier(comm)
    assert keep.numel() == 8 * 5
    run()
    base = ws.data_ptr()
    assert calls == [("advance", base), ("signal", base + 8 * 3, (0, 1, 3), base, 0),
                     ("wait", (base + 8, base + 16, base + 32), (0, 1, 3), base, 0)]
    # a failed launch is an error, not a silent unsynchronized baseline: the typed bindings raise, and the
    # barrier lets it through
    from tandem.errors import TandemError

    def failed(*a):
        raise TandemError("tandem: rank 2: stream_wait: launch failed: test", 5, "stream_wait", 2)

    kernels.stream_wait = failed
    with pytest.raises(TandemError, match="stream_wait: launch failed"):
        run()
