"""What an optimizer object updates, Paddle's or a wrapper's: its parameters and their
gradients."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import paddle
from paddle import Tensor

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
