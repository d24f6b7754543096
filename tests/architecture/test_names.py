"""Names that do not mislead: no package attribute hides one of its submodules.

``neural_arch.core.tensor`` once meant the module to ``from neural_arch.core.tensor import Tensor``
and, as an attribute of ``neural_arch.core``, the ``tensor()`` function; ``neural_arch.profiler.profile``
was both a module and torch's ``profile`` class. A reader (and autodoc) cannot tell which one a dotted
name means, so this fails on any package whose attribute of a submodule's name is not that module.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import neural_arch


def _packages():
    yield neural_arch
    for info in pkgutil.walk_packages(neural_arch.__path__, "neural_arch."):
        if info.ispkg:
            try:
                yield importlib.import_module(info.name)
            except ImportError:  # an extra that is not installed (cupy): nothing to read
                continue


def shadowed_submodules(package) -> list[str]:
    out = []
    for info in pkgutil.iter_modules(getattr(package, "__path__", [])):
        attribute = getattr(package, info.name, None) if info.name in vars(package) else None
        if attribute is not None and not inspect.ismodule(attribute):
            out.append(f"{package.__name__}.{info.name} is a {type(attribute).__name__}, not the module")
    return out


def test_no_attribute_hides_a_submodule():
    bad = [s for pkg in _packages() for s in shadowed_submodules(pkg)]
    assert not bad, "rename the module or the attribute:\n" + "\n".join(bad)


def test_the_check_finds_a_planted_one(tmp_path, monkeypatch):
    pkg = tmp_path / "planted"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from planted.thing import thing\n")
    (pkg / "thing.py").write_text("def thing():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    planted = importlib.import_module("planted")
    assert shadowed_submodules(planted) == ["planted.thing is a function, not the module"]
