"""The digits example reaches >= 95% held-out accuracy (a short run of its main())."""

import importlib.util
import pathlib

import pytest

pytest.importorskip("sklearn")

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"


@pytest.mark.timeout(120)
def test_train_digits_reaches_95_percent(capsys):
    spec = importlib.util.spec_from_file_location("train_digits_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    accuracy = module.main(["--epochs", "12", "--no-progress", "--seed", "0"])
    out = capsys.readouterr().out
    assert "final test accuracy:" in out
    assert accuracy >= 0.95, out
