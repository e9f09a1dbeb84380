"""Ring attention's flow control, replayed on the CPU: W ranks run several launches of the kernel's protocol in
random interleavings, with the slot schedule the kernel uses (ring_schedule.h, through the bindings). Every
interleaving must finish (no deadlock), every step must compute on the block of rank (r - i) mod W of its own
launch, and no slot may be rewritten before its holder released it.

The rules replayed are the kernel's (kernels/src/attention/ring_flow.cuh):
  comm blocks, step i < W-1 in order: wait arrived[slot(i)] >= G(i) (i > 0) and released[slot(i+1)] >=
      previous_use(i+1) (set by the successor), write the successor's slot(i+1), set its arrived = G(i+1);
      then count themselves a party of step i
  work items (ITEMS of them a step, claimed by whichever attention block runs): item t of step i waits
      arrived[slot(i)] >= G(i) (i > 0) and its own step i - 1 (the merge flag), computes, counts a party of step
      i; different items advance independently, so one may be steps ahead of another
  the last party of step i (all items, and the comm blocks if i < W-1) sets released[slot(i)] = G(i) on the
  predecessor
  a launch begins on a rank when its previous launch ended there (stream order), after the staging copy into
  slot 0 when there are proxy peers
"""

import random

import pytest

from tests.conftest import native_kernels

ITEMS = 2  # work items a step on each rank (independent parties; the kernel has B * Hq * Q tiles)


def _schedule():
    K = native_kernels("ring_schedule_slot_of", "ring_schedule_previous_use")
    return K.ring_schedule_slot_of, K.ring_schedule_previous_use


class Rank:
    def __init__(self, world, slots):
        self.slots = [None] * slots          # content: (launch, step, source rank, released?)
        self.arrived = [0] * slots
        self.released = [0] * slots          # written by the successor
        self.launch = 0
        self.comm_step = 0
        self.item_step = [0] * ITEMS
        self.parties = {}


def replay(world, slots, launches, staged, seed, slot_of, previous_use):
    rng = random.Random(seed)
    ranks = [Rank(world, slots) for _ in range(world)]
    G = lambda e, i: e * world + i  # noqa: E731  (ring_schedule.h global_step)

    def start(r):
        rk = ranks[r]
        rk.launch += 1
        rk.comm_step = 0
        rk.item_step = [0] * ITEMS
        rk.parties = {}
        if staged:  # cudaMemcpyAsync of this rank's K/V into slot 0, stream-ordered before the kernel
            old = rk.slots[0]
            assert old is None or old[3], f"rank {r} staged over an unreleased slot 0 ({old})"
            rk.slots[0] = (rk.launch, 0, r, False)

    def party(r, i):
        rk, e = ranks[r], ranks[r].launch
        rk.parties[i] = rk.parties.get(i, 0) + 1
        need = ITEMS + (1 if i < world - 1 else 0)  # the items, and the comm blocks (as one party here)
        if rk.parties[i] == need:
            s = slot_of(i, slots)
            if rk.slots[s] is not None:
                c = rk.slots[s]
                rk.slots[s] = (c[0], c[1], c[2], True)
            pred = ranks[(r - 1) % world]
            pred.released[s] = max(pred.released[s], G(e, i))

    def block_of(r, i):  # what step i reads: the user's K/V at step 0 unless staged
        rk = ranks[r]
        if i == 0 and not staged:
            return (rk.launch, 0, r)
        c = rk.slots[slot_of(i, slots)]
        return None if c is None else c[:3]

    def enabled():
        ev = []
        for r, rk in enumerate(ranks):
            e = rk.launch
            if e == 0 or (rk.comm_step >= world - 1 and min(rk.item_step) >= world and
                          all(rk.parties.get(i, 0) == ITEMS + (1 if i < world - 1 else 0) for i in range(world))):
                if rk.launch < launches:
                    ev.append(("start", r))
                continue
            for j, i in enumerate(rk.item_step):
                if i < world and (i == 0 or rk.arrived[slot_of(i, slots)] >= G(e, i)):
                    ev.append(("compute", r, j))
            i = rk.comm_step
            if i < world - 1:
                s, nxt = slot_of(i, slots), slot_of(i + 1, slots)
                if (i == 0 or rk.arrived[s] >= G(e, i)) and rk.released[nxt] >= previous_use(e, world, slots, i + 1):
                    ev.append(("forward", r))
        return ev

    while True:
        ev = enabled()
        if not ev:
            break
        kind, r, *item = rng.choice(ev)
        rk = ranks[r]
        if kind == "start":
            start(r)
        elif kind == "compute":
            j = item[0]
            i = rk.item_step[j]
            got = block_of(r, i)
            assert got == (rk.launch, i, (r - i) % world), \
                f"rank {r} launch {rk.launch} item {j} step {i} computed on {got}"
            rk.item_step[j] += 1
            party(r, i)
        else:
            i = rk.comm_step
            succ = ranks[(r + 1) % world]
            blk = block_of(r, i)
            assert blk == (rk.launch, i, (r - i) % world), f"rank {r} forwards {blk} at step {i}"
            nxt = slot_of(i + 1, slots)
            old = succ.slots[nxt]
            assert old is None or old[3], \
                f"rank {r} launch {rk.launch} step {i}: overwrote rank {(r + 1) % world}'s unreleased slot {nxt} {old}"
            succ.slots[nxt] = (rk.launch, i + 1, blk[2], False)
            succ.arrived[nxt] = G(rk.launch, i + 1)
            rk.comm_step += 1
            party(r, i)
    for r, rk in enumerate(ranks):
        done = rk.launch == launches and min(rk.item_step) == world and rk.comm_step == world - 1
        assert done, f"deadlock: rank {r} at launch {rk.launch}, item steps {rk.item_step}, comm step " \
                     f"{rk.comm_step} (world {world}, slots {slots}, staged {staged}, seed {seed})"


@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("staged", [False, True])
def test_every_interleaving_finishes_and_reads_the_right_block(world, staged):
    slot_of, previous_use = _schedule()
    for slots in sorted({2, 3, world} & set(range(2, world + 1))):
        for seed in range(40):
            replay(world, slots, 4, staged, seed, slot_of, previous_use)


def test_the_replay_catches_a_schedule_that_releases_too_early():
    # A previous_use that lags by one launch lets a rank overwrite a slot its successor still needs: the replay
    # must see it (this test fails if the checks above could not fail).
    slot_of, previous_use = _schedule()

    def too_early(epoch, world, slots, step):
        return previous_use(max(epoch - 1, 1), world, slots, step) if epoch > 1 else 0

    with pytest.raises(AssertionError):
        for seed in range(200):
            replay(3, 2, 4, False, seed, slot_of, too_early)
