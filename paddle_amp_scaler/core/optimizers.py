"""An optimizer in the scaler's hands: what it updates (parameters and gradients, through
wrappers too), what the scaler knows of it in an iteration (``OptimizerRecord``,
``Verdict``), and how its step is skipped on inf/nan (``step_or_skip``): every parameter
and accumulator left bit for bit as it was, without waiting for the device."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import paddle
from paddle import Tensor
from paddle.amp.grad_scaler import OptimizerState
from paddle.nn import ClipGradByGlobalNorm, ClipGradByNorm, ClipGradByValue

from . import distributed, kernels
from .interval import Rule

logger = logging.getLogger("paddle_amp_scaler")

# Attributes under which wrappers keep the optimizer they drive: Paddle's (fleet's
# HybridParallelOptimizer and MixPrecisionOptimizer, GroupSharded optimizers,
# DygraphShardingOptimizer) and this package's LossScaleOptimizer.
_INNER_ATTRS = ("_inner_opt", "_optim", "_inner_optimizer", "inner_opt", "inner_optimizer")
# Untyped for the checker: see kernels.py.
_eager: Any = paddle.base.core.eager


def check_optimizer(optimizer: Any, caller: str, method: str = "step") -> None:
    """``TypeError`` where ``caller`` needs an optimizer with ``method`` and got none (a
    model, say), before an attribute lookup deep inside fails in its own words."""
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
    """The parameters an optimizer updates, across its parameter groups (else its own list, to
    read only); a wrapper's are those of the optimizer it drives, unless it lists its own.
    ``TypeError`` for an object with no parameter list; ``ValueError`` for an empty one (Paddle's
    own answers to that range from an IndexError deep in Adam to a step that does nothing)."""
    owner = first_wrapped(optimizer, _lists_parameters)
    if owner is None:
        raise TypeError(
            f"optimizer must be a paddle.optimizer.Optimizer built with parameters=..., "
            f"got {type(optimizer).__name__} with no parameter list"
        )
    groups = _dict_groups(owner)
    params = [p for g in groups for p in g["params"]] if groups else owner._parameter_list
    if not params:
        raise ValueError(
            f"the {type(optimizer).__name__} optimizer has no parameters to update: build "
            "it with parameters=model.parameters()"
        )
    return params


def grads_of(params: Sequence[Tensor]) -> list[Tensor | None]:
    """The gradient the optimizer will read of each parameter, None where it has none:
    in Paddle's master-grad mode, the float32 ``param.main_grad`` it accumulates into."""
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


def grads_by_dtype(params: Sequence[Tensor]) -> tuple[dict[str, list[Tensor]], Any]:
    """``grads_of(params)`` grouped as the kernels take them (``kernels.grads_by_dtype_of``),
    and the process mesh of the ranks that hold them (``distributed.mesh_of``). Where every
    parameter has a float16, bfloat16 or float32 gradient of its own, dense (on no mesh),
    one C++ call groups them, as Paddle's scaler fetches them: on the cold cache a backward
    leaves, each read of a gradient in Python costs more than the call."""
    if kernels.TAKES_EMPTY:
        groups, listed = {}, 0
        # Its lists, in their order: float16, bfloat16, float32.
        for dtype, group in zip(("float16", "bfloat16", "float32"), _eager.get_grads_lists(params)):
            if group:
                groups[dtype], listed = group, listed + len(group)
        # Each parameter gives at most one: as many as parameters, each gave its own.
        if listed == len(params):
            for param in params:
                if param.is_dist() or getattr(param, "main_grad", None) is not None:
                    break
            else:
                return groups, None
    grads = grads_of(params)
    return kernels.grads_by_dtype_of(grads), distributed.mesh_of(grads)


def refuse_without_parameters(optimizer: Any) -> None:
    """``parameters_of``'s ValueError for an empty parameter list, where an object that
    lists no parameters at all may pass (a disabled scaler calls it as it is)."""
    if first_wrapped(optimizer, _lists_parameters) is not None:
        parameters_of(optimizer)


def _dict_groups(optimizer: Any) -> list[dict[str, Any]]:
    groups = getattr(optimizer, "_param_groups", None)
    return groups if groups and isinstance(groups[0], dict) else []


def _lists_parameters(optimizer: Any) -> bool:
    return getattr(optimizer, "_parameter_list", None) is not None or bool(
        getattr(optimizer, "_param_groups", None)
    )


def first_wrapped(optimizer: Any, wanted: Callable[[Any], bool]) -> Any | None:
    """``optimizer`` if ``wanted(optimizer)``, else the first such optimizer found by
    following the wrappers' inner optimizers; None if none is."""
    candidate = optimizer
    for _ in range(8):  # wrappers nest a few deep; a cycle must end
        if candidate is None or wanted(candidate):
            return candidate
        inner = (getattr(candidate, name, None) for name in _INNER_ATTRS)
        candidate = next((it for it in inner if it is not None), None)
    return None


class Verdict(NamedTuple):
    """Whether inf/nan was found, from an unscale to the update: a bool [1] ``flag`` on the
    device, and/or ``on_host``, the same as a host bool where known at no cost (an optimizer
    that read its flag leaves it behind as one). ``amax``: where measured, the gradients'
    largest magnitude as they came, float32 [1] on the device (valid only where none was
    found). A tuple, made every step: a frozen dataclass takes several times as long."""

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
        if len(verdicts) == 1:
            return verdicts[0]
        amax = kernels.largest_of([verdict.amax for verdict in verdicts])
        if all(verdict.on_host is not None for verdict in verdicts):
            return Verdict(None, any(verdict.on_host for verdict in verdicts), amax)
        flags = [cast(Tensor, verdict.flag) for verdict in verdicts]
        return Verdict(kernels.any_of(flags), amax=amax)


class OptimizerRecord:
    """One optimizer in the current iteration. Its ``stage`` (Paddle's ``OptimizerState``:
    INIT, UNSCALED, STEPPED) is what Paddle's trainers read and write as
    ``scaler._optimizer_states[id(opt)]["state"]``."""

    def __init__(self) -> None:
        self.stage = OptimizerState.INIT
        self.verdict: Verdict | None = None
        # What was unscaled and checked; None where a replaced _unscale did that.
        self.params: list[Any] | None = None
        self.groups: kernels.Groups | None = None
        # Whether any gradient was there to check (a step with none, no backward() since
        # they were cleared, tells the rule nothing); worked out once: a step asks twice.
        self.checked = True

    def __getitem__(self, key: str) -> Any:
        return {"state": self.stage}[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key != "state":
            raise KeyError(key)
        self.stage = value

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


# What a step returns when the scaler skipped it without calling the optimizer.
SKIPPED = object()
# Paddle's own clips, which map a zero gradient to zero.
_CLIPS_THAT_KEEP_ZERO = (ClipGradByGlobalNorm, ClipGradByNorm, ClipGradByValue)


def step_or_skip(
    optimizer: Any,
    run_step: Callable[[], Any],
    record: OptimizerRecord,
    rule: Rule,
    noted: set[type],
) -> tuple[Any, bool | None]:
    """Step ``optimizer`` so that it changes nothing where ``record``'s verdict found
    inf/nan, in the first of four ways that applies. Returns ``run_step()``'s result (or
    SKIPPED), and the verdict as a host bool where the step learnt it free, else None.
    ``rule`` lends its stand-ins; ``noted``: the types whose host read was logged."""
    verdict = cast(Verdict, record.verdict)
    if verdict.on_host is not None:
        # Decided on the host already (a replaced _unscale did): skip by not calling
        # the optimizer, which then reads no flag.
        return (SKIPPED if verdict.on_host else run_step()), verdict.on_host
    flag = cast(Tensor, verdict.flag)
    if zero_grads_make_no_update(optimizer, record.params):
        # Zeroed on the device where inf/nan was found, the gradients make the step
        # p - lr * 0 == p, with no read at all.
        groups = record.groups
        if groups is None:
            groups, _ = grads_by_dtype(parameters_of(optimizer))
        kernels.zero_if_found_(groups, flag, lambda dtype: rule.stand_in(flag.place, dtype))
        # A flag left over from another scaler would make Paddle read it.
        optimizer._set_auxiliary_var("found_inf", None)
        return run_step(), None
    taker = first_wrapped(optimizer, lambda it: callable(getattr(it, "_set_auxiliary_var", None)))
    if taker is not None:
        # A Paddle optimizer (or the one a wrapper drives) skips its update when the
        # flag is set, reading it once per step, as under Paddle's own scaler; it
        # leaves it behind as a Python bool: the verdict on the host, free.
        taker._set_auxiliary_var("found_inf", flag)
        try:
            result = run_step()
            left = getattr(taker, "_get_auxiliary_var", lambda name: None)("found_inf")
            return result, left if isinstance(left, bool) else None
        finally:
            # Left set, the flag would also skip a later step made without the scaler.
            taker._set_auxiliary_var("found_inf", None)
    if type(optimizer) not in noted:
        # Once per optimizer class and scaler: the cost is per step, the news is not.
        noted.add(type(optimizer))
        logger.info(
            "%s takes no found-inf flag (no _set_auxiliary_var, nor an inner Paddle "
            "optimizer that has one): the scaler reads the flag on the host before each "
            "step, a device sync on GPU",
            type(optimizer).__qualname__,
        )
    # It takes no flag: the scaler reads it before the step, the one read API.md allows.
    found = bool(flag)
    return (SKIPPED if found else run_step()), found


def zero_grads_make_no_update(optimizer: Any, params: list[Any] | None) -> bool:
    """True when a step of ``optimizer`` with all-zero gradients leaves every parameter
    (``params``, its own if None) bit for bit as it was: Paddle's plain SGD with no weight
    decay, no regularizer and no clip but Paddle's own (which map zero to zero)."""
    if type(optimizer) is not paddle.optimizer.SGD or optimizer.regularization is not None:
        return False
    groups = _dict_groups(optimizer)
    clips = [optimizer._grad_clip] + [group.get("grad_clip") for group in groups]
    if any(clip is not None and type(clip) not in _CLIPS_THAT_KEEP_ZERO for clip in clips):
        return False
    if any(group.get("weight_decay") is not None for group in groups):
        return False
    params = parameters_of(optimizer) if params is None else params
    return all(getattr(param, "regularizer", None) is None for param in params)
