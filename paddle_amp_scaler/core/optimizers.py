"""An optimizer in the scaler's hands: what it updates (its parameters and their
gradients, through wrappers too), what the scaler knows of it during an iteration
(``OptimizerRecord``: its stage and its verdict, unscaled at most once, then stepped at
most once), and how its step is skipped when the gradients hold inf/nan.

A skipped step must leave every parameter and optimizer accumulator bit for bit as it
was, and the scaler must not wait for the device to decide. ``choose`` picks one of
four ways, once per optimizer and iteration, the first that applies; each says why.
Each step also says what it learnt of the verdict on the host at no cost of its own,
which lets the scaler apply its rule there (``loss_scale.py``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, Optional, cast

import paddle
from paddle import Tensor
from paddle.amp.grad_scaler import OptimizerState

from . import kernels
from .interval import Rule

logger = logging.getLogger("paddle_amp_scaler")

# Attributes under which wrappers keep the optimizer they drive: Paddle's (fleet's
# HybridParallelOptimizer and MixPrecisionOptimizer, GroupSharded optimizers,
# DygraphShardingOptimizer) and this package's LossScaleOptimizer.
_INNER_OPTIMIZER_ATTRS = (
    "_inner_opt",
    "_optim",
    "_inner_optimizer",
    "inner_opt",
    "inner_optimizer",
)
_MAX_WRAPPER_DEPTH = 8
# Untyped for the checker: see kernels.py.
_eager: Any = paddle.base.core.eager


def check_optimizer(optimizer: Any, caller: str, method: str = "step") -> None:
    """``TypeError`` for an argument that is no optimizer (a model passed by mistake, say)
    where ``caller`` needs one with ``method``: before an attribute lookup deep inside
    fails with its own words."""
    if callable(getattr(optimizer, method, None)):
        return
    hint = ""
    if isinstance(optimizer, paddle.nn.Layer):
        hint = ": a model; pass the optimizer that updates its parameters"
    elif isinstance(optimizer, Tensor) and caller == "minimize":
        hint = (
            ": the optimizer comes first and the scaled loss second, "
            "minimize(optimizer, scaled_loss)"
        )
    raise TypeError(
        f"{caller}() takes an optimizer (a paddle.optimizer.Optimizer, or an object with "
        f"its .{method}()), got {type(optimizer).__name__}{hint}"
    )


def parameters_of(optimizer: Any) -> list[Any]:
    """The parameters an optimizer updates, across its parameter groups; a wrapper's
    are those of the optimizer it drives, unless it lists its own.

    ``TypeError`` for an object with no parameter list; ``ValueError`` for an empty one
    (Paddle's own answers to that range from an IndexError deep in Adam to a step that
    silently does nothing).
    """
    owner = first_wrapped(optimizer, _lists_parameters)
    if owner is None:
        raise TypeError(
            f"optimizer must be a paddle.optimizer.Optimizer built with parameters=..., "
            f"got {type(optimizer).__name__} with no parameter list"
        )
    params = _listed_parameters(owner)
    if not params:
        raise ValueError(
            f"the {type(optimizer).__name__} optimizer has no parameters to update: build "
            "it with parameters=model.parameters()"
        )
    return params


def grads_of(params: Sequence[Tensor]) -> list[Tensor | None]:
    """The gradient the optimizer will read of each parameter, None where it has none.

    Paddle's master-grad mode accumulates into ``param.main_grad`` (float32) and the
    optimizer reads that one, so it is the gradient that must be unscaled and checked.
    """
    # One C++ call for all of them: a Python loop of _grad_ivar() costs a microsecond
    # or two per parameter. It leaves out frozen parameters, whose gradients Paddle's
    # scaler checks all the same: those are fetched one by one.
    grads: list[Tensor | None] = _eager.get_all_grads(list(params))
    for index, param in enumerate(params):
        master = getattr(param, "main_grad", None)
        if master is not None:
            grads[index] = master
        elif grads[index] is None and param.stop_gradient:
            grads[index] = param._grad_ivar()
    return grads


def refuse_without_parameters(optimizer: Any) -> None:
    """``parameters_of``'s ValueError for an empty parameter list, where an object that
    lists no parameters at all may pass (a disabled scaler calls it as it is)."""
    if first_wrapped(optimizer, _lists_parameters) is not None:
        parameters_of(optimizer)


def _listed_parameters(owner: Any) -> list[Any]:
    groups = getattr(owner, "_param_groups", None)
    if groups and isinstance(groups[0], dict):
        return [param for group in groups for param in group["params"]]
    return list(owner._parameter_list)


def _lists_parameters(optimizer: Any) -> bool:
    return getattr(optimizer, "_parameter_list", None) is not None or bool(
        getattr(optimizer, "_param_groups", None)
    )


def first_wrapped(optimizer: Any, wanted: Callable[[Any], bool]) -> Any | None:
    """``optimizer`` if ``wanted(optimizer)``, else the first such optimizer found by
    following the wrappers' inner optimizers; None if none is."""
    candidate = optimizer
    for _ in range(_MAX_WRAPPER_DEPTH):
        if wanted(candidate):
            return candidate
        candidate = next(
            (
                getattr(candidate, name)
                for name in _INNER_OPTIMIZER_ATTRS
                if getattr(candidate, name, None) is not None
            ),
            None,
        )
        if candidate is None:
            return None
    return None


# -- what the scaler knows of an optimizer in an iteration ----------------------------


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether inf/nan was found, from an unscale to the update: a bool [1] ``flag`` on the
    device, and ``on_host``, the same as a host bool where it reached the host at no cost
    (an optimizer that read its flag leaves it behind as one), else None; at least one of
    the two. ``amax``: where the unscale measured it, the largest magnitude among the
    gradients as they came, float32 [1] on the device (meaningful only where nothing was
    found)."""

    flag: Tensor | None
    on_host: bool | None = None
    amax: Tensor | None = None

    @property
    def found(self) -> bool | Tensor:
        """Whether inf/nan was found: the host bool where known, else the flag."""
        return cast(Tensor, self.flag) if self.on_host is None else self.on_host

    @staticmethod
    def joined(verdicts: Sequence[Verdict]) -> Verdict:
        """Whether any of ``verdicts`` found inf/nan, known on the host where each of them
        is (no device operation), and the largest of their amaxes where each measured."""
        amax = kernels.largest_of([verdict.amax for verdict in verdicts])
        if all(verdict.on_host is not None for verdict in verdicts):
            return Verdict(None, any(verdict.on_host for verdict in verdicts), amax)
        flags = [cast(Tensor, verdict.flag) for verdict in verdicts]
        return Verdict(kernels.any_of(flags), amax=amax)


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


# -- skipping a step ---------------------------------------------------------------------

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
        # An unscale's verdict: it has its flag.
        flag = cast(Tensor, verdict.flag)
        kernels.zero_if_found_(
            self.grads, flag, lambda dtype: self.rule.stand_in(flag.place, dtype)
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
            grads = grads_of(parameters_of(optimizer))
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
    return first_wrapped(optimizer, lambda it: callable(getattr(it, "_set_auxiliary_var", None)))


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
        params = parameters_of(optimizer)
    return all(getattr(param, "regularizer", None) is None for param in params)


def _keeps_zero(clip: Any) -> bool:
    return clip is None or type(clip) in _CLIPS_THAT_KEEP_ZERO
