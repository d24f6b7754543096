"""Run the docstring examples of every module under ``neural_arch.distributed``.

Docstrings are documentation that must not rot. Modules are discovered by walking the package,
so a new module's examples run without anyone adding it to a list. Examples that need a
running job are marked ``# doctest: +SKIP`` where they are written.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import neural_arch.distributed as dist

#: modules whose import needs an optional runtime (checked by their own GPU/MPI tests)
NEEDS_OPTIONAL = {"neural_arch.distributed.comm.mpi.backend"}


def _modules() -> list[str]:
    names = [dist.__name__]
    for info in pkgutil.walk_packages(dist.__path__, prefix=dist.__name__ + "."):
        names.append(info.name)
    return sorted(n for n in names if n not in NEEDS_OPTIONAL and not n.endswith("__main__"))


@pytest.mark.parametrize("name", _modules())
@pytest.mark.usefixtures("doctest_tempdir")
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, verbose=False, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
