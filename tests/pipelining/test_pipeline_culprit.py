"""A failed stage two hops away is named on every rank, not only by its neighbours.

Four stages (gloo, fresh processes per case, pipeline group timeout 2 s); in the second step
stage 3 raises in the forward of micro-batch 2, exits, or hangs past the timeout. Every other
rank -- rank 0 and 1 included, which never talk to stage 3 -- must fail with a ``PipelineError``
whose message names stage 3 and global rank 3 (and, when it raised, the action, micro-batch and
error), within the timeout plus a few seconds. The raising rank's own error names itself.
"""

import re

import pp_rank_fns as fns
import pytest

from neural_arch.distributed.testing import run_ranks

TIMEOUT = 2.0


def _seconds(text: str) -> float:
    return float(re.search(r"\[after ([0-9.]+)s\]$", text).group(1))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode, schedule", [("raise", "1f1b"), ("raise", "zbh1"), ("die", "1f1b"),
                                            ("hang", "1f1b")])
def test_failed_stage_is_named_on_every_rank(mode, schedule, tmp_path):
    results = run_ranks(fns.culprit_run, 4, args=(mode, 3, TIMEOUT, schedule, str(tmp_path)), timeout=90)
    victim = results[3]
    if mode == "die":
        assert not victim.ok and victim.exitcode == 3
    elif mode == "hang":
        assert victim.ok and victim.value == "slept"
    else:
        assert victim.ok, victim.error
        text = victim.value
        assert text.startswith("RuntimeError: injected failure"), text
        assert "pipeline stage 3 (global rank 3) failed in F2@s3 (micro-batch 2)" in text, text
    for r in (0, 1, 2):
        assert results[r].ok, results[r].error
        text = results[r].value
        assert text.startswith("PipelineError: pipeline stage 3 (global rank 3)"), f"rank {r}: {text}"
        if mode == "raise":
            assert "failed in F2@s3 (micro-batch 2): RuntimeError: injected failure" in text, text
            # the failing stage poisons the group: nobody waits for a timeout
            assert _seconds(text) < TIMEOUT, f"rank {r}: {text}"
        else:
            assert "stopped answering" in text, text
            assert _seconds(text) < 2 * TIMEOUT + 15, f"rank {r}: {text}"
