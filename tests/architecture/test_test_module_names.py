"""Every module under ``tests/`` has a name of its own.

The test folders have no ``__init__.py``: pytest puts each test file's folder on ``sys.path`` and
imports its helpers (``rank_fns`` modules the ranks unpickle functions from) by their bare names, so
two helpers called ``pp_rank_fns.py`` in two folders make whichever is imported first shadow the
other, and a rank fails with "Can't get attribute" in a test that has nothing to do with the change.
"""

from __future__ import annotations

import collections
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_name():
    seen = collections.defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name not in ("conftest.py", "__init__.py") and "__pycache__" not in path.parts:
            seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"modules sharing a name (rename one: helpers are imported by bare name): {clashes}"
