"""The settings table (neural_arch/distributed/config.py) lists every NEURAL_ARCH_* variable the
package reads, docs/configuration.md is its output, and get() types and checks values."""
import pathlib
import re

import pytest

from neural_arch.distributed import config

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOT_SETTINGS = {"NEURAL_ARCH_PICKLE"}  # a file-format magic string, not an environment variable


def test_every_variable_the_package_uses_is_in_the_table():
    used = set()
    for path in (ROOT / "neural_arch").rglob("*.py"):
        used |= set(re.findall(r"NEURAL_ARCH_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    listed = {v.name for v in config.VARIABLES}
    missing = sorted(used - listed - NOT_SETTINGS)
    assert not missing, f"add these to neural_arch/distributed/config.py VARIABLES: {missing}"
    unused = sorted(listed - used)
    assert not unused, f"listed in config.py but never read: {unused}"


def test_docs_are_the_tables_output():
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert config.markdown_table() in text, "regenerate: python -m neural_arch.distributed.config"


def test_get_types_defaults_and_errors():
    assert config.get("NEURAL_ARCH_TIMEOUT", {}) == 300.0
    assert config.get("NEURAL_ARCH_GLOO_DIRECT", {"NEURAL_ARCH_GLOO_DIRECT": "0"}) is False
    assert config.get("NEURAL_ARCH_BACKEND", {"NEURAL_ARCH_BACKEND": "mpi"}) == "mpi"
    with pytest.raises(ValueError, match="NEURAL_ARCH_TIMEOUT='soon': expected float"):
        config.get("NEURAL_ARCH_TIMEOUT", {"NEURAL_ARCH_TIMEOUT": "soon"})
    with pytest.raises(KeyError, match="not a neural_arch setting"):
        config.get("NEURAL_ARCH_TIMEOTU", {})
