"""Every row of docs/porting.md's "Imports" table imports: a PyTorch user's guess just works.

The table is parsed, so a row added there is tested here, and a row whose import breaks fails."""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "porting.md"


def _rows() -> list[str]:
    text = DOC.read_text()
    table = text.split("## Imports", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in table.splitlines():
        cells = line.split("|")
        if len(cells) < 3 or not cells[2].strip().startswith("`"):
            continue
        # every code span of the neural_arch column that is an import statement
        rows += [c for c in re.findall(r"`([^`]+)`", cells[2]) if c.startswith(("from neural_arch", "import neural_arch"))]
    return rows


ROWS = _rows()


def test_the_table_is_there():
    assert len(ROWS) >= 20, ROWS


@pytest.mark.parametrize("statement", ROWS)
def test_each_import_works(statement):
    m = re.match(r"from (\S+) import (.+)$", statement)
    if m is None:  # `import neural_arch.x as y`
        importlib.import_module(statement.split()[1])
        return
    module = importlib.import_module(m.group(1))
    names = m.group(2).strip()
    if names == "...":
        assert getattr(module, "__all__", None), f"{m.group(1)} has no __all__ to import"
        return
    for part in names.split(","):
        name = part.split(" as ")[0].strip()
        assert hasattr(module, name) or importlib.util.find_spec(f"{m.group(1)}.{name}"), f"{statement}: no {name}"


def test_torch_style_top_level_names():
    import neural_arch as na
    from neural_arch.amp import autocast

    assert na.autocast is autocast
    assert na.nn.functional.scaled_dot_product_attention is not None
    # the seeds' paths stay faces of the homes
    from neural_arch.distributed.model_parallel import TensorParallel
    from neural_arch.distributed.tensor.parallel import TensorParallel as home

    assert TensorParallel is home
