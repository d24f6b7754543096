"""An explicit rank/world_size that contradicts the launcher's environment fails at once, naming both."""
import time

import pytest

import neural_arch.distributed as dist


@pytest.fixture
def torchrun_env(monkeypatch):
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("kwargs, named", [({"rank": 0}, "rank=0"), ({"world_size": 4}, "world_size=4"),
                                           ({"rank": 0, "world_size": 2}, "rank=0")])
def test_contradicting_argument_is_an_immediate_error(torchrun_env, kwargs, named):
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=named) as err:
        dist.init_process_group("gloo", **kwargs)
    assert time.monotonic() - t0 < 5  # no rendezvous was attempted (MASTER_PORT=1 would fail slowly)
    assert "environment" in str(err.value) and "omit" in str(err.value)
    assert not dist.is_initialized()


def test_minus_one_still_means_from_the_environment(torchrun_env, monkeypatch):
    monkeypatch.setenv("NEURAL_ARCH_RENDEZVOUS_TIMEOUT", "2")
    # rank=-1/world_size=-1 is torch's "read the environment": it must not count as a contradiction.
    # Pointing at a port nothing listens on with a short timeout proves we got past the check.
    with pytest.raises(Exception) as err:
        dist.init_process_group("gloo", rank=-1, world_size=-1, timeout=2)
    assert "contradicts" not in str(err.value)
