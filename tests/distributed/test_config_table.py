"""The settings table (neural_arch/config.py, re-exported as neural_arch.config) lists
every NEURAL_ARCH_* variable the package reads, only it reads them from the environment,
docs/configuration.md is its output, and get() types and checks values."""
import ast
import pathlib
import re

import pytest

from neural_arch import config

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOT_SETTINGS = {"NEURAL_ARCH_PICKLE"}  # a file-format magic string, not an environment variable


def test_every_variable_the_package_uses_is_in_the_table():
    used = set()
    for path in (ROOT / "neural_arch").rglob("*.py"):
        used |= set(re.findall(r"NEURAL_ARCH_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    listed = {v.name for v in config.VARIABLES}
    missing = sorted(used - listed - NOT_SETTINGS)
    assert not missing, f"add these to neural_arch/config.py VARIABLES: {missing}"
    unused = sorted(listed - used)
    assert not unused, f"listed in config.py but never read: {unused}"


def test_docs_are_the_tables_output():
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert config.markdown_table() in text, "regenerate: python -m neural_arch.config"


def test_get_types_defaults_and_errors():
    assert config.get("NEURAL_ARCH_TIMEOUT", {}) == 300.0
    assert config.get("NEURAL_ARCH_GLOO_DIRECT", {"NEURAL_ARCH_GLOO_DIRECT": "0"}) is False
    assert config.get("NEURAL_ARCH_BACKEND", {"NEURAL_ARCH_BACKEND": "mpi"}) == "mpi"
    with pytest.raises(ValueError, match="NEURAL_ARCH_TIMEOUT='soon': expected float"):
        config.get("NEURAL_ARCH_TIMEOUT", {"NEURAL_ARCH_TIMEOUT": "soon"})
    with pytest.raises(KeyError, match="not a neural_arch setting"):
        config.get("NEURAL_ARCH_TIMEOTU", {})


# ---------------------------------------------------------------------------------- one reader
# Reads of a NEURAL_ARCH_* name anywhere but the table module: `environ.get(NAME)`, `os.getenv(NAME)`,
# `environ[NAME]`, `NAME in environ`, where NAME is the literal or a constant bound to it
# (`TIMELINE_ENV = "NEURAL_ARCH_TIMELINE"`). `config.get(NAME, environ)` is the one way in.
READER = {"neural_arch/config.py"}


def _env_constants(tree) -> dict:
    """A module's `NAME = "NEURAL_ARCH_..."` constants, by name."""
    found = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str) and node.value.value.startswith("NEURAL_ARCH_")):
            found.update((t.id, node.value.value) for t in node.targets if isinstance(t, ast.Name))
    return found


def _setting_name(node, local, imported):
    """The NEURAL_ARCH_* name ``node`` stands for: a literal, this module's constant, or one
    imported (``from ..stall import STALL_ENV``; ``stall.STALL_ENV``) from elsewhere in the package."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("NEURAL_ARCH_"):
        return node.value
    if isinstance(node, ast.Name):
        return local.get(node.id) or imported.get(node.id)
    if isinstance(node, ast.Attribute):
        return imported.get(node.attr)
    return None


def _is_table(node) -> bool:
    """`config.get(...)` / `neural_arch.config.get(...)`: the table's reader."""
    return (isinstance(node, ast.Name) and node.id.endswith("config")) or (  # config, _config
        isinstance(node, ast.Attribute) and node.attr == "config")


def environment_reads(trees) -> list:
    """(file, line, name) for every read of a NEURAL_ARCH_* variable that bypasses the table."""
    constants = {rel: _env_constants(tree) for rel, tree in trees.items()}
    imported = {k: v for found in constants.values() for k, v in found.items()}
    reads = []
    for rel, tree in trees.items():
        if rel in READER:
            continue
        for node in ast.walk(tree):
            name, arg = None, None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                if node.func.attr in ("get", "getenv") and not _is_table(node.func.value):
                    arg = node.args[0]
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                arg = node.slice
            elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                arg = node.left
            if arg is not None:
                name = _setting_name(arg, constants[rel], imported)
            if name:
                reads.append((rel, node.lineno, name))
    return reads


def _package_trees() -> dict:
    """Parsed modules that can read a setting: those naming one, or naming a constant bound to one
    (parsing only these keeps the test well under a second)."""
    texts = {path.relative_to(ROOT).as_posix(): path.read_text() for path in (ROOT / "neural_arch").rglob("*.py")}
    trees = {rel: ast.parse(text, rel) for rel, text in texts.items() if "NEURAL_ARCH_" in text}
    names = {name for tree in trees.values() for name in _env_constants(tree)}
    for rel, text in texts.items():
        if rel not in trees and any(name in text for name in names):
            trees[rel] = ast.parse(text, rel)
    return trees


def test_only_the_table_reads_neural_arch_variables():
    trees = _package_trees()
    reads = environment_reads(trees)
    offenders = sorted({f"{rel}:{line} ({name})" for rel, line, name in reads})
    assert not offenders, ("read these through neural_arch.config.get(name, environ) (or "
                           f"neural_arch.config.get): {offenders}")


def test_the_scanner_sees_every_form_of_read():
    # The scanner itself, on a made-up module: each form of a direct read is found, the table's is not.
    source = '''
import os
X_ENV = "NEURAL_ARCH_X"
a = os.environ.get("NEURAL_ARCH_A")
b = os.getenv(X_ENV)
c = env["NEURAL_ARCH_C"]
d = "NEURAL_ARCH_D" in os.environ
e = (environ or os.environ).get(stall.Y_ENV, "")
ok = config.get("NEURAL_ARCH_OK", environ) or _config.get("NEURAL_ARCH_OK") or os.environ.get("HOME")
env["NEURAL_ARCH_WRITE"] = "1"
'''
    trees = {"neural_arch/fake.py": ast.parse(source), "neural_arch/stall.py": ast.parse('Y_ENV = "NEURAL_ARCH_Y"')}
    reads = environment_reads(trees)
    assert [(line, name) for _, line, name in reads] == [
        (4, "NEURAL_ARCH_A"), (5, "NEURAL_ARCH_X"), (6, "NEURAL_ARCH_C"), (7, "NEURAL_ARCH_D"), (8, "NEURAL_ARCH_Y")]
