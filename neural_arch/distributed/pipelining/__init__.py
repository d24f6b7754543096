"""Pipeline parallelism: split a model into stages, run micro-batches through them by a schedule.

===========================  ===========================================================================
module                       what
===========================  ===========================================================================
``schedules``                schedules as data: ``Action`` records per rank, builders, simulation, time-lines
``split``                    ``pipeline(module, split_points | num_stages, balance)`` -> ``Pipe`` of stages
``stage``                    ``PipelineStage``: one stage's forward/backward per micro-batch (+ dp averaging)
``p2p``                      tags per edge, the once-per-step shape header, ``PipelineError``
``executor``                 runs one rank's action list (isend/irecv overlap, timeouts)
``runtime``                  ``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B`` (torch names),
                             ``ScheduleZBH1``, ``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``
``zero_bubble``              ZB-H1 as data: ``zero_bubble_plan(p, m)``; the list scheduler ZB-V, IZB share
``zero_bubble_v``            ZB-V as data (two stages per rank in a V): ``zero_bubble_v_plan(p, m)``
``zero_bubble_interleaved``  interleaved zero bubble as data (loop placement, v per rank)
``weight_grad``              split backward: Linear weight gradients deferred from ``B`` to ``W``
``failure``                  every rank's error names the failed stage (store records + poison)
``generation``               pipeline-parallel generation: ``PipelineGenerator``; the decode schedule as data
                             (``decode_plan``, ``simulate_decode``, ``format_decode_timeline``, ``decode_makespan``)
===========================  ===========================================================================

Example (2 ranks; see ``examples/train_gpt_3d.py``)::

    from neural_arch.distributed.pipelining import pipeline, PipelineStage, Schedule1F1B
    pipe = pipeline(model, num_stages=2)
    stage = pipe.build_stage(rank)                     # PipelineStage(pipe[rank], rank, 2)
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=loss_fn)
    losses = schedule.step(x) if rank == 0 else schedule.step(target=y)
"""

from neural_arch.distributed.pipelining.generation import (
    DecodeAction,
    DecodeEvent,
    PipelineGenerator,
    decode_makespan,
    decode_plan,
    format_decode_timeline,
    simulate_decode,
)
from neural_arch.distributed.pipelining.p2p import PipelineError
from neural_arch.distributed.pipelining.runtime import (
    PipelineSchedule,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBH1,
    ScheduleZBVZeroBubble,
    stage_indices,
)
from neural_arch.distributed.pipelining.schedules import (
    Action,
    DeadlockError,
    Event,
    PipelinePlan,
    Simulation,
    bubble_fraction,
    format_actions,
    format_schedule,
    format_timeline,
    generate_stage_to_rank_mapping,
    gpipe_plan,
    interleaved_1f1b_plan,
    one_f_one_b_plan,
    simulate,
    stage_to_rank,
    theoretical_bubble,
)
from neural_arch.distributed.pipelining.split import GPTStage, Pipe, pipeline
from neural_arch.distributed.pipelining.stage import PipelineStage
from neural_arch.distributed.pipelining.zero_bubble import zero_bubble_plan, zero_bubble_theory
from neural_arch.distributed.pipelining.zero_bubble_interleaved import (
    interleaved_zero_bubble_plan,
    interleaved_zero_bubble_theory,
)
from neural_arch.distributed.pipelining.zero_bubble_v import zero_bubble_v_plan, zero_bubble_v_theory

__all__ = [
    "Action",
    "DeadlockError",
    "DecodeAction",
    "DecodeEvent",
    "Event",
    "GPTStage",
    "Pipe",
    "PipelineError",
    "PipelineGenerator",
    "PipelinePlan",
    "PipelineSchedule",
    "PipelineStage",
    "Schedule1F1B",
    "ScheduleGPipe",
    "ScheduleInterleaved1F1B",
    "ScheduleInterleavedZeroBubble",
    "ScheduleZBH1",
    "ScheduleZBVZeroBubble",
    "Simulation",
    "bubble_fraction",
    "decode_makespan",
    "decode_plan",
    "format_actions",
    "format_decode_timeline",
    "format_schedule",
    "format_timeline",
    "generate_stage_to_rank_mapping",
    "gpipe_plan",
    "interleaved_1f1b_plan",
    "interleaved_zero_bubble_plan",
    "interleaved_zero_bubble_theory",
    "one_f_one_b_plan",
    "pipeline",
    "simulate",
    "simulate_decode",
    "stage_indices",
    "stage_to_rank",
    "theoretical_bubble",
    "zero_bubble_plan",
    "zero_bubble_theory",
    "zero_bubble_v_plan",
    "zero_bubble_v_theory",
]
