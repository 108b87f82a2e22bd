"""What an optimizer updates, as the scaler finds it: its parameters (through wrappers
too) and their gradients (``main_grad`` in master-grad mode), grouped as the kernels take
them; and whether a step with zero gradients leaves it untouched, so that a skip can zero
them instead of reading the verdict. Its iteration in the scaler's hands is ``step.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import paddle
from paddle import Tensor
from paddle.nn import ClipGradByGlobalNorm, ClipGradByNorm, ClipGradByValue

from . import distributed, kernels

# Attributes under which wrappers keep the optimizer they drive: Paddle's (fleet's
# HybridParallelOptimizer and MixPrecisionOptimizer, GroupSharded optimizers,
# DygraphShardingOptimizer) and this package's LossScaleOptimizer.
_INNER_ATTRS = ("_inner_opt", "_optim", "_inner_optimizer", "inner_opt", "inner_optimizer")
# Untyped for the checker: see kernels.py.
_eager: Any = paddle.base.core.eager


def check_optimizer(optimizer: Any, caller: str, method: str = "step") -> None:
    """``TypeError`` where ``caller`` needs an optimizer with ``method`` and got none (a
    model, say), before an attribute lookup deep inside fails in its own words.
    """
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
    own answers to that range from an IndexError deep in Adam to a step that does nothing).
    """
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
    in Paddle's master-grad mode, the float32 ``param.main_grad`` it accumulates into.
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


def grads_by_dtype(params: Sequence[Tensor]) -> tuple[dict[str, list[Tensor]], Any]:
    """``grads_of(params)`` grouped as the kernels take them (``kernels.grads_by_dtype_of``),
    and the process mesh of the ranks that hold them (``distributed.mesh_of``). Where every
    parameter has a float16, bfloat16 or float32 gradient of its own, dense (on no mesh),
    one C++ call groups them, as Paddle's scaler fetches them: on the cold cache a backward
    leaves, each read of a gradient in Python costs more than the call.
    """
    if kernels.TAKES_EMPTY:
        groups, listed = {}, 0
        # Its lists come in this order: float16, bfloat16, float32.
        for dtype, group in zip(("float16", "bfloat16", "float32"), _eager.get_grads_lists(params)):
            if group:
                groups[dtype], listed = group, listed + len(group)

        # Each parameter gives at most one: as many as there are parameters, each gave its own.
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
    lists no parameters at all may pass (a disabled scaler calls it as it is).
    """
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
    following the wrappers' inner optimizers; None if none is.
    """
    candidate = optimizer
    # Wrappers nest a few deep; a cycle must end.
    for _ in range(8):
        if candidate is None or wanted(candidate):
            return candidate

        inner = (getattr(candidate, name, None) for name in _INNER_ATTRS)
        candidate = next((it for it in inner if it is not None), None)

    return None


# Paddle's own clips, which map a zero gradient to zero.
_CLIPS_THAT_KEEP_ZERO = (ClipGradByGlobalNorm, ClipGradByNorm, ClipGradByValue)


def zero_grads_make_no_update(optimizer: Any, params: list[Any] | None) -> bool:
    """True when a step of ``optimizer`` with all-zero gradients leaves every parameter
    (``params``, its own if None) bit for bit as it was: Paddle's plain SGD with no weight
    decay, no regularizer and no clip but Paddle's own (which map zero to zero).
    """
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
