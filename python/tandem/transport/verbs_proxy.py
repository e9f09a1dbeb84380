"""The verbs proxy: drains a command queue into RDMA work requests and retires tickets from completions.

Why this loop is Python: pyverbs owns the QPs and exposes no raw handles, so whoever creates a QP must post to
it (docs/transports.md). What to post is decided in C++ (tandem._C.verbs.WrPlanner); this module only moves
commands from the queue to the planner, batches from the planner to the driver, and completions back.

    CommandQueue --peek--> WrPlanner.add --take--> Driver.post ... Driver.poll --> WrPlanner.complete
                                                                        |
                                           retired watermark <----------+  (tickets may complete out of
                                                                             order across QPs: a window)

Drivers:
  * PyverbsDriver: the real one (RC QPs on the NIC nearest the GPU; heap registered through dmabuf or
    nvidia-peermem). It has never run here: no RDMA NIC exists on the machines this was built on.
  * LoopbackDriver: applies WRs to in-process memory with RC semantics (a QP's WRs take effect in post
    order; completions in order per QP, only for signaled WRs; errors injectable). It exercises this loop and
    the planner end to end on CPU.

Failure handling: a completion with an error status, a post that raises, or no completion progress for
`timeout_s` while WRs are outstanding stops the proxy. It records a TandemError naming rank, op ("verbs.post",
"verbs.completion" or "verbs.progress") and peer, fails the queue (producers and quiet raise kAborted naming
the peer) and calls `on_error` (the communicator raises its abort flag there).
"""

from __future__ import annotations

import threading
import time

from ..errors import ABORTED, TIMEOUT, TandemError

SYSTEM_ERROR = 6


def wr_peer(wr_id: int) -> int:
    """The peer a planner WR id belongs to (verbs_plan.h: peer << 40 | qp << 32 | sequence)."""
    return int(wr_id) >> 40


class VerbsProxy:
    """One proxy thread over one command queue."""

    def __init__(self, queue, planner, driver, *, rank: int, timeout_s: float = 10.0, poll_batch: int = 64,
                 max_drain: int = 256, on_error=None):
        self.queue = queue
        self.planner = planner
        self.driver = driver
        self.rank = int(rank)
        self.timeout_s = float(timeout_s)
        self.poll_batch = int(poll_batch)
        self.max_drain = int(max_drain)
        self.on_error = on_error
        self.error: TandemError | None = None
        self._head = 0          # next ticket to take from the queue
        self._retired = 0       # every ticket below is complete at its destination
        self._done = set()      # completed tickets at or above the watermark
        self._in_flight = {}    # ticket -> peer (to name the peer of a stall)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.posted_wrs = 0
        self.posts = 0

    # -- lifecycle -----------------------------------------------------------------------------------------------
    def start(self):
        self._thread = threading.Thread(target=self._run, name=f"tandem-verbs-proxy-{self.rank}", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)
            self._thread = None

    def check(self):
        """Raise the proxy's failure, if it stopped on one."""
        if self.error is not None:
            raise self.error

    @property
    def retired(self) -> int:
        return self._retired

    # -- the loop --------------------------------------------------------------------------------------------------
    def _run(self):
        last_progress = time.monotonic()
        try:
            while not self._stop.is_set():
                took = self._drain()
                # With nothing more published right now, flush partial batches: latency beats batch size.
                batches = self.planner.take(flush=took < self.max_drain)
                for b in batches:
                    self._post(b)
                completed = self._poll()
                if took or batches or completed:
                    last_progress = time.monotonic()
                elif self._in_flight and time.monotonic() - last_progress > self.timeout_s:
                    peer = min(self._in_flight.items())[1]
                    raise TandemError(
                        f"tandem: verbs.progress: rank {self.rank}: no completion for {self.timeout_s:.1f} s with "
                        f"{len(self._in_flight)} command(s) in flight (oldest to peer {peer}; link down or peer "
                        "gone)", TIMEOUT, "verbs.progress", self.rank, peer)
                else:
                    time.sleep(0 if self._in_flight else 20e-6)
        except TandemError as e:
            self._fail(e)
        except Exception as e:  # noqa: BLE001 - anything else is a proxy failure too, reported the same way
            self._fail(TandemError(f"tandem: verbs.proxy: rank {self.rank}: {e!r}", SYSTEM_ERROR, "verbs.proxy",
                                   self.rank, -1))

    def _drain(self) -> int:
        took = 0
        while took < self.max_drain:
            cmd = self.queue.peek(self._head)
            if cmd is None:
                break
            self.planner.add(cmd, self._head)  # the planner copies what it needs: the slot may be reused now
            self._in_flight[self._head] = cmd["peer"]
            self._head += 1
            took += 1
        if took:
            self.queue.release_until(self._head)
        return took

    def _post(self, batch):
        try:
            self.driver.post(batch["peer"], batch["qp"], batch["wrs"])
        except TandemError:
            raise
        except Exception as e:  # noqa: BLE001 - pyverbs raises PyverbsRDMAError
            raise TandemError(f"tandem: verbs.post: rank {self.rank}: posting {len(batch['wrs'])} WR(s) to peer "
                              f"{batch['peer']} (QP {batch['qp']}) failed: {e}", SYSTEM_ERROR, "verbs.post",
                              self.rank, batch["peer"]) from e
        self.posts += 1
        self.posted_wrs += len(batch["wrs"])

    def _poll(self) -> int:
        completions = self.driver.poll(self.poll_batch)
        for wr_id, status, detail in completions:
            peer = wr_peer(wr_id)
            if status != 0:
                raise TandemError(f"tandem: verbs.completion: rank {self.rank}: WR to peer {peer} completed with "
                                  f"status {status} ({detail})", SYSTEM_ERROR, "verbs.completion", self.rank, peer)
            for t in self.planner.complete(wr_id):
                self._in_flight.pop(t, None)
                self._done.add(t)
        if completions:
            advanced = self._retired
            while advanced in self._done:
                self._done.remove(advanced)
                advanced += 1
            if advanced != self._retired:
                self._retired = advanced
                self.queue.retire_until(advanced)
        return len(completions)

    def _fail(self, err: TandemError):
        self.error = err
        try:
            self.queue.fail(ABORTED if err.status == ABORTED else err.status, err.peer)
        finally:
            if self.on_error is not None:
                self.on_error(err)


class LoopbackDriver:
    """In-process stand-in for a NIC with RC semantics, for CPU tests of the proxy loop.

    `local` is this rank's registered memory (a bytearray at address `local_base`); `remotes` maps peer ->
    (bytearray, base address). WRITEs copy bytes, inline WRITEs store the 8-byte value, FETCH_ADDs add to the
    remote word and return the old value into the local scratch word. A QP's WRs take effect in post order and
    complete in order; only signaled WRs produce completions. `delay_polls` holds completions back for that
    many polls (so the proxy sees WRs in flight), `fail_after` makes the n-th WR complete with an error, and
    `drop_peer` stops completing anything for that peer (a dead link).
    """

    WC_SUCCESS = 0
    WC_REM_ACCESS_ERR = 10  # IBV_WC_REM_ACCESS_ERR

    def __init__(self, local: bytearray, local_base: int, remotes: dict, *, delay_polls: int = 0,
                 fail_after: int | None = None, drop_peer: int | None = None, reorder_qps: bool = False):
        self.local, self.local_base = local, local_base
        self.remotes = remotes
        self.delay_polls = delay_polls
        self.fail_after = fail_after
        self.drop_peer = drop_peer
        self.reorder_qps = reorder_qps
        self._pending = {}  # (peer, qp) -> [[polls_left, wr_id, status, detail]]
        self.executed = 0
        self.log = []       # (peer, qp, opcode) in execution order

    def _mem(self, peer, addr, n):
        buf, base = self.remotes[peer]
        off = addr - base
        if off < 0 or off + n > len(buf):
            return None, 0
        return buf, off

    def post(self, peer, qp, wrs):
        for w in wrs:
            status, detail = self.WC_SUCCESS, "success"
            if self.fail_after is not None and self.executed >= self.fail_after:
                status, detail = self.WC_REM_ACCESS_ERR, "remote access error (injected)"
            elif w["opcode"] == "write":
                buf, off = self._mem(peer, w["remote_addr"], w["length"])
                src = w["local_addr"] - self.local_base
                if buf is None or src < 0 or src + w["length"] > len(self.local):
                    status, detail = self.WC_REM_ACCESS_ERR, "address outside the registered region"
                else:
                    buf[off:off + w["length"]] = self.local[src:src + w["length"]]
            elif w["opcode"] == "write_inline":
                buf, off = self._mem(peer, w["remote_addr"], 8)
                if buf is None:
                    status, detail = self.WC_REM_ACCESS_ERR, "flag outside the registered region"
                else:
                    buf[off:off + 8] = int(w["value"]).to_bytes(8, "little")
            elif w["opcode"] == "atomic_fetch_add":
                buf, off = self._mem(peer, w["remote_addr"], 8)
                if buf is None:
                    status, detail = self.WC_REM_ACCESS_ERR, "flag outside the registered region"
                else:
                    old = int.from_bytes(buf[off:off + 8], "little")
                    buf[off:off + 8] = ((old + int(w["value"])) % (1 << 64)).to_bytes(8, "little")
                    s = w["local_addr"] - self.local_base
                    self.local[s:s + 8] = old.to_bytes(8, "little")
            self.executed += 1
            self.log.append((peer, qp, w["opcode"]))
            if w["signaled"] or status != self.WC_SUCCESS:
                self._pending.setdefault((peer, qp), []).append([self.delay_polls, w["wr_id"], status, detail])

    def poll(self, max_entries):
        out = []
        keys = sorted(self._pending, reverse=self.reorder_qps)  # reorder_qps: QPs complete in another order
        for key in keys:
            if key[0] == self.drop_peer:
                continue
            q = self._pending[key]
            while q and len(out) < max_entries:
                if q[0][0] > 0:
                    for e in q:
                        e[0] -= 1
                    break
                _, wr_id, status, detail = q.pop(0)
                out.append((wr_id, status, detail))
        return out


class PyverbsDriver:
    """RC QPs through pyverbs: the real driver. Never run here (no RDMA NIC on these machines).

    Setup (collective over the bootstrap store, every rank of the inter-node group):
      1. NIC, port and GID nearest the GPU (verbs.choose_device), Context, PD, one CQ.
      2. Register the heap: Mlx5DmaBufMR over a dmabuf fd of the heap (cuMemGetHandleForAddressRange;
         tandem._C.transport.export_dmabuf), else MR(pd, length, access, address=heap) through nvidia-peermem.
         An 8-byte scratch MR receives FETCH_ADD results.
      3. qps_per_peer RC QPs per remote peer (max_inline_data >= 8 for the flag write), INIT.
      4. Publish {qpns, lid, gid, psn, heap address, rkey} under `<tag>/verbs/<rank>`, read the peers'.
      5. RTR (path MTU from the port, dest QPN/PSN, AH with the peer's GID) then RTS.
    """

    def __init__(self, *, store, rank: int, peers: list, heap_ptr: int, heap_bytes: int, dmabuf_fd: int | None,
                 cuda_device: int = 0, qps_per_peer: int = 4, sq_depth: int = 2048, tag: str = "tandem",
                 timeout_s: float = 60.0):
        from . import verbs

        verbs.require_pyverbs()
        import json

        import pyverbs.enums as e
        from pyverbs.addr import AHAttr, GlobalRoute
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        self._e = e
        self.heap_ptr = int(heap_ptr)
        nic, port, gid_index = verbs.choose_device(cuda_device)
        self.nic, self.port, self.gid_index = nic, port, gid_index
        self.ctx = Context(name=nic.name)
        self.pd = PD(self.ctx)
        n_qps = qps_per_peer * len(peers)
        self.cq = CQ(self.ctx, max(64, n_qps * sq_depth // 8))
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_ATOMIC
        self.heap_mr = None
        errors = []
        if dmabuf_fd is not None:
            try:
                from pyverbs.providers.mlx5.mlx5_dmabuf import Mlx5DmaBufMR

                self.heap_mr = Mlx5DmaBufMR(self.pd, 0, heap_bytes, iova=heap_ptr, fd=dmabuf_fd, access=access)
                self.registration = "dmabuf"
            except Exception as ex:  # noqa: BLE001 - fall through to peermem
                errors.append(f"dmabuf: {ex}")
        if self.heap_mr is None:
            try:
                self.heap_mr = MR(self.pd, heap_bytes, access, address=heap_ptr)
                self.registration = "peermem"
            except Exception as ex:  # noqa: BLE001
                errors.append(f"peermem: {ex}")
                raise TandemError(f"tandem: verbs.register: rank {rank}: could not register the GPU heap "
                                  f"({'; '.join(errors)}); needs a dmabuf-capable NIC driver or nvidia-peermem",
                                  9, "verbs.register", rank, -1) from ex
        self.scratch_mr = MR(self.pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
        port_attr = self.ctx.query_port(port)
        gid = self.ctx.query_gid(port, gid_index)
        cap = QPCap(max_send_wr=sq_depth, max_recv_wr=1, max_send_sge=1, max_recv_sge=1, max_inline_data=64)
        self.qps = {}
        for p in peers:
            for q in range(qps_per_peer):
                init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0)
                qp = QP(self.pd, init)
                attr = QPAttr(port_num=port)
                attr.qp_access_flags = access
                qp.to_init(attr)
                self.qps[(p, q)] = qp
        mine = dict(lid=port_attr.lid, gid=str(gid), addr=heap_ptr, rkey=self.heap_mr.rkey, bytes=heap_bytes,
                    mtu=int(port_attr.active_mtu),
                    qpn={f"{p}/{q}": qp.qp_num for (p, q), qp in self.qps.items()})
        store.set(f"{tag}/verbs/{rank}", json.dumps(mine))
        self.remote = {}
        for p in peers:
            store.wait([f"{tag}/verbs/{p}"], __import__("datetime").timedelta(seconds=timeout_s))
            self.remote[p] = json.loads(store.get(f"{tag}/verbs/{p}"))
        from pyverbs.addr import GID

        for (p, q), qp in self.qps.items():
            r = self.remote[p]
            attr = QPAttr(port_num=port)
            attr.path_mtu = min(int(port_attr.active_mtu), int(r["mtu"]))
            attr.dest_qp_num = int(r["qpn"][f"{rank}/{q}"])
            attr.rq_psn = 0
            attr.max_dest_rd_atomic = 1
            attr.min_rnr_timer = 12
            gr = GlobalRoute(dgid=GID(r["gid"]), sgid_index=gid_index)
            attr.ah_attr = AHAttr(port_num=port, is_global=1, gr=gr, dlid=int(r["lid"]))
            qp.to_rtr(attr)
            attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.sq_psn, attr.max_rd_atomic = 14, 7, 7, 0, 1
            qp.to_rts(attr)

    def planner_regions(self):
        """(local, peers) dicts for verbs.planner."""
        # The heap's base is the MR's address (peermem) or iova (dmabuf): heap_ptr either way.
        local = dict(base=self.heap_ptr, lkey=self.heap_mr.lkey, bytes=self.heap_mr.length, scratch_addr=self.scratch_mr.buf, scratch_lkey=self.scratch_mr.lkey)
        peers = {p: dict(base=int(r["addr"]), rkey=int(r["rkey"]), bytes=int(r["bytes"]))
                 for p, r in self.remote.items()}
        return local, peers

    def post(self, peer, qp, wrs):
        from pyverbs.wr import SGE, SendWR

        e = self._e
        ops = {"write": e.IBV_WR_RDMA_WRITE, "write_inline": e.IBV_WR_RDMA_WRITE,
               "atomic_fetch_add": e.IBV_WR_ATOMIC_FETCH_AND_ADD}
        for w in wrs:  # pyverbs posts one SendWR per call; the planner's batch bounds the calls per wake-up
            flags = e.IBV_SEND_SIGNALED if w["signaled"] else 0
            if w["fence"]:
                flags |= e.IBV_SEND_FENCE
            if w["opcode"] == "write_inline":
                # the value travels inline: pyverbs copies an SGE's bytes for IBV_SEND_INLINE from the MR
                self.scratch_mr.write(int(w["value"]).to_bytes(8, "little"), 8, 8)
                sge = SGE(self.scratch_mr.buf + 8, 8, self.scratch_mr.lkey)
                flags |= e.IBV_SEND_INLINE
            else:
                sge = SGE(w["local_addr"], w["length"], w["lkey"])
            wr = SendWR(wr_id=w["wr_id"], opcode=ops[w["opcode"]], num_sge=1 if w["length"] else 0, sg=[sge],
                        send_flags=flags)
            if w["opcode"] == "atomic_fetch_add":
                wr.set_wr_atomic(rkey=w["rkey"], addr=w["remote_addr"], compare_add=int(w["value"]), swap=0)
            else:
                wr.set_wr_rdma(rkey=w["rkey"], addr=w["remote_addr"])
            self.qps[(peer, qp)].post_send(wr)

    def poll(self, max_entries):
        n, wcs = self.cq.poll(num_entries=max_entries)
        return [(wc.wr_id, int(wc.status), f"vendor_err {wc.vendor_err}") for wc in wcs[:n]]
