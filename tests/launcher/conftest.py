"""Fixtures for launcher tests (helpers live in launcher_helpers.py)."""

import pytest


@pytest.fixture
def write_script(tmp_path):
    def _write(name: str, body: str):
        path = tmp_path / name
        path.write_text(body)
        return path
    return _write
