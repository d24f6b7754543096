"""The store keys the lighthouse and the managers talk through: one place, so both sides agree.

Everything lives under ``ft/`` in the lighthouse's TCPStore:

========================  ==================================================================
key                       what
========================  ==================================================================
``members``               counter: registrations so far (``add``)
``member/{i}``            the member id of registration ``i``
``hb/{m}``                counter a member's heartbeat thread bumps; frozen = dead
``left/{m}``              a member shut down cleanly (drop it at once)
``req/{m}``               the member's latest quorum request (JSON)
``req_seq``               counter bumped after every request (the lighthouse's wake-up)
``quorum/{m}/{n}``        the answer to request ``n`` of member ``m`` (JSON ``Quorum``)
``pg/{quorum_id}/``       the prefix the quorum's process group rendezvous under (sharded
                          replicas: ``pg/{quorum_id}/shard{s}/``, one group per shard index)
``vote/{round}/{m}``      ``1``/``0``: did the step succeed on member ``m``
``commit/{round}``        the round's decision, set once (compare-and-set): ``1`` commit, ``0`` discard
========================  ==================================================================

Example:
    >>> answer_key("r0:ab12", 3), vote_key(9, "r0:ab12"), pg_prefix(2)
    ('ft/quorum/r0:ab12/3', 'ft/vote/9/r0:ab12', 'ft/pg/2/')
"""

from __future__ import annotations

import json

from neural_arch.distributed.ft.quorum import QuorumRequest

__all__ = ["answer_key", "decode_request", "encode_request", "pg_prefix", "vote_key"]

ROOT = "ft/"
MEMBERS = ROOT + "members"
REQ_SEQ = ROOT + "req_seq"


def member_key(i: int) -> str:
    return f"{ROOT}member/{i}"


def heartbeat_key(member: str) -> str:
    return f"{ROOT}hb/{member}"


def left_key(member: str) -> str:
    return f"{ROOT}left/{member}"


def request_key(member: str) -> str:
    return f"{ROOT}req/{member}"


def answer_key(member: str, n: int) -> str:
    """Where the lighthouse answers request ``n`` of ``member``.

    Example:
        >>> answer_key("a", 1)
        'ft/quorum/a/1'
    """
    return f"{ROOT}quorum/{member}/{n}"


def pg_prefix(quorum_id: int, shard: int | None = None) -> str:
    """The key prefix a quorum's process group rendezvous under (fresh per ``quorum_id``); with
    sharded replicas each shard index has a group (lane) of its own.

    Example:
        >>> pg_prefix(4), pg_prefix(4, shard=1)
        ('ft/pg/4/', 'ft/pg/4/shard1/')
    """
    return f"{ROOT}pg/{quorum_id}/" + (f"shard{shard}/" if shard is not None else "")


def vote_key(round_: int, member: str) -> str:
    """Where ``member`` votes on the step of quorum round ``round_``.

    Example:
        >>> vote_key(2, "b")
        'ft/vote/2/b'
    """
    return f"{ROOT}vote/{round_}/{member}"


def commit_key(round_: int) -> str:
    return f"{ROOT}commit/{round_}"


def encode_request(n: int, step: int, reconfigure: bool, min_replicas: int, init_sync: bool = True,
                   replica: str = "", shard: int = 0, num_shards: int = 1, heal_head: int = 0) -> bytes:
    """A request as the member writes it (the lighthouse adds the member and its own clock).

    Example:
        >>> decode_request("a", encode_request(2, 5, False, 1), since=0.0)
        QuorumRequest(member='a', n=2, step=5, since=0.0, reconfigure=False, min_replicas=1, init_sync=True, replica='', shard=0, num_shards=1, heal_head=0)
    """
    fields = {"n": int(n), "step": int(step), "reconfigure": bool(reconfigure), "min_replicas": int(min_replicas),
              "init_sync": bool(init_sync), "replica": str(replica), "shard": int(shard),
              "num_shards": int(num_shards)}
    if heal_head:         # only a replica that may be healed asks (most requests never carry it)
        fields["heal_head"] = int(heal_head)
    return json.dumps(fields).encode()


def decode_request(member: str, raw: bytes, since: float) -> QuorumRequest:
    """The lighthouse's reading of ``encode_request`` (see its example).

    Example:
        >>> decode_request("a", b'{"n": 1, "step": 0, "reconfigure": true, "min_replicas": 2}', 3.0).reconfigure
        True
    """
    d = json.loads(raw)
    return QuorumRequest(member, int(d["n"]), int(d["step"]), since, bool(d["reconfigure"]), int(d["min_replicas"]),
                         bool(d.get("init_sync", True)), str(d.get("replica", "")), int(d.get("shard", 0)),
                         int(d.get("num_shards", 1)), int(d.get("heal_head", 0)))
