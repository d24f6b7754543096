"""Fixtures of the strict device tests: the fake device registered with the backend.

``fake`` registers :mod:`fake_device` as device type ``"fake"`` for one test and yields its
array module; ``strict_cuda`` registers it as ``"cuda"`` (the device string users write).
"""

from __future__ import annotations

import fake_device as fd
import pytest


@pytest.fixture
def fake():
    with fd.installed("fake") as xp:
        yield xp


@pytest.fixture
def strict_cuda():
    with fd.installed("cuda") as xp:
        yield xp
