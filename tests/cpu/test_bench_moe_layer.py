"""bench moe --layer's torch reference (tandem.bench.moe.TorchMoeLayer): the routed rows, counts, pulls and
write-backs of a simulated world of threads (CPU tensors standing in for the symmetric heap and its peer views),
against the layer on one device with every expert (tandem.ops.moe_layer.reference)."""

import threading
import time

import pytest
import torch

from tandem.bench import moe as bench_moe
from tandem.ops import moe_layer


class _Heap:
    def __init__(self):
        self.tensors = {}
        self.lock = threading.Lock()


class _FakeComm:
    def __init__(self, heap, world, rank):
        self.heap, self.world_size, self.rank, self.n = heap, world, rank, 0
        self.ids = {}

    def empty(self, shape, dtype, **kw):
        t = torch.empty(shape, dtype=dtype)
        with self.heap.lock:
            self.heap.tensors[(self.n, self.rank)] = t
        self.ids[t.data_ptr()] = self.n
        self.n += 1
        return t

    def peer_view(self, t, q):
        key = (self.ids[t.data_ptr()], q)
        deadline = time.monotonic() + 30
        while key not in self.heap.tensors:  # the peer allocates its copy in the same order
            assert time.monotonic() < deadline, key
            time.sleep(0.001)
        return self.heap.tensors[key]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_torch_reference_is_the_layer(world, monkeypatch):
    hidden, inter, epr, k = 16, 8, 2, 2
    experts = epr * world
    torch.manual_seed(world)
    w1_all = (torch.randn(experts, hidden, 2 * inter) / 4).to(torch.bfloat16)
    w2_all = (torch.randn(experts, inter, hidden) / 3).to(torch.bfloat16)
    counts = [5, 0, 7][:world] if world > 1 else [6]
    xs = [torch.randn(c, hidden).to(torch.bfloat16) for c in counts]
    ids = [torch.stack([torch.randperm(experts)[:k] for _ in range(c)]) if c else torch.zeros(0, k, dtype=torch.long)
           for c in counts]
    wts = [torch.rand(c, k) for c in counts]
    barrier = threading.Barrier(world, timeout=60)
    monkeypatch.setattr("tandem.bench.tp.stream_barrier", lambda comm: (barrier.wait, None))
    heap, out, errors = _Heap(), [None] * world, []

    def body(r):
        try:
            comm = _FakeComm(heap, world, r)
            # every rank sizes its buffers for the largest token count, as the bench's max_tokens does
            layer = bench_moe.TorchMoeLayer(comm, max(counts), hidden, k, epr)
            out[r] = layer(xs[r], ids[r].to(torch.int32), wts[r], w1_all[r * epr:(r + 1) * epr],
                           w2_all[r * epr:(r + 1) * epr])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append((r, e))
            barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for r in range(world):
        want = moe_layer.reference(xs[r], ids[r], wts[r], w1_all, w2_all)
        assert out[r].shape == want.shape
        if counts[r]:
            err = float((out[r].float() - want).norm() / want.norm())
            assert err < 2e-2, (r, err)
