"""Explorer: every store against a plain dictionary that follows torch's ``Store`` semantics.

Hypothesis draws sequences of ``set``/``get``/``add``/``compare_set``/``append``/``delete_key``/
``check``/``multi_set``/``multi_get``/``num_keys`` (bytes and str values, str and UTF-8 bytes keys)
and runs them on a TCPStore master, a TCPStore client, a FileStore and a PrefixStore inside a
PrefixStore; each answer and the final contents must equal the reference's. torch's rules:
``compare_set`` with expected ``""`` sets an absent key, returns the value stored now (the expected
value for an absent key it did not set); ``add`` counts in decimal text; ``append`` creates.
Bad input is a clear error at the call: a float/str increment, a non-str key, a negative timeout,
``multi_set`` with fewer values than keys, a port that is not one, a barrier rank outside the world,
an ``init_method`` that names no store; a missing key times out naming the key; a store with a
token lets no one in without it.
"""

from __future__ import annotations

import itertools
import socket
import struct
from datetime import timedelta

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neural_arch.distributed.errors import AuthenticationError, DistributedError
from neural_arch.distributed.rendezvous.store import (
    FileStore,
    PrefixStore,
    StoreTimeoutError,
    TCPStore,
    store_barrier,
)

pytestmark = pytest.mark.timeout(120)
TOKEN = "0ddba11" * 6  # 42 hex digits: more than the 128 bits a token needs
_NAMESPACES = itertools.count()


@pytest.fixture(scope="module")
def tcp():
    master = TCPStore("127.0.0.1", 0, world_size=2, is_master=True, timeout=5, auth_token=TOKEN)
    client = TCPStore("127.0.0.1", master.port, world_size=2, timeout=5, auth_token=TOKEN)
    yield master, client
    client.close()
    master.close()


@pytest.fixture(scope="module")
def file_store(tmp_path_factory):
    store = FileStore(str(tmp_path_factory.mktemp("store") / "rdzv"), timeout=5)
    yield store
    store.close()


# --------------------------------------------------------------------------- the reference
class Reference:
    """torch's Store semantics on a dictionary."""

    def __init__(self):
        self.d: dict[str, bytes] = {}

    def set(self, k, v):
        self.d[k] = _bytes(v)

    def get(self, k):
        return self.d[k]

    def add(self, k, n):
        self.d[k] = str(int(self.d.get(k, b"0")) + n).encode()
        return int(self.d[k])

    def compare_set(self, k, expected, desired):
        expected, desired = _bytes(expected), _bytes(desired)
        if k not in self.d:
            if expected == b"":
                self.d[k] = desired
                return desired
            return expected
        if self.d[k] == expected:
            self.d[k] = desired
            return desired
        return self.d[k]

    def append(self, k, v):
        self.d[k] = self.d.get(k, b"") + _bytes(v)

    def delete_key(self, k):
        return self.d.pop(k, None) is not None

    def check(self, keys):
        return all(k in self.d for k in keys)

    def multi_set(self, keys, values):
        for k, v in zip(keys, values):
            self.d[k] = _bytes(v)

    def multi_get(self, keys):
        return [self.d[k] for k in keys]


def _bytes(v):
    return v.encode() if isinstance(v, str) else bytes(v)


_KEYS = st.sampled_from(["k0", "k1", "k2", "ключ"])
_COUNTERS = st.sampled_from(["n0", "n1"])
_VALUES = st.one_of(st.binary(max_size=6), st.text(max_size=4), st.sampled_from(["", b"", "a", b"a"]))
_OPS = st.one_of(
    st.tuples(st.just("set"), _KEYS, _VALUES),
    st.tuples(st.just("get"), _KEYS),
    st.tuples(st.just("add"), _COUNTERS, st.integers(-5, 5)),
    st.tuples(st.just("compare_set"), _KEYS, _VALUES, _VALUES),
    st.tuples(st.just("append"), _KEYS, _VALUES),
    st.tuples(st.just("delete_key"), st.one_of(_KEYS, _COUNTERS)),
    st.tuples(st.just("check"), st.lists(st.one_of(_KEYS, _COUNTERS), max_size=3)),
    st.tuples(st.just("multi_set"), st.lists(_KEYS, min_size=1, max_size=3, unique=True), st.data()),
    st.tuples(st.just("multi_get"), st.lists(_KEYS, max_size=3)),
    st.tuples(st.just("num_keys"),),
)


def _run(store, ops, as_bytes_keys: bool):
    """Apply ``ops`` to ``store`` and the reference; every answer must agree."""
    ref = Reference()
    for k in ("k0", "k1", "k2", "ключ", "n0", "n1"):  # the raw stores are shared by the examples
        store.delete_key(k)
    base = store.num_keys()
    for op in ops:
        name, args = op[0], list(op[1:])
        if name == "multi_set":
            keys = args[0]
            values = args[1].draw(st.lists(_VALUES, min_size=len(keys), max_size=len(keys)))
            args = [keys, values]
        if name in ("get", "multi_get") and not ref.check(args[0] if name == "multi_get" else [args[0]]):
            continue  # a get of a missing key waits for it: tested on its own below
        if name == "num_keys":
            assert store.num_keys() == base + len(ref.d), ops
            continue
        call = list(args)
        if as_bytes_keys and name in ("set", "get", "append", "delete_key"):
            call[0] = call[0].encode()  # torch takes UTF-8 bytes keys as their text
        got = getattr(store, name)(*call)
        want = getattr(ref, name)(*args)
        assert got == want, (name, args, got, want)
    for k, v in ref.d.items():
        assert store.get(k) == v, k
    assert store.num_keys() == base + len(ref.d)


@pytest.fixture(params=["tcp-master", "tcp-client", "file", "prefix-in-prefix"])
def store_factory(request, tcp, file_store):
    """The store an example runs on: the raw stores themselves (emptied of the drawn keys first), or
    a PrefixStore in a PrefixStore with a fresh namespace."""
    master, client = tcp
    under = {"tcp-master": master, "tcp-client": client, "file": file_store, "prefix-in-prefix": client}
    inner = under[request.param]

    def fresh():
        if request.param == "prefix-in-prefix":
            n = next(_NAMESPACES)
            return PrefixStore(f"outer{n}", PrefixStore(f"inner{n}", inner))
        return inner

    return fresh


@settings(max_examples=20)
@given(ops=st.lists(_OPS, max_size=12), as_bytes_keys=st.booleans())
@example(ops=[("compare_set", "k0", "x", "y"), ("compare_set", "k0", "", "y"), ("compare_set", "k0", "z", "w"),
              ("compare_set", "k0", b"y", "w"), ("num_keys",)], as_bytes_keys=False)
@example(ops=[("set", "k0", ""), ("compare_set", "k0", "", "v"), ("append", "k1", "a"), ("append", "k1", b"b")],
         as_bytes_keys=True)
@example(ops=[("add", "n0", 0), ("add", "n0", -3), ("delete_key", "n0"), ("add", "n0", 2)], as_bytes_keys=False)
def test_store_matches_torch_semantics(store_factory, ops, as_bytes_keys):
    _run(store_factory(), ops, as_bytes_keys)


def test_prefix_in_prefix_names_keys_like_torch(tcp):
    master, client = tcp
    PrefixStore("a", PrefixStore("b", client)).set("x", "1")
    assert master.get("b/a/x") == b"1"
    PrefixStore("a", PrefixStore("b", client)).multi_set(["y"], ["2"])
    assert master.multi_get(["b/a/x", "b/a/y"]) == [b"1", b"2"]


# --------------------------------------------------------------------------- bad input is an error at the call
def _each_store(tcp, file_store):
    master, client = tcp
    return [master, client, file_store, PrefixStore("p", client)]


def test_bad_input_is_a_clear_error(tcp, file_store):
    for store in _each_store(tcp, file_store):
        with pytest.raises(TypeError, match="integer amount"):
            store.add("bad/n", 1.7)                      # used to add 1
        with pytest.raises(TypeError, match="integer amount"):
            store.add("bad/n", "3")                      # used to add 3
        with pytest.raises(TypeError, match="store keys must be str"):
            store.set(3, b"v")
        with pytest.raises(ValueError, match=">= 0 seconds"):
            store.wait(["bad/k"], -1)                    # TCPStore: "int too large to convert"
        with pytest.raises(ValueError, match="2 keys and 1 values"):
            store.multi_set(["bad/a", "bad/b"], ["1"])   # zip would have dropped bad/b
        assert not store.check(["bad/n", "bad/a"])


def test_timeouts_take_timedelta_and_a_missing_key_times_out_naming_it(tcp, file_store):
    for store in _each_store(tcp, file_store):
        store.set("td/k", "v")
        store.wait(["td/k"], timedelta(seconds=1))
        with pytest.raises(StoreTimeoutError, match="td/missing'"):
            store.wait(["td/missing"], timedelta(milliseconds=50))
    master, _ = tcp
    old = master.timeout
    master.set_timeout(timedelta(milliseconds=50))
    try:
        with pytest.raises(StoreTimeoutError, match="'td/absent'"):
            master.get("td/absent")
        with pytest.raises(StoreTimeoutError, match="td/absent"):
            master.multi_get(["td/k", "td/absent"])
    finally:
        master.set_timeout(old)


def test_torch_positional_arguments():
    # torch: TCPStore(host, port, world_size, is_master, timeout, wait_for_workers)
    master = TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=3), True)
    try:
        assert master.timeout == 3.0
    finally:
        master.close()


def test_a_store_with_a_token_lets_no_one_in_without_it(tcp):
    master, _ = tcp
    with pytest.raises(AuthenticationError):
        TCPStore("127.0.0.1", master.port, timeout=2)                           # no token
    with pytest.raises(AuthenticationError):
        TCPStore("127.0.0.1", master.port, timeout=2, auth_token="f00d" * 10)   # another token
    # a raw client that skips the handshake and sends a SET frame: the key never appears
    with socket.create_connection(("127.0.0.1", master.port), timeout=2) as raw:
        key, value = b"intruder", b"1"
        raw.sendall(struct.pack("!BI", 1, 2) + struct.pack("!I", len(key)) + key + struct.pack("!I", 1) + value)
        raw.settimeout(0.3)  # the server answers nothing before a handshake; it drops us later
        try:
            while raw.recv(4096):
                pass
        except OSError:
            pass
    assert not master.check(["intruder"])


@pytest.mark.parametrize("port, is_master, message", [
    (70000, True, "not a TCP port"), (-1, False, "not a TCP port"), (0, False, "needs the master's port"),
])
def test_a_port_that_cannot_be_is_an_error_naming_it(port, is_master, message):
    # bind()/connect() said "OverflowError: port must be 0-65535", naming neither the store nor the port
    with pytest.raises(ValueError, match=message):
        TCPStore("127.0.0.1", port, is_master=is_master, timeout=1, auth_token=TOKEN)


def test_a_bracketed_ipv6_host_is_the_address_inside():
    try:
        master = TCPStore("[::1]", 0, is_master=True, timeout=2, auth_token=TOKEN)
    except DistributedError as exc:  # a host without IPv6 loopback: nothing to check here
        assert "cannot listen on ::1" in str(exc)
        return
    try:
        client = TCPStore("[::1]", master.port, timeout=2, auth_token=TOKEN)
        client.set("v6", "yes")
        assert master.get("v6") == b"yes"
        client.close()
    finally:
        master.close()


@pytest.mark.parametrize("rank", [-1, 2, 1.0])
def test_store_barrier_refuses_a_rank_outside_the_world(tcp, rank):
    master, _ = tcp
    # rank -1 used to set rank 1's arrival key: its peers would pass a barrier rank 1 never reached
    with pytest.raises((ValueError, TypeError), match="outside world size|integer"):
        store_barrier(PrefixStore("barrier", master), rank=rank, world_size=2, name="b", timeout=0.5)
    assert not master.check(["barrier/b/arrived/1"])


@pytest.mark.parametrize("init_method, message", [
    ("tcp://127.0.0.1", "must look like 'tcp://HOST:PORT'"),       # no port
    ("tcp://:29511", "must look like 'tcp://HOST:PORT'"),          # no host
    ("tcp://[::1]", "must look like 'tcp://HOST:PORT'"),           # IPv6 without a port
    ("tcp://127.0.0.1:70000", "port 70000 is not a TCP port"),     # was OverflowError from bind()
    ("udp://h:1", "is not understood"),
    ("tcp://::1", "IPv6 address in brackets"),                     # read as host '::', port 1
    ("tcp://127.0.0.1:0", "port 0 lets rank 0 pick a port"),       # the other ranks cannot know it
    ("tcp://127.0.0.1:29511?rank=0", "query parameters are not read"),
    ("file:///tmp/na-init-query?rank=0&world_size=2", "query parameters are not read"),   # a file per spelling
])
def test_init_method_that_names_no_store_is_a_clear_error(init_method, message, monkeypatch):
    import neural_arch.distributed as dist

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NEURAL_ARCH_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=message):
        dist.init_process_group("gloo", init_method=init_method, rank=0, world_size=2, timeout=2)
    assert not dist.is_initialized()
