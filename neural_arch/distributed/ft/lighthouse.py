"""The lighthouse: one small coordinator that decides each step's quorum (torchft's ``Lighthouse``).

It hosts a :class:`~neural_arch.distributed.rendezvous.tcp_store.TCPStore` and runs one thread:
replicas (their :class:`~neural_arch.distributed.ft.manager.Manager`) register, heartbeat and ask
for a quorum through store keys (:mod:`~neural_arch.distributed.ft.protocol`); the thread reads
them, applies :func:`~neural_arch.distributed.ft.quorum.plan_quorum` and writes one answer per
member. Start it where the job is launched (the launcher's process, or a process of its own):
it must outlive every replica, and it holds no training state, so it is cheap to keep up.

Liveness is by heartbeat: a member whose counter stops moving for ``heartbeat_timeout`` seconds
is dead (a SIGKILLed replica); a member that still beats but does not ask for ``join_timeout``
seconds while the others wait is left out of that quorum (a replica hung in user code).

As a process of its own (torchft's ``torchft_lighthouse``), beside one launcher per replica group
(``examples/ft_train.py``): it prints ``ft lighthouse listening on HOST:PORT``, then one line
``quorum {json}`` per quorum it issues, and runs until SIGINT/SIGTERM. The store's token is
``NEURAL_ARCH_FT_AUTH_TOKEN`` when set (then every replica needs the same), else the loopback
per-user secret::

    python -m neural_arch.distributed.ft.lighthouse --min_replicas 2 --port 29510

Example::

    from neural_arch.distributed.ft import Lighthouse, Manager

    with Lighthouse(min_replicas=2, port=29510) as lighthouse:     # launcher side
        ...                                                         # start replicas with
                                                                    # Manager(lighthouse_addr=lighthouse.address)
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time

from neural_arch import config
from neural_arch.distributed.ft import protocol
from neural_arch.distributed.ft.quorum import Quorum, QuorumRequest, plan_quorum
from neural_arch.distributed.rendezvous.tcp_store import TCPStore

__all__ = ["Lighthouse"]

KEEP_ROUNDS = 16  # rounds whose keys stay in the store (older ones are deleted)

log = logging.getLogger("neural_arch.distributed.ft")


class Lighthouse:
    """Decides the quorum of every step from the replicas' requests and heartbeats.

    Args:
        min_replicas: the smallest quorum (a step never runs with fewer replicas).
        host, port: where its store listens (``port=0``: a free one; read ``address``).
        join_timeout: seconds to wait for a healthy replica that did not ask before going on without it.
        heartbeat_timeout: seconds without a heartbeat after which a replica counts as dead.
        poll_interval: seconds between the thread's looks at the store (it reads its own dictionary:
            no network round trip).
        auth_token: the store's token (None: loopback, per-user secret; see docs/security.md).

    ``quorums`` keeps every quorum issued, in order (the record a test or a notebook reads).

    Example::

        lighthouse = Lighthouse(min_replicas=1, port=0).start()
        print(lighthouse.address)          # "127.0.0.1:41523": give it to every Manager
        ...
        lighthouse.stop()
    """

    def __init__(self, min_replicas: int = 1, host: str = "127.0.0.1", port: int = 0, join_timeout: float = 1.0,
                 heartbeat_timeout: float = 1.0, poll_interval: float = 0.001, auth_token=None):
        if min_replicas < 1:
            raise ValueError(f"Lighthouse(min_replicas={min_replicas}): a quorum needs at least 1 replica")
        self.min_replicas, self.join_timeout = int(min_replicas), float(join_timeout)
        self.heartbeat_timeout, self.poll_interval = float(heartbeat_timeout), float(poll_interval)
        self.store = TCPStore(host, port, is_master=True, timeout=30.0, auth_token=auth_token)
        self.host, self.port = host, self.store.port
        self.quorums: list[Quorum] = []
        self._members: list[str] = []
        self._beats: dict[str, tuple[int, float]] = {}   # member -> (last counter, when it last moved)
        self._answered: dict[str, int] = {}              # member -> last request number answered
        self._since: dict[tuple[str, int], float] = {}   # (member, n) -> when first seen
        self._dead: set[str] = set()
        self._issued: list[dict[str, int]] = []          # per round: member -> request number answered
        self._last_quorum: dict[str, Quorum] = {}        # member -> the last quorum it was in (rule 5)
        self._decided: dict[int, bytes] = {}             # round -> its commit decision, once read (final)
        self._line: dict[str, int] = {}                  # member -> the round whose step its state holds (rule 6)
        self._undecided: dict[int, tuple[Quorum, dict]] = {}   # round -> (quorum, each member's line if voided)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @property
    def address(self) -> str:
        """``"host:port"``, what :class:`~neural_arch.distributed.ft.manager.Manager` takes as ``lighthouse_addr``."""
        return f"{self.host}:{self.port}"

    @property
    def members(self) -> list[str]:
        """Every member id registered so far, in order (dead ones included)."""
        return list(self._members)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Lighthouse:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ft-lighthouse", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self.store.close()

    def __enter__(self) -> Lighthouse:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _forget(self, round_: int) -> None:
        """Delete the store keys of an old round (answers, votes, decision): a long job's store stays
        small. A member that far behind is out of the quorum anyway and heals when it comes back."""
        if round_ < 1:
            return
        for member, n in self._issued[round_ - 1].items():
            self.store.delete_key(protocol.answer_key(member, n))
            self.store.delete_key(protocol.vote_key(round_, member))
        self.store.delete_key(protocol.commit_key(round_))
        self._decided.pop(round_, None)
        self._undecided.pop(round_, None)      # never decided: its members' lines stay unknown

    # -- the loop ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.tick(time.monotonic())
                self._stop.wait(self.poll_interval)
        except BaseException as exc:  # kept for the owner; replicas then time out naming the lighthouse
            if not self._stop.is_set():
                self.error = exc
                log.exception("ft lighthouse stopped")

    def healthy(self, now: float) -> set[str]:
        """Members whose heartbeat moved within ``heartbeat_timeout`` and that did not leave."""
        return {m for m, (_, seen) in self._beats.items()
                if m not in self._dead and now - seen < self.heartbeat_timeout}

    def _known_steps(self, members) -> dict[str, int]:
        """The newest step each of ``members`` (healthy, not asking now) may hold: its last quorum's
        ``max_step`` + 1 if that step committed or is still undecided (in flight), else ``max_step``
        (the quorum's step was voided; a member that healed before it holds ``max_step``)."""
        known = {}
        for member in members:
            quorum = self._last_quorum.get(member)
            if quorum is None:
                continue
            known[member] = quorum.max_step + (0 if self._decision(quorum.round) == b"0" else 1)
        return known

    def _decision(self, round_: int) -> bytes | None:
        """The commit decision of ``round_`` once written (final, so kept), else None (in flight)."""
        decision = self._decided.get(round_)
        if decision is None and self.store.check(protocol.commit_key(round_)):
            decision = self._decided[round_] = self.store.get(protocol.commit_key(round_))
        return decision

    def _decide_lines(self) -> None:
        """Each member's line once its last quorum's commit decision is known: that quorum's round
        if the step committed, else the line its state had after the quorum's heals (rule 6)."""
        for round_, (quorum, if_voided) in list(self._undecided.items()):
            decision = self._decision(round_)
            if decision is None:
                continue
            del self._undecided[round_]
            for member in quorum.members:
                if self._last_quorum.get(member) is not quorum:
                    continue
                line = if_voided[member] if decision == b"0" else round_
                if line is None:
                    self._line.pop(member, None)
                else:
                    self._line[member] = line

    def tick(self, now: float) -> Quorum | None:
        """One look at the store: new members, heartbeats, requests; issue a quorum if the rule allows."""
        store = self.store
        registered = int(store.add(protocol.MEMBERS, 0))
        while len(self._members) < registered:
            member = store.get(protocol.member_key(len(self._members))).decode()
            self._members.append(member)
            self._beats[member] = (-1, now)
        requests: dict[str, QuorumRequest] = {}
        for member in self._members:
            if member in self._dead:
                continue
            if store.check(protocol.left_key(member)):
                self._dead.add(member)
                continue
            count = int(store.add(protocol.heartbeat_key(member), 0))
            last, _ = self._beats[member]
            if count != last:
                self._beats[member] = (count, now)
            if not store.check(protocol.request_key(member)):
                continue
            raw = store.get(protocol.request_key(member))
            n = protocol.decode_request(member, raw, 0.0).n
            if n <= self._answered.get(member, 0):
                continue
            since = self._since.setdefault((member, n), now)
            requests[member] = protocol.decode_request(member, raw, since)
        healthy = self.healthy(now)
        if requests:     # after the requests were read: a member asks only once its last step was decided
            self._decide_lines()
        quorum = plan_quorum(requests, healthy, self.quorums[-1] if self.quorums else None,
                             self.min_replicas, self.join_timeout, now,
                             known_steps=self._known_steps(healthy - set(requests)) if requests else None,
                             lines={m: self._line[m] for m in requests if m in self._line})
        if quorum is None:
            return None
        answer = json.dumps(quorum.to_json()).encode()
        for member in quorum.members:
            n = requests[member].n
            store.set(protocol.answer_key(member, n), answer)
            self._answered[member] = n
            self._since.pop((member, n), None)
        self.quorums.append(quorum)
        self._issued.append({m: requests[m].n for m in quorum.members})
        if_voided = {m: self._line.get(quorum.heal.get(m, m)) for m in quorum.members}
        for member in quorum.members:
            self._last_quorum[member] = quorum
            self._line.pop(member, None)        # unknown until the step's decision (_decide_lines)
        self._undecided[quorum.round] = (quorum, if_voided)
        self._forget(quorum.round - KEEP_ROUNDS)
        log.info("ft quorum round %d: id %d, members %s, steps %s, heal %s", quorum.round, quorum.quorum_id,
                 quorum.members, quorum.steps, quorum.heal)
        return quorum


#: the environment variable holding the lighthouse store's token for the command line and ``examples/ft_train.py``
TOKEN_VAR = "NEURAL_ARCH_FT_AUTH_TOKEN"


def main(argv: list[str] | None = None) -> int:
    """``python -m neural_arch.distributed.ft.lighthouse``: serve quorums until SIGINT/SIGTERM (module docstring).

    Example::

        main(["--min_replicas", "2", "--port", "0"])     # prints its address, then one line per quorum
    """
    parser = argparse.ArgumentParser(prog="python -m neural_arch.distributed.ft.lighthouse",
                                     description="Decide each step's quorum for per-step fault tolerance.")
    parser.add_argument("--min_replicas", type=int, default=1, help="the smallest quorum (default 1)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=29510, help="port (0: a free one; default 29510)")
    parser.add_argument("--join_timeout", type=float, default=1.0,
                        help="seconds to wait for a healthy replica that did not ask (default 1)")
    parser.add_argument("--heartbeat_timeout", type=float, default=1.0,
                        help="seconds without a heartbeat before a replica counts as dead (default 1)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    # the handlers only set the event: the main thread leaves its wait and stops the lighthouse itself
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    lighthouse = Lighthouse(args.min_replicas, args.host, args.port, args.join_timeout, args.heartbeat_timeout,
                            auth_token=config.get(TOKEN_VAR) or None).start()
    print(f"ft lighthouse listening on {lighthouse.address}", flush=True)
    printed = 0
    try:
        while True:
            stopping = stop.wait(0.05) or lighthouse.error is not None
            quorums = lighthouse.quorums[printed:]      # the thread appends; a slice is a snapshot
            for quorum in quorums:
                print("quorum " + json.dumps(quorum.to_json()), flush=True)
            printed += len(quorums)
            if stopping:
                break
    finally:
        lighthouse.stop()
    if lighthouse.error is not None:
        print(f"ft lighthouse stopped: {lighthouse.error!r}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
