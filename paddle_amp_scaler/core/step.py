"""``OptimizerStep``: one optimizer's iteration in the scaler's hands, from the unscale to
the step or its skip, and the ``Verdict`` it leaves for the end of the iteration.

An optimizer's step moves through Paddle's three stages, INIT, UNSCALED and STEPPED, and
nothing but its ``OptimizerStep`` writes them. Its work, in order:

1. ``unscale``: show the scaled gradients to the monitors that ask (they count or
   measure them before the unscale writes them), divide them by the scale in place, check
   them for inf/nan, and agree on the verdict with the other ranks. Or ``check_given``:
   the same for true gradients a caller hands over (Keras' ``apply_gradients``). Or
   ``adopt``: take the verdict of a replaced ``_unscale`` (fleet's).
2. ``run``: step the optimizer so that it changes nothing where inf/nan was found, in
   the first of four ways that applies, and learn the verdict on the host where that is
   free.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import paddle
from paddle import Tensor
from paddle.amp.grad_scaler import OptimizerState

from . import distributed, kernels, optimizers

if TYPE_CHECKING:
    from .loss_scale import LossScale
    from .monitor import Monitor

logger = logging.getLogger("paddle_amp_scaler")


class Verdict(NamedTuple):
    """Whether an optimizer's gradients held inf/nan, from its unscale to the update.

    Args:
        flag: a bool [1] tensor on the device: the verdict, always there.
        on_host: the same as a host bool, where a step learnt it at no cost (an optimizer
            that reads its flag leaves it behind as one); None where only the device knows.
        amax: where measured, the gradients' largest magnitude as they came, float32 [1]
            on the device (meaningful only where nothing was found).
        loss_finite: at the end of an iteration, whether its losses (as ``scale()`` saw
            them) were all finite, a bool tensor; None where no loss was seen.

    A tuple, made every step: a frozen dataclass takes several times as long.
    """

    flag: Tensor
    on_host: bool | None = None
    amax: Tensor | None = None
    loss_finite: Tensor | None = None

    @staticmethod
    def of_steps(steps: Sequence[OptimizerStep]) -> Verdict | None:
        """The iteration's verdict, joined over the optimizers it stepped: whether any found
        inf/nan (on the host too where each of them knows it there), and the largest of
        their amaxes where each was measured. None where none had a gradient to check.
        """
        verdicts = [cast(Verdict, step.verdict) for step in steps if step.checked]
        if len(verdicts) <= 1:
            return verdicts[0] if verdicts else None

        amax = kernels.largest_of([verdict.amax for verdict in verdicts])
        known = [verdict.on_host for verdict in verdicts]
        if None not in known:
            # Known on the host: a flag that says it is any of theirs, with no operation.
            found = any(known)
            flag = next(verdict.flag for verdict in verdicts if verdict.on_host == found)
            return Verdict(flag, found, amax)

        return Verdict(kernels.any_of([verdict.flag for verdict in verdicts]), None, amax)


@dataclasses.dataclass
class Stepping:
    """What every optimizer's step takes from its scaler, made once with it.

    Args:
        loss_scale: the scale that divides the gradients; its rule lends the placeholders of
            the SGD skip's kernel.
        monitors: those that may look at the gradients before an unscale writes them.
        sync: the agreement of the verdicts over the ranks.
        all_finite: a bool [1] False on the device: the flag where nothing was checked.
    """

    loss_scale: LossScale
    monitors: Sequence[Monitor]
    sync: distributed.FoundInfSync
    all_finite: Tensor
    # The optimizer types already logged as taking no found-inf flag: once per type.
    logged_types: set[type] = dataclasses.field(default_factory=set)

    def __getstate__(self) -> dict[str, Any]:
        # A class may not pickle; the note is made again by a copy.
        return {**self.__dict__, "logged_types": set()}


# What ``run`` returns where it skipped the step without calling the optimizer.
SKIPPED = object()


class OptimizerStep:
    """One optimizer in the current iteration.

    Its ``stage`` (Paddle's ``OptimizerState``) is what Paddle's trainers read and write
    as ``scaler._optimizer_states[id(optimizer)]["state"]``. Every field starts as the
    class gives it, so that a new iteration's step costs no call, and only this class's
    methods change them.
    """

    stage = OptimizerState.INIT
    # Left by the unscale (or ``check_given``, or ``adopt``); the step may learn it on the host.
    verdict: Verdict | None = None
    # What was unscaled and checked; None where a replaced ``_unscale`` did that.
    params: list[Any] | None = None
    groups: kernels.Groups | None = None
    # Whether any gradient was there to check: a step with none (no backward() since they
    # were cleared) tells the rule nothing.
    checked = True

    def __getitem__(self, key: str) -> Any:
        return {"state": self.stage}[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key != "state":
            raise KeyError(key)
        self.stage = value

    def refuse_unscale(self) -> None:
        """``RuntimeError`` where this iteration has already unscaled or stepped."""
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
        """``RuntimeError`` where this iteration has already stepped."""
        if self.stage is OptimizerState.STEPPED:
            raise RuntimeError(
                "step() has already been called for this optimizer since the last "
                "update(); call scaler.update() once per iteration, after the last step()"
            )

    def unscale(self, optimizer: Any, stepping: Stepping, iteration: int) -> None:
        """Divide the optimizer's gradients by the scale in place and check them for inf/nan,
        shown first to the monitors that look at iteration ``iteration`` (1-based).
        """
        self.refuse_unscale()
        params = optimizers.parameters_of(optimizer)
        grads, amax = self._shown(params, None, stepping, iteration)

        if grads is None:
            # No monitor looks: the gradients are fetched and grouped at the least cost.
            groups, mesh = optimizers.grads_by_dtype(params)
        else:
            groups, mesh = kernels.grads_by_dtype_of(grads), distributed.mesh_of(grads)

        flag = kernels.unscale_and_check_(groups, stepping.loss_scale.scale, stepping.all_finite)
        self._decided(flag, amax, mesh, stepping)
        self.params, self.groups, self.checked = params, groups, bool(groups)

    def check_given(self, grads: Sequence[Tensor], stepping: Stepping, iteration: int) -> None:
        """Check true gradients that a caller hands over (not the optimizer's own), shown
        to the monitors as if scaled: the unscale by exactly 1 only checks them.
        """
        self.refuse_step()
        self.refuse_unscale()
        scale = stepping.loss_scale.scale
        grads = list(grads)
        _, amax = self._shown(None, grads, stepping, iteration, times=scale)

        groups = kernels.grads_by_dtype_of(grads)
        flag = kernels.unscale_and_check_(groups, paddle.ones_like(scale), stepping.all_finite)
        self._decided(flag, amax, distributed.mesh_of(grads), stepping)
        self.groups, self.checked = groups, bool(groups)

    def show_before_replaced_unscale(
        self, optimizer: Any, stepping: Stepping, iteration: int
    ) -> Tensor | None:
        """Show the gradients to the monitors before a replaced ``_unscale`` (fleet's, which
        neither counts nor measures) writes them; returns the amax, agreed over the ranks.
        """
        self.refuse_unscale()
        params = optimizers.parameters_of(optimizer)
        grads, amax = self._shown(params, None, stepping, iteration)
        if amax is None or grads is None:
            return None

        return stepping.sync.largest(amax, distributed.mesh_of(grads))

    def adopt(self, found_inf: Any, amax: Tensor | None, stepping: Stepping) -> None:
        """Take the verdict a replaced ``_unscale`` left in the scaler's ``_found_inf``: a
        bool tensor, or a Python bool or int, unless it came by ``unscale`` itself.
        """
        if self.verdict is not None and self.verdict.flag is found_inf:
            return

        if isinstance(found_inf, Tensor):
            self.verdict = Verdict(found_inf, None, amax)
        else:
            flag = paddle.to_tensor([bool(found_inf)], place=stepping.loss_scale.scale.place)
            self.verdict = Verdict(flag, bool(found_inf), amax)
        self.stage = OptimizerState.UNSCALED

    def _shown(
        self,
        params: list[Any] | None,
        grads: list[Tensor | None] | None,
        stepping: Stepping,
        iteration: int,
        times: Tensor | None = None,
    ) -> tuple[list[Tensor | None] | None, Tensor | None]:
        """The gradients (fetched from ``params`` unless given), shown to each monitor that
        looks at this iteration; and the amax one of them measured, times ``times`` if given.
        Returns (None, None) where none looks and no gradients were given.
        """
        looking = [monitor for monitor in stepping.monitors if monitor.looks_at(iteration)]
        if not looking:
            return grads, None

        grads = optimizers.grads_of(params or []) if grads is None else grads
        amax = None
        for monitor in looking:
            measured = monitor.before_unscale(params, grads, times)
            amax = measured if measured is not None else amax
        return grads, amax

    def _decided(self, flag: Tensor, amax: Tensor | None, mesh: Any, stepping: Stepping) -> None:
        # Agreed before any rank decides: all then skip, update and count alike.
        flag, amax = stepping.sync.agree(flag, amax, mesh)
        self.verdict = Verdict(flag, None, amax)
        self.stage = OptimizerState.UNSCALED

    def run(self, optimizer: Any, run_step: Callable[[], Any], stepping: Stepping) -> Any:
        """Call ``run_step()`` (which steps ``optimizer``) so that it changes nothing where
        the verdict found inf/nan, in the first of four ways that applies, and learn the
        verdict on the host where that is free. Returns what ``run_step()`` returned, or
        ``SKIPPED`` where it was not called.
        """
        verdict = cast(Verdict, self.verdict)
        if verdict.on_host is not None:
            # Decided on the host already (a replaced _unscale did): skip by not calling
            # the optimizer, which then reads no flag.
            return self._stepped(SKIPPED if verdict.on_host else run_step())

        if optimizers.zero_grads_make_no_update(optimizer, self.params):
            # Zeroed on the device where inf/nan was found, the gradients make the step
            # p - lr * 0 == p, with no read at all.
            self._zero_if_found(optimizer, verdict.flag, stepping)
            return self._stepped(run_step())

        flag_reader = optimizers.first_wrapped(optimizer, _takes_a_flag)
        if flag_reader is None:
            # It takes no flag: the scaler reads it before the step, the one read API.md
            # allows.
            return self._stepped(SKIPPED if self._read_flag(optimizer, stepping) else run_step())

        # A Paddle optimizer (or the one a wrapper drives) skips its update when the flag
        # is set, reading it once per step, as under Paddle's own scaler, and leaves it
        # behind as a Python bool: the verdict on the host, free.
        flag_reader._set_auxiliary_var("found_inf", verdict.flag)
        try:
            result = run_step()
            left = getattr(flag_reader, "_get_auxiliary_var", lambda name: None)("found_inf")
        finally:
            # Left set, the flag would also skip a later step made without the scaler.
            flag_reader._set_auxiliary_var("found_inf", None)

        if isinstance(left, bool):
            self.verdict = verdict._replace(on_host=left)
        return self._stepped(result)

    def _stepped(self, result: Any) -> Any:
        # Stepped only once the step returned: one that raised may be stepped again.
        self.stage = OptimizerState.STEPPED
        return result

    def _zero_if_found(self, optimizer: Any, flag: Tensor, stepping: Stepping) -> None:
        groups = self.groups
        if groups is None:
            groups, _ = optimizers.grads_by_dtype(optimizers.parameters_of(optimizer))

        rule = stepping.loss_scale.rule
        kernels.zero_if_found_(groups, flag, lambda dtype: rule.placeholder(flag.place, dtype))
        # A flag left over from another scaler would make Paddle read it.
        optimizer._set_auxiliary_var("found_inf", None)

    def _read_flag(self, optimizer: Any, stepping: Stepping) -> bool:
        if type(optimizer) not in stepping.logged_types:
            # Once per optimizer class and scaler: the cost is per step, the news is not.
            stepping.logged_types.add(type(optimizer))
            logger.info(
                "%s takes no found-inf flag (no _set_auxiliary_var, nor an inner Paddle "
                "optimizer that has one): the scaler reads the flag on the host before each "
                "step, a device sync on GPU",
                type(optimizer).__qualname__,
            )

        verdict = cast(Verdict, self.verdict)
        found = bool(verdict.flag)
        self.verdict = verdict._replace(on_host=found)
        return found


def _takes_a_flag(optimizer: Any) -> bool:
    return callable(getattr(optimizer, "_set_auxiliary_var", None))
