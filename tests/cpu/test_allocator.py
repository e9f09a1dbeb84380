"""The symmetric heap's range allocator (pure host logic, bound from C++)."""

import random

import pytest

from tandem._native import available

pytestmark = pytest.mark.skipif(not available(), reason="tandem._C not built")


def _alloc():
    from tandem._native import native

    return native().RangeAllocator


def test_alignment_and_no_overlap():
    A = _alloc()(1024, 1 << 20)
    ranges = []
    for size, align in [(1, 16), (100, 256), (4097, 4096), (3, 128), (65536, 65536)]:
        off = A.allocate(size, align)
        assert off is not None and off % align == 0 and off >= 1024
        ranges.append((off, off + size))
    ranges.sort()
    for (a0, a1), (b0, b1) in zip(ranges, ranges[1:]):
        assert a1 <= b0


def test_exhaustion_returns_none_and_free_coalesces():
    A = _alloc()(0, 4096)
    offs = [A.allocate(1024, 16) for _ in range(4)]
    assert offs == [0, 1024, 2048, 3072]
    assert A.allocate(1, 16) is None
    assert A.release(1024) and A.release(2048)
    assert A.largest_free == 2048  # the two middle ranges merged
    assert A.allocate(2048, 16) == 1024
    assert not A.release(999)  # not a live allocation
    assert A.live_allocations == 3


def test_same_sequence_gives_same_offsets_and_free_order_does_not_matter():
    # Symmetry: every rank replays the same calls; only the live set matters, not the order of frees.
    rng = random.Random(7)
    ops = []
    live = []
    for _ in range(400):
        if live and rng.random() < 0.4:
            ops.append(("free", live.pop(rng.randrange(len(live)))))
        else:
            ops.append(("alloc", len(ops), rng.choice([16, 100, 4096, 70000]), rng.choice([16, 256, 4096])))
            live.append(len(ops) - 1)

    def replay(shuffle_frees: bool):
        A = _alloc()(256, 64 << 20)
        ids = {}
        out = []
        pending = []
        for op in ops:
            if op[0] == "alloc":
                for f in (sorted(pending, reverse=True) if shuffle_frees else pending):
                    assert A.release(ids[f])
                pending = []
                off = A.allocate(op[2], op[3])
                ids[op[1]] = off
                out.append(off)
            else:
                pending.append(op[1])
        return out

    assert replay(False) == replay(True)


def test_bytes_in_use_accounts_padding():
    A = _alloc()(0, 1 << 20)
    a = A.allocate(10, 16)
    b = A.allocate(10, 4096)
    assert (a, b) == (0, 4096)
    assert A.bytes_in_use == 10 + (4096 - 10) + 10  # b's alignment padding counts as used
    A.release(a)
    A.release(b)
    assert A.bytes_in_use == 0 and A.largest_free == 1 << 20
