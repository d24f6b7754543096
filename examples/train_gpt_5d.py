#!/usr/bin/env python3
"""Train a small GPT with up to five kinds of parallelism at once: data, tensor, pipeline, context, expert.

World = pp x dp x cp x tp ranks on one ``init_device_mesh`` with named dimensions, outermost first::

    ("pp", "dp", "cp", "tp")        # torchtitan's order; the last dimension holds consecutive ranks

The order follows how much each dimension talks: tensor parallelism all-reduces inside every
layer (innermost: consecutive ranks, the ones that share a host and its fastest links), context
parallelism passes K/V blocks round a ring in every attention, data parallelism all-reduces
gradients once per step, and pipeline parallelism only sends activations to the neighbouring
stage (outermost: it tolerates the slowest links).

Expert parallelism lies *inside* data parallelism, as Megatron does: ``--ep`` divides ``--dp``,
the dp ranks are cut into blocks of ``ep`` consecutive dp indices that share out the experts
(the **ep** group), and the ranks at the same position of every block hold the same experts (the
**expert-data-parallel** group, which averages those experts' gradients). The dp dimension is
thus ``(dp / ep, ep)`` in row-major order. The MoE statistics (load-balancing loss, capacity)
cover the whole batch of the step: every token of every dp and cp rank.

What each dimension does here:

* ``--tp``: Megatron's plan (``parallelize_gpt``): heads, MLP and vocabulary split; MoE layers
  stay replicated inside the tp group (every tp rank routes the same tokens identically);
* ``--cp``: the sequence split in 2 x cp chunks (head-tail layout), ring attention, gradients
  averaged over cp (``parallelize_gpt(..., context_parallel=True)``);
* ``--ep`` > 1: MoE in every ``--moe-every``-th block, ``--experts`` experts (default 2 x ep),
  split over the ep group (``parallelize_moe``); ``--experts`` with ``--ep 1`` gives MoE without
  expert parallelism;
* ``--dp``: ``DistributedDataParallel`` over the dp group (expert parameters over their
  expert-data-parallel group); with ``--pp`` > 1 each pipeline stage averages over dp itself;
* ``--pp``: the blocks cut into pp stages, 1F1B over ``--microbatches`` micro-batches (with
  ``--cp`` every stage sees its rank's sequence shard: the first stage looks up the global
  positions, the last computes the loss on its shard's targets).

MoE with ``--pp`` (Megatron-core's way): a stage only back-propagates its output's gradient, so
each MoE layer's output carries its aux loss (``nn.moe.MoEAuxLossAutoScaler``, scale
``1 / --microbatches``, the main loss's scale); the MoE statistics (load-balancing loss,
capacity) cover one micro-batch of the whole step (every dp and cp rank's share of it), and a
step's loss is ``mean over micro-batches of (LM loss + aux losses)``. The single-process
reference of ``--verify`` accumulates the same micro-batches (micro-batch ``i`` = every dp rank's
``i``-th slice of its rows, in rank order), so it compares like with like. Expert parameters are
reduced over their expert-data-parallel group, the others averaged over dp, after each step's
last backward (what DDP does).

``--cp`` with ``--capacity-factor``: the tokens an expert drops are chosen by their global
position (``parallelize_moe(..., context_parallel_group=...)``; ``nn.MoE``'s rule), so the
head-tail layout drops exactly the assignments one process drops on the whole sequence.

Start it any way::

    python examples/train_gpt_5d.py                       # one process
    python -m neural_arch.distributed.launcher --standalone --nproc_per_node 8 \\
        examples/train_gpt_5d.py --dp 2 --cp 2 --tp 2 --verify
    python -m neural_arch.distributed.launcher --standalone --nproc_per_node 4 \\
        examples/train_gpt_5d.py --dp 4 --ep 2 --verify
    python -m neural_arch.distributed.launcher --standalone --nproc_per_node 8 \\
        examples/train_gpt_5d.py --pp 2 --dp 2 --cp 2 --ep 2 --moe-every 1 --capacity-factor 1.0 --verify
    mpiexec -n 4 python examples/train_gpt_5d.py --dp 2 --pp 2 --verify

``--verify`` trains in float64 and also a single-process copy on the same global batches, then
prints one verdict line (the largest difference of the loss curve and of the final parameters,
PASS at <= 1e-10) and exits non-zero on a mismatch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per rank (set before numpy loads)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import neural_arch.distributed as dist
import neural_arch.nn.functional as F
from neural_arch import nn, optim
from neural_arch.core.tensor import Tensor, manual_seed
from neural_arch.data import make_token_sequences

TOLERANCE = 1e-10
MESH_DIMS = ("pp", "dp", "cp", "tp")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for dim, what in (("dp", "data-parallel replicas"), ("tp", "tensor-parallel ranks"),
                      ("pp", "pipeline stages"), ("cp", "context-parallel ranks (sequence shards)"),
                      ("ep", "expert-parallel ranks, inside dp (MoE on when > 1)")):
        p.add_argument(f"--{dim}", type=int, default=1, help=what)
    p.add_argument("--experts", type=int, default=None, help="experts per MoE layer (default: 2 x ep, 0 = no MoE "
                   "when ep is 1)")
    p.add_argument("--moe-every", type=int, default=2, help="MoE in every n-th block (2: every other, GShard)")
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--capacity-factor", type=float, default=None)
    p.add_argument("--aux-loss-coef", type=float, default=0.01)
    p.add_argument("--microbatches", type=int, default=2, help="micro-batches per step with --pp > 1")
    p.add_argument("--batch-size", type=int, default=2, help="sequences per data-parallel replica per step")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=8)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verify", action="store_true", help="float64, and compare with single-process training")
    args = p.parse_args(argv)
    if args.experts is None:
        args.experts = 2 * args.ep if args.ep > 1 else 0
    return args


def check_layout(args, world: int) -> str | None:
    """None when the flags describe a layout this script runs on ``world`` ranks, else the reason."""
    sizes = {d: getattr(args, d) for d in ("dp", "tp", "pp", "cp", "ep")}
    bad = [f"--{d} {s}" for d, s in sizes.items() if s < 1]
    if bad:
        return f"{', '.join(bad)}: every size must be at least 1"
    if args.dp * args.tp * args.pp * args.cp != world:
        return (f"--dp {args.dp} x --tp {args.tp} x --pp {args.pp} x --cp {args.cp} = "
                f"{args.dp * args.tp * args.pp * args.cp} must equal the world size {world} (--ep lies inside --dp)")
    if args.dp % args.ep:
        return f"--ep {args.ep} must divide --dp {args.dp}: expert parallelism lies inside data parallelism"
    experts = args.experts
    if experts and experts % args.ep:
        return f"--experts {experts} must be a multiple of --ep {args.ep} (each ep rank holds experts / ep experts)"
    if args.ep > 1 and experts == 0:
        return f"--ep {args.ep} needs MoE layers: leave out --experts 0"
    if args.pp > 1 and args.batch_size % args.microbatches:
        return f"--microbatches {args.microbatches} must divide --batch-size {args.batch_size}"
    if args.pp > args.n_layer:
        return f"--pp {args.pp} needs at least as many blocks: --n-layer is {args.n_layer}"
    if args.cp > 1 and args.seq_len % (2 * args.cp):
        return (f"--seq-len {args.seq_len} must divide into 2 x --cp = {2 * args.cp} chunks (the head-tail layout "
                "of context parallelism)")
    if experts and args.n_layer < args.moe_every:
        return f"--n-layer {args.n_layer} has no MoE block with --moe-every {args.moe_every}"
    return None


def build_model(args):
    manual_seed(args.seed)  # same initial weights on every rank and in the reference
    moe = {}
    if args.experts:
        moe = {"moe_num_experts": args.experts, "moe_every": args.moe_every,
               "moe_kwargs": {"top_k": min(args.top_k, args.experts), "capacity_factor": args.capacity_factor,
                              "aux_loss_coef": args.aux_loss_coef}}
    model = nn.GPT(vocab_size=args.vocab, block_size=args.seq_len, n_layer=args.n_layer, n_head=args.n_head,
                   n_embd=args.n_embd, **moe)
    return model.double() if args.verify else model


def lm_loss(logits, target):
    b, t, v = logits.shape
    return F.cross_entropy(logits.reshape(b * t, v), np.asarray(target).reshape(b * t))


def enumerate_groups(ranks: np.ndarray, dims: tuple[int, ...]):
    """This rank's group over the mesh dimensions ``dims`` of the rank array ``ranks`` (torch's
    ``mesh[names]._flatten()``): one group per setting of the other dimensions. Collective."""
    from neural_arch.distributed.subgroups import new_subgroups_by_enumeration

    rest = [d for d in range(ranks.ndim) if d not in dims]
    lists = np.transpose(ranks, rest + list(dims)).reshape(-1, int(np.prod([ranks.shape[d] for d in dims])))
    mine, _ = new_subgroups_by_enumeration(lists.tolist())
    return mine


class Layout:
    """The device mesh and every group a rank needs (every rank builds all of them: group creation
    is collective)."""

    def __init__(self, args):
        from neural_arch.distributed.device_mesh import init_device_mesh

        self.pp, self.dp, self.cp, self.tp, self.ep = args.pp, args.dp, args.cp, args.tp, args.ep
        self.mesh = init_device_mesh("cpu", (self.pp, self.dp, self.cp, self.tp), mesh_dim_names=MESH_DIMS)
        self.dp_rank, self.pp_rank = self.mesh.get_local_rank("dp"), self.mesh.get_local_rank("pp")
        self.moe_batch_group = self.ep_group = self.expert_dp_group = None
        if args.experts:
            # the tokens of one step: every dp and cp rank (at this pp and tp position)
            self.moe_batch_group = enumerate_groups(self.mesh.mesh, (1, 2))
            # dp = (dp / ep, ep): "ep" = consecutive dp indices, "edp" = the same position in every block
            split = self.mesh.mesh.reshape(self.pp, self.dp // self.ep, self.ep, self.cp, self.tp)
            self.ep_group = enumerate_groups(split, (2,))
            self.expert_dp_group = enumerate_groups(split, (1,))

    def group(self, name):
        return self.mesh.get_group(name)


def parallelize(model, args, lay: Layout):
    """Apply TP, CP and EP to ``model`` in place (pp and dp come after, they wrap it)."""
    from neural_arch.distributed.tensor.parallel.gpt import parallelize_gpt

    if lay.tp > 1:
        parallelize_gpt(model, lay.group("tp"), loss_parallel=False)  # logits gathered: the plain loss works
    if lay.cp > 1:
        parallelize_gpt(model, lay.group("cp"), context_parallel=True)
    if args.experts and lay.moe_batch_group.size() > 1:
        from neural_arch.distributed.expert_parallel import parallelize_moe

        parallelize_moe(model, ep_group=lay.ep_group, dp_group=lay.moe_batch_group,
                        expert_dp_group=lay.expert_dp_group,
                        context_parallel_group=lay.group("cp") if lay.cp > 1 else None)
    return model


def moe_layers(module) -> list:
    """Every ``nn.MoE`` inside ``module`` (a pipeline stage holds some of the model's)."""
    return [m for m in module.modules() if isinstance(m, nn.MoE)]


def sync_stage_gradients(params, dp_group) -> None:
    """A pipeline stage's gradients made those of the step's whole batch, as DDP would: replicated
    parameters averaged over dp, expert parameters summed over their expert-data-parallel group and
    divided by the dp size (``ExpertGradReducer``). Collective over dp."""
    from neural_arch.distributed.ddp.expert_grads import ExpertGradReducer, split_expert_parameters

    replicated, experts = split_expert_parameters([p for p in params if p.requires_grad])
    if replicated and dp_group.size() > 1:
        flat = np.concatenate([(p.grad.data if p.grad is not None else np.zeros_like(p.data)).ravel()
                               for p in replicated])
        dp_group.backend.allreduce(flat, dist.ReduceOp.SUM)
        flat /= dp_group.size()
        offset = 0
        for p in replicated:
            p.grad = Tensor(flat[offset:offset + p.data.size].reshape(p.data.shape))
            offset += p.data.size
    ExpertGradReducer(experts, world_size=dp_group.size()).reduce()


def global_names(model) -> dict:
    """Local parameter name -> the single-process model's name (an expert's local index -> its global one)."""
    out = {}
    for i, block in enumerate(model.blocks):
        ids = getattr(getattr(block.mlp, "placement", None), "expert_ids", None)
        for j, e in enumerate(ids or ()):
            out[f"blocks.{i}.mlp.experts.{j}."] = f"blocks.{i}.mlp.experts.{e}."
    return out


def full_params(module, tp_group, renames: dict) -> dict:
    """This rank's parameters under the single-process names, unsharded over tp (collective over tp)."""
    if tp_group is not None and tp_group.size() > 1:
        from neural_arch.distributed.tensor.parallel.state_dict import full_state_dict

        named = full_state_dict(module)
    else:
        named = {n: p.data for n, p in module.named_parameters()}
    out = {}
    for name, value in named.items():
        for local, glob in renames.items():
            if name.startswith(local):
                name = glob + name[len(local):]
                break
        out[name] = value
    return out


class Trainer:
    """One optimizer step on this rank's share of a global batch, for either family of layouts:
    dp x tp x cp x ep (the whole model on every rank, DDP over dp) or pp x dp x cp x tp (pipeline
    stages, each averaging its gradients over dp)."""

    def __init__(self, args, lay: Layout):
        self.lay = lay
        model = parallelize(build_model(args), args, lay)
        self.model = model
        if lay.pp > 1:
            from neural_arch.distributed import pipelining as pl

            pipe = pl.pipeline(model, num_stages=lay.pp, balance="layers")
            # with MoE the stage cannot average over dp itself (expert parameters differ per rank)
            self.stage_dp = lay.group("dp") if lay.dp > 1 and args.experts else None
            self.stages = [pipe.build_stage(lay.pp_rank, group=lay.group("pp"),
                                            dp_group=lay.group("dp") if lay.dp > 1 and not args.experts else None)]
            self.schedule = pl.Schedule1F1B(self.stages[0], args.microbatches, loss_fn=lm_loss)
            params = [p for st in self.stages for p in st.submodule.parameters()]
            self.modules = [st.submodule for st in self.stages]
            self.aux_values: list[float] = []
            for moe in moe_layers(self.stages[0].submodule):
                # the aux loss rides on the output's gradient, scaled like each micro-batch's loss
                moe.aux_loss_backward_scale = 1.0 / args.microbatches
                moe.register_forward_hook(self._record_aux_loss)
            self.microbatches = args.microbatches
        else:
            self.stages = None
            self.net = dist.DistributedDataParallel(model, process_group=lay.group("dp")) if lay.dp > 1 else model
            params = list(self.net.parameters())
            self.modules = [model]
        self.opt = optim.AdamW(params, lr=args.lr, weight_decay=0.01)

    def _record_aux_loss(self, moe, _args, _out) -> None:
        """Forward hook of a stage's MoE layer: its aux loss of this micro-batch, for the step's loss."""
        self.aux_values.append(float(moe.aux_loss.item()))

    def step(self, x, y) -> float | None:
        """Train on this replica's rows ``x``, ``y`` (whole sequences); the local loss (None off the last stage)."""
        lay = self.lay
        if lay.cp > 1:
            from neural_arch.distributed.tensor.experimental import shard_sequence

            x, y = shard_sequence(x, 1, lay.group("cp")), shard_sequence(y, 1, lay.group("cp"))
        if self.stages is not None:
            stage = self.stages[0]
            self.aux_values.clear()
            losses = self.schedule.step(*((x,) if stage.is_first else ()), target=y if stage.is_last else None)
            if self.stage_dp is not None:
                sync_stage_gradients(stage.submodule.parameters(), self.stage_dp)
            loss = float(np.mean([float(m.item()) for m in losses])) if stage.is_last else None
            if self.aux_values:   # this stage's MoE layers: the mean over micro-batches of their sum
                loss = (loss or 0.0) + sum(self.aux_values) / self.microbatches
        else:
            out = lm_loss(self.net(x), y)
            if self.model.aux_loss is not None:
                out = out + self.model.aux_loss
            out.backward()
            loss = float(out.item())
        self.opt.step()
        self.opt.zero_grad()
        return loss

    def params(self) -> dict:
        renames = global_names(self.model)
        tp = self.lay.group("tp") if self.lay.tp > 1 else None
        out = {}
        for m in self.modules:
            out.update(full_params(m, tp, renames))
        return out


def global_loss(local: float | None, lay: Layout) -> float:
    """The step's loss over the global batch, from every rank's local loss (collective over the world).

    A rank of the last pipeline stage holds its tokens' mean loss (plus the aux loss, the same on all
    of them; the tp ranks of one shard hold the same value), the others hold none: the global loss
    is the mean over the holders, whose shards all have the same number of tokens. With MoE under
    pipelining every rank also holds its stage's aux losses (the same on the stage's dp x cp x tp
    ranks, as many as the holders): the sum over all ranks divided by the holders adds each stage's
    aux loss once."""
    holders = lay.dp * lay.cp * lay.tp            # the last stage's ranks
    total = np.array([0.0 if local is None else local])
    dist.all_reduce(total)
    return float(total[0]) / holders


def reference_step(ref, opt, X, Y, args, lay: Layout) -> float:
    """One single-process step on the global batch ``X``, ``Y`` (``dp`` blocks of ``batch_size``
    rows); its loss. With MoE under pipelining, as the pipeline computes it: micro-batch ``i`` is
    every dp block's ``i``-th slice (rank order), the aux losses cover one micro-batch, and the
    gradient is that of ``mean_i(LM loss_i + aux_i)``."""
    m = args.microbatches if lay.pp > 1 and args.experts else 1
    size = args.batch_size // m
    total = 0.0
    for i in range(m):
        rows = np.concatenate([np.arange(d * args.batch_size + i * size, d * args.batch_size + (i + 1) * size)
                               for d in range(lay.dp)])
        loss = lm_loss(ref(Tensor(X[rows])), Y[rows])
        if ref.aux_loss is not None:
            loss = loss + ref.aux_loss
        (loss * (1.0 / m) if m > 1 else loss).backward()
        total += float(loss.item()) / m
    opt.step()
    opt.zero_grad()
    return total


def main(argv=None) -> int:
    args = parse_args(argv)
    dist.init_process_group()
    world, rank = dist.get_world_size(), dist.get_rank()
    problem = check_layout(args, world)
    if problem:
        if rank == 0:
            print(f"train_gpt_5d: {problem}", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        return 2
    lay = Layout(args)
    trainer = Trainer(args, lay)
    ref = ref_opt = None
    if args.verify:
        ref = build_model(args)
        ref_opt = optim.AdamW(ref.parameters(), lr=args.lr, weight_decay=0.01)

    B = args.batch_size
    X, Y = make_token_sequences(B * lay.dp * args.steps, args.seq_len, args.vocab, seed=args.seed, task="sum")
    if rank == 0:
        local = sum(int(p.data.size) for m in trainer.modules for p in m.parameters())
        print(f"mesh {dict(zip(MESH_DIMS, lay.mesh.shape))} ep={lay.ep} experts={args.experts}; GPT with "
              f"{local} parameters on rank 0", flush=True)
    worst_loss = 0.0
    t0 = time.perf_counter()
    for step in range(args.steps):
        g = slice(step * B * lay.dp, (step + 1) * B * lay.dp)  # the global batch of this step
        mine = slice(g.start + lay.dp_rank * B, g.start + (lay.dp_rank + 1) * B)
        loss = global_loss(trainer.step(X[mine], Y[mine]), lay)
        if ref is not None:
            worst_loss = max(worst_loss, abs(loss - reference_step(ref, ref_opt, X[g], Y[g], args, lay)))
        if rank == 0:
            print(f"step {step:3d}  loss {loss:.6f}", flush=True)
    elapsed = time.perf_counter() - t0
    if rank == 0 and args.experts:
        for i, block in enumerate(trainer.model.blocks):
            # the last step's whole batch (every dp and cp rank); with --pp its last micro-batch, on
            # this rank's stage
            if isinstance(block.mlp, nn.MoE) and block.mlp.tokens_per_expert is not None:
                print(f"moe block {i}: tokens per expert {block.mlp.tokens_per_expert.tolist()}, "
                      f"{block.mlp.dropped} assignments dropped by capacity", flush=True)
    status = 0
    if ref is not None:
        ref_sd = dict(ref.named_parameters())
        mine = trainer.params()
        missing = [n for n in mine if n not in ref_sd]
        diff = max(float(np.abs(np.asarray(a) - ref_sd[n].data).max()) for n, a in mine.items() if n in ref_sd)
        worst = np.array([diff, worst_loss, float(len(missing))])
        dist.all_reduce(worst, dist.ReduceOp.MAX)
        ok = worst[0] <= TOLERANCE and worst[1] <= TOLERANCE and worst[2] == 0
        status = 0 if ok else 1
        if rank == 0:
            print(f"verify: {'PASS' if ok else 'FAIL'} pp={lay.pp} dp={lay.dp} cp={lay.cp} tp={lay.tp} ep={lay.ep}: "
                  f"max |loss - single process| = {worst[1]:.3e}, max |parameter - single process| = {worst[0]:.3e} "
                  f"(tolerance {TOLERANCE:.0e})", flush=True)
    if rank == 0:
        print(f"done: {args.steps} steps in {elapsed:.1f} s", flush=True)
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
