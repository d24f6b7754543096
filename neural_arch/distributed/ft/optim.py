"""``OptimizerWrapper``: the step transaction hidden in an optimizer (torchft's ``OptimizerWrapper``).

``zero_grad()`` starts the step (joins the quorum, heals if behind) and ``step()`` applies it only
if the quorum commits, so a plain training loop becomes fault tolerant unchanged::

    optimizer = OptimizerWrapper(manager, optim.SGD(model.parameters(), lr=0.1))
    model = DistributedDataParallel(manager, model)     # averages gradients across the quorum
    for batch in batches:
        optimizer.zero_grad()                           # manager.start_quorum()
        loss_fn(model(batch)).backward()
        optimizer.step()                                # only if manager.should_commit()
"""

from __future__ import annotations

__all__ = ["OptimizerWrapper"]


class OptimizerWrapper:
    """Wrap ``optimizer`` so that ``zero_grad`` starts a quorum and ``step`` runs only on commit.

    ``step()`` returns whether the step was committed (a discarded step leaves the parameters and
    the optimizer state as they were; the loop simply goes on, and the data it fetched is fetched
    again by the new quorum when the sampler follows ``Manager.current_step``).

    Example::

        opt = OptimizerWrapper(manager, optim.Adam(model.parameters(), lr=1e-3))
        opt.zero_grad(); loss.backward(); committed = opt.step()
    """

    def __init__(self, manager, optimizer):
        self.manager, self.optim = manager, optimizer

    def zero_grad(self, set_to_none: bool = False) -> None:
        self.manager.start_quorum()
        self.optim.zero_grad()

    def step(self) -> bool:
        if self.manager.should_commit():
            self.optim.step()
            return True
        return False

    def state_dict(self) -> dict:
        return self.optim.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optim.load_state_dict(state)

    @property
    def param_groups(self):
        return self.optim.param_groups
