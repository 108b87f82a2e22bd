"""How an optimizer's step is skipped when its gradients hold inf/nan.

A skipped step must leave every parameter and optimizer accumulator bit for bit as it
was, and the scaler must not wait for the device to decide. ``choose`` picks one of
four ways, once per optimizer and iteration, the first that applies; each says why.
Each step also says what it learnt of the verdict on the host at no cost of its own,
which lets the scaler apply its rule there (``loss_scale.py``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, Optional

import paddle
from paddle import Tensor

from . import kernels, optimizers
from .interval import Rule
from .kernels import Verdict

logger = logging.getLogger("paddle_amp_scaler")

# What a step returns when the scaler skipped it without calling the optimizer.
SKIPPED = object()
# Paddle's own clips, which map a zero gradient to zero.
_CLIPS_THAT_KEEP_ZERO = (
    paddle.nn.ClipGradByGlobalNorm,
    paddle.nn.ClipGradByNorm,
    paddle.nn.ClipGradByValue,
)


# What a strategy's step returns: the step's result (or SKIPPED), and the verdict as a
# host bool where the step came to know it, else None.
Stepped = tuple[Any, Optional[bool]]


class Strategy:
    """Runs ``run_step`` so that it changes nothing when ``verdict`` found inf/nan."""

    def step(self, run_step: Callable[[], Any], verdict: Verdict) -> Stepped:
        raise NotImplementedError


class DecidedOnHost(Strategy):
    """The verdict is on the host already (a replaced ``_unscale`` decided it there): skip
    by not calling the optimizer, which then reads no flag."""

    def step(self, run_step: Callable[[], Any], verdict: Verdict) -> Stepped:
        return (SKIPPED if verdict.on_host else run_step()), verdict.on_host


@dataclasses.dataclass
class ZeroGradients(Strategy):
    """Plain SGD with nothing that turns a zero gradient into another value: zeroing the
    gradients on the device when inf/nan was found makes its step ``p - lr * 0 == p``,
    with no read at all (``zero_grads_make_no_update`` says when). The kernel's other
    arguments are ``rule``'s stand-ins."""

    optimizer: Any
    grads: list[Tensor | None]
    rule: Rule

    def step(self, run_step: Callable[[], Any], verdict: Verdict) -> Stepped:
        place = verdict.flag.place
        kernels.zero_if_found_(
            self.grads, verdict.flag, lambda dtype: self.rule.stand_in(place, dtype)
        )
        # A flag left over from another scaler would make Paddle read it.
        self.optimizer._set_auxiliary_var("found_inf", None)
        return run_step(), None


@dataclasses.dataclass
class OptimizerReadsFlag(Strategy):
    """Paddle's optimizers take the flag (``_set_auxiliary_var``) and skip their update
    when it is set, reading it once per step, as under Paddle's own scaler; a wrapper
    takes it through the Paddle optimizer it drives. Having read it, Paddle's optimizers
    leave it behind as a Python bool: the verdict on the host, free."""

    taker: Any

    def step(self, run_step: Callable[[], Any], verdict: Verdict) -> Stepped:
        self.taker._set_auxiliary_var("found_inf", verdict.flag)
        try:
            result = run_step()
            read_back = getattr(self.taker, "_get_auxiliary_var", None)
            left = read_back("found_inf") if read_back is not None else None
            return result, left if isinstance(left, bool) else None
        finally:
            # Left set, the flag would also skip a later step made without the scaler.
            self.taker._set_auxiliary_var("found_inf", None)


class ReadOnHost(Strategy):
    """An optimizer that takes no flag, not even through an inner Paddle optimizer: the
    scaler reads the flag itself before the step, the one host read API.md allows."""

    def step(self, run_step: Callable[[], Any], verdict: Verdict) -> Stepped:
        found = bool(verdict.flag)
        return (SKIPPED if found else run_step()), found


def choose(
    optimizer: Any,
    verdict: Verdict,
    params: list[Any] | None,
    grads: list[Tensor | None] | None,
    rule: Rule,
    noted: set[type],
) -> Strategy:
    """The way to skip ``optimizer``'s step on ``verdict``; ``params`` and ``grads`` are
    what was unscaled and checked (None where a replaced ``_unscale`` did that). ``rule``
    lends its stand-ins; ``noted``: the optimizer types whose host read was logged."""
    if verdict.on_host is not None:
        return DecidedOnHost()
    if zero_grads_make_no_update(optimizer, params):
        if grads is None:
            grads = optimizers.grads_of(optimizers.parameters_of(optimizer))
        return ZeroGradients(optimizer, grads, rule)
    taker = flag_taker(optimizer)
    if taker is not None:
        return OptimizerReadsFlag(taker)
    if type(optimizer) not in noted:
        # Once per optimizer class and scaler: the cost is per step, the news is not.
        noted.add(type(optimizer))
        logger.info(
            "%s takes no found-inf flag (no _set_auxiliary_var, nor an inner Paddle "
            "optimizer that has one): the scaler reads the flag on the host before each "
            "step, a device sync on GPU",
            type(optimizer).__qualname__,
        )
    return ReadOnHost()


def flag_taker(optimizer: Any) -> Any | None:
    """The object whose ``_set_auxiliary_var('found_inf', flag)`` skips the step, if any.

    Paddle's optimizers take the flag and read it once per step; a wrapper takes it
    through the Paddle optimizer it drives.
    """
    return optimizers.first_wrapped(
        optimizer, lambda it: callable(getattr(it, "_set_auxiliary_var", None))
    )


def zero_grads_make_no_update(optimizer: Any, params: list[Any] | None = None) -> bool:
    """True when a step of ``optimizer`` with all-zero gradients leaves every parameter
    (``params``, its own, looked up if None) bit for bit as it was.

    That holds for Paddle's plain SGD (``p - lr * 0 == p``, no accumulators) as long as
    nothing turns a zero gradient into a non-zero one: no weight decay, and no clipping
    other than Paddle's own (which maps zero to zero). Such a step can be skipped by
    zeroing the gradients on the device, with no host read at all.
    """
    if type(optimizer) is not paddle.optimizer.SGD:
        return False
    if optimizer.regularization is not None:
        return False
    if not _keeps_zero(getattr(optimizer, "_grad_clip", None)):
        return False
    groups = optimizer._param_groups
    if (
        groups
        and isinstance(groups[0], dict)
        and any(
            group.get("weight_decay") is not None or not _keeps_zero(group.get("grad_clip"))
            for group in groups
        )
    ):
        return False
    if params is None:
        params = optimizers.parameters_of(optimizer)
    return all(getattr(param, "regularizer", None) is None for param in params)


def _keeps_zero(clip: Any) -> bool:
    return clip is None or type(clip) in _CLIPS_THAT_KEEP_ZERO
