"""The ring: what one op records (synchronous, queued, failed), the caller's line, size 0, dumps."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest

from neural_arch.distributed.comm.local import LocalBackend
from neural_arch.distributed.errors import GroupPoisonedError
from neural_arch.distributed.flight_recorder import buffer
from neural_arch.distributed.flight_recorder.buffer import FlightRecorder, as_dict
from neural_arch.distributed.flight_recorder.writer import dump, dump_payload, fetch_from_store


@pytest.fixture(autouse=True)
def dump_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURAL_ARCH_FLIGHT_RECORDER_DIR", str(tmp_path / "dumps"))


@pytest.fixture()
def backend():
    b = LocalBackend()
    rec = FlightRecorder(size=16, with_caller=True)   # the caller's line is opt-in (NEURAL_ARCH_FLIGHT_RECORDER_CALLER)
    b._fr, b._fr_caller = rec.ring, rec.caller        # a private ring: other tests' ops do not show
    yield b
    b.shutdown()


def records(b):
    return [as_dict(r) for r in b._fr.records()]


def test_each_op_is_one_record_naming_the_user_line(backend):
    backend.allreduce(np.ones(3, np.float32)); line = __import__("sys")._getframe().f_lineno
    backend.broadcast(np.ones(2), 0, async_op=True).wait()
    r = records(backend)
    assert [(e["seq"], e["op"], e["state"]) for e in r] == [(1, "all_reduce", "completed"), (2, "broadcast", "completed")]
    assert r[0]["shape"] == [3] and r[0]["dtype"] == "float32" and r[0]["reduce_op"] == "sum"
    assert r[1]["root"] == 0 and r[0]["t_end"] >= r[0]["t_start"] > 0
    assert r[0]["file"] == __file__ and r[0]["line"] == line


def test_a_failed_op_records_its_error(backend):
    backend.abort("stage 2 failed")
    with pytest.raises(GroupPoisonedError):
        backend.allreduce(np.ones(1))
    assert records(backend) == []      # refused before it ran: no record, as it took no number
    b = LocalBackend()
    b._fr = FlightRecorder(size=4).ring

    def boom():
        raise RuntimeError("boom")
    info = b._new_info("all_reduce", np.ones(1))
    with pytest.raises(RuntimeError):
        b._run(info, boom, async_op=False)
    (e,) = records(b)
    assert e["state"] == "failed" and e["error"] == "RuntimeError: boom"


def test_size_zero_records_nothing():
    assert FlightRecorder(size=0).ring is None
    b = LocalBackend()
    b._fr = None
    b.allreduce(np.ones(2))
    assert dump("x", recorder=FlightRecorder(size=0)) is None


def test_the_ring_keeps_the_newest(backend):
    for _ in range(20):
        backend.barrier()
    assert [e["seq"] for e in records(backend)] == list(range(5, 21))


def test_a_dump_is_one_json_file_per_rank_with_wall_clock_times(tmp_path):
    rec = FlightRecorder(size=4)
    rec.rank, rec.world_size = 3, 4
    rec.ring.append(rec.record([0, 1, 2, 3], 1, "all_reduce", (2,), "float32", "sum", None, t_start=1.0))
    path = dump("because", recorder=rec, folder=str(tmp_path))
    assert os.path.basename(path) == "rank3.json" and os.listdir(tmp_path) == ["rank3.json"]
    data = json.loads(pathlib.Path(path).read_text())
    assert data["reason"] == "because" and data["world_size"] == 4 and data["entries"][0]["op"] == "all_reduce"
    assert not (tmp_path / "dumps").exists()         # a world of one never dumps on a failure
    assert abs(data["entries"][0]["t_start"] - (data["time"] - __import__("time").monotonic() + 1.0)) < 5


def test_without_a_folder_a_dump_goes_to_the_store_and_back_out(tmp_path, monkeypatch):
    monkeypatch.delenv("NEURAL_ARCH_FLIGHT_RECORDER_DIR", raising=False)

    class Store(dict):
        def set(self, k, v): self[k] = bytes(v)   # noqa: E704
        def get(self, k): return self[k]          # noqa: E704
        def check(self, keys): return all(k in self for k in keys)   # noqa: E704
    rec = FlightRecorder(size=2)
    rec.rank, rec.world_size = 1, 2
    assert dump("t", recorder=rec) is None            # nowhere to write: no stray file in <tmp>
    rec.store = Store()
    assert dump("t", recorder=rec) == "store:flight_recorder/rank1"
    assert fetch_from_store(rec.store, 2, str(tmp_path)) == [1]
    assert json.loads((tmp_path / "rank1.json").read_text())["rank"] == 1


def test_the_process_recorder_knows_its_rank():
    LocalBackend()
    assert buffer.RECORDER.rank == 0 and dump_payload("x")["rank"] == 0


def test_the_caller_can_be_left_out():
    rec = FlightRecorder(size=2, with_caller=False)
    assert rec.caller() == (None, 0)
    assert FlightRecorder(size=2, with_caller=True).caller(depth=1)[0].co_filename == __file__


def test_a_new_world_after_the_old_one_was_destroyed_says_who_this_rank_is():
    class Runner:                 # what attach reads of a backend
        def __init__(self, ranks, rank):
            self.group_ranks, self.rank, self.name, self._closed = ranks, rank, "gloo", False
    rec = FlightRecorder(size=1)
    old = Runner([0, 1, 2, 3], 3)
    rec.attach(old)
    rec.attach(Runner([0, 1], 1))            # a sub-group: the world still says who this is
    assert (rec.rank, rec.world_size) == (3, 4)
    old._closed = True                       # an elastic re-form: 3 ranks left, this one is now 2
    rec.attach(Runner([0, 1, 2], 2))
    assert (rec.rank, rec.world_size) == (2, 3)


def _two_ranks():
    """Rank 0's and rank 1's recorders in this process (each with one record)."""
    recs = []
    for rank in (0, 1):
        rec = FlightRecorder(size=4)
        rec.rank, rec.world_size = rank, 2
        rec.ring.append(rec.record([0, 1], 3, "all_reduce", (4,), "float32", "sum", None))
        recs.append(rec)
    return recs


def test_a_peer_idle_in_user_code_dumps_when_the_failing_rank_asks(tmp_path):
    from neural_arch.distributed.flight_recorder.writer import DumpWatcher, request_dumps

    folder = tmp_path / "dumps"
    failing, idle = _two_ranks()
    watcher = DumpWatcher(interval=0, recorder=idle)       # polled by hand here (the thread does it every interval)
    assert watcher.poll() is None                          # no request yet
    request_dumps("all_reduce #3 timed out", recorder=failing)
    assert watcher.poll() == str(folder / "rank1.json")
    data = json.loads((folder / "rank1.json").read_text())
    assert data["reason"] == "requested by rank 0: all_reduce #3 timed out" and data["entries"][0]["seq"] == 3
    os.remove(folder / "rank1.json")
    assert watcher.poll() is None and not (folder / "rank1.json").exists()       # one dump per request
    assert DumpWatcher(interval=0, recorder=failing).poll() is None               # never its own request


def test_a_request_from_before_the_watcher_started_is_another_run(tmp_path):
    import time

    from neural_arch.distributed.flight_recorder.writer import DumpWatcher, request_dumps

    failing, idle = _two_ranks()
    request_dumps("an old job's failure", recorder=failing)
    time.sleep(0.01)   # the scenario: a later process start (the watcher's clock)
    assert DumpWatcher(interval=0, recorder=idle).poll() is None


def test_without_a_folder_the_request_goes_through_the_rendezvous_store(monkeypatch):
    from neural_arch.distributed.flight_recorder.writer import REQUEST_KEY, STORE_PREFIX, DumpWatcher, request_dumps
    from neural_arch.distributed.rendezvous.tcp_store import TCPStore

    monkeypatch.delenv("NEURAL_ARCH_FLIGHT_RECORDER_DIR", raising=False)
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=10)
    try:
        failing, idle = _two_ranks()
        failing.store = idle.store = store
        watcher = DumpWatcher(interval=0, recorder=idle)
        assert request_dumps("broadcast #2 mismatched", recorder=failing) == f"store:{REQUEST_KEY}"
        assert watcher.poll() == f"store:{STORE_PREFIX}1"
        assert watcher.poll() is None
    finally:
        store.close() if hasattr(store, "close") else None


def test_the_watcher_thread_answers_within_its_interval(tmp_path):
    import time

    from neural_arch.distributed.flight_recorder.writer import DumpWatcher, request_dumps

    failing, idle = _two_ranks()
    watcher = DumpWatcher(interval=0.02, recorder=idle)
    try:
        request_dumps("all_reduce #3 timed out", recorder=failing)
        end = time.monotonic() + 5
        while not (tmp_path / "dumps" / "rank1.json").exists() and time.monotonic() < end:
            time.sleep(0.01)
        assert (tmp_path / "dumps" / "rank1.json").exists()
    finally:
        watcher.stop()
        watcher.thread.join(2)
    assert not watcher.thread.is_alive()
