"""What the scaler needs to know about an optimizer object, Paddle's or a wrapper's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import paddle

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

_CLIPS_THAT_KEEP_ZERO = (
    paddle.nn.ClipGradByGlobalNorm,
    paddle.nn.ClipGradByNorm,
    paddle.nn.ClipGradByValue,
)


def parameters_of(optimizer: Any) -> list[Any]:
    """The parameters an optimizer updates, across its parameter groups; a wrapper's
    are those of the optimizer it drives, unless it lists its own.

    ``TypeError`` for an object with no parameter list; ``ValueError`` for an empty one
    (Paddle's own answers to that range from an IndexError deep in Adam to a step that
    silently does nothing).
    """
    owner = _first_wrapped(optimizer, _lists_parameters)
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


def refuse_without_parameters(optimizer: Any) -> None:
    """``parameters_of``'s ValueError for an empty parameter list, where an object that
    lists no parameters at all may pass (a disabled scaler calls it as it is)."""
    if _first_wrapped(optimizer, _lists_parameters) is not None:
        parameters_of(optimizer)


def _listed_parameters(owner: Any) -> list[Any]:
    groups = getattr(owner, "_param_groups", None)
    if groups and isinstance(groups[0], dict):
        return [param for group in groups for param in group["params"]]
    return list(owner._parameter_list)


def flag_taker(optimizer: Any) -> Any | None:
    """The object whose ``_set_auxiliary_var('found_inf', flag)`` skips the step, if any.

    Paddle's optimizers take the flag and read it once per step; a wrapper takes it
    through the Paddle optimizer it drives.
    """
    return _first_wrapped(optimizer, lambda it: callable(getattr(it, "_set_auxiliary_var", None)))


def _lists_parameters(optimizer: Any) -> bool:
    return getattr(optimizer, "_parameter_list", None) is not None or bool(
        getattr(optimizer, "_param_groups", None)
    )


def _first_wrapped(optimizer: Any, wanted: Callable[[Any], bool]) -> Any | None:
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


def zero_grads_make_no_update(optimizer: Any) -> bool:
    """True when a step with all-zero gradients leaves every parameter bit-for-bit as it was.

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
    return all(getattr(param, "regularizer", None) is None for param in parameters_of(optimizer))


def _keeps_zero(clip: Any) -> bool:
    return clip is None or type(clip) in _CLIPS_THAT_KEEP_ZERO
