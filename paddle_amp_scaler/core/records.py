"""What the scaler knows of each optimizer during an iteration, and the order its stages
come in: unscaled at most once, then stepped at most once, until the iteration ends."""

from __future__ import annotations

from typing import Any

from paddle import Tensor
from paddle.amp.grad_scaler import OptimizerState

from .kernels import Verdict


class OptimizerRecord:
    """One optimizer in the current iteration.

    Its ``stage`` (values of Paddle's ``OptimizerState``: INIT, UNSCALED, STEPPED) is what
    Paddle's trainers read and write as ``scaler._optimizer_states[id(opt)]["state"]``.
    """

    def __init__(self) -> None:
        self.stage = OptimizerState.INIT
        self.verdict: Verdict | None = None
        # What was unscaled and checked; None where a replaced _unscale did that.
        self.params: list[Any] | None = None
        self.grads: list[Tensor | None] | None = None
        # Whether any gradient was there to check: an optimizer stepped with none (no
        # backward() since its gradients were cleared) tells the update rule nothing.
        # Worked out once, where the gradients are recorded: a step asks twice.
        self.checked = True

    def __getitem__(self, key: str) -> Any:
        if key != "state":
            raise KeyError(key)
        return self.stage

    def __setitem__(self, key: str, value: Any) -> None:
        if key != "state":
            raise KeyError(key)
        self.stage = value

    def unscaled(
        self, verdict: Verdict, params: list[Any] | None, grads: list[Tensor | None]
    ) -> None:
        """Record what an unscale found in ``grads``, the gradients of ``params``."""
        self.verdict, self.params, self.grads = verdict, params, grads
        self.checked = any(grad is not None for grad in grads)
        self.stage = OptimizerState.UNSCALED

    def refuse_unscale(self) -> None:
        if self.stage is OptimizerState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last "
                "update(); call it at most once per optimizer per iteration"
            )
        if self.stage is OptimizerState.STEPPED:
            raise RuntimeError(
                "unscale_() was called after step() for this optimizer; call unscale_() "
                "before step(), or call update() to start the next iteration"
            )

    def refuse_step(self) -> None:
        if self.stage is OptimizerState.STEPPED:
            raise RuntimeError(
                "step() has already been called for this optimizer since the last "
                "update(); call scaler.update() once per iteration, after the last step()"
            )
