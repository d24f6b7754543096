"""A dead or hung pipeline stage is an error on its neighbouring stages naming it, never a hang.

Three stages (gloo, fresh processes per case): the middle one dies (``os._exit``) or sleeps past the
pipeline group's 2 s timeout in the second step; both other stages must raise a ``PipelineError``
that names stage 1 and global rank 1, within the timeout."""

import pp_rank_fns as fns
import pytest

from neural_arch.distributed.testing import run_ranks

# The pipeline group's timeout: a hung or dead stage is seen by it, so each case waits it out once.
TIMEOUT = 2.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["die", "hang"])
def test_dead_stage_is_named_on_every_other_stage(mode, tmp_path):
    results = run_ranks(fns.fault_run, 3, args=(mode, 1, TIMEOUT, str(tmp_path)), timeout=60)
    victim = results[1]
    if mode == "die":
        assert not victim.ok and victim.exitcode == 3
    else:
        assert victim.ok and victim.value == "slept"
    for r in (0, 2):
        assert results[r].ok, results[r].error
        text = results[r].value
        assert text.startswith("PipelineError"), text
        assert "stage 1 (global rank 1)" in text, text
        seconds = float(text.rsplit("[after ", 1)[1].rstrip("s]"))
        assert seconds < TIMEOUT + 20, text
