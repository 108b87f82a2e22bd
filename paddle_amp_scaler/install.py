"""install() / uninstall(): existing trainers build this package's scalers unchanged.

``paddle.Model``, fleet's model wrapper, the auto-parallel engine, PaddleNLP's
``Trainer`` and PaddleDetection's trainer look ``paddle.amp.GradScaler`` (or
``AmpScaler``) up when they build their scaler. ``install()`` points those names, in
``paddle.amp`` and in ``paddle.amp.grad_scaler`` where Paddle defines them, at this
package's classes; ``uninstall()`` puts Paddle's back. A name copied before ``install()``
ran (``from paddle.amp import GradScaler`` in a module imported earlier) keeps Paddle's
class: call ``install()`` first, then import the trainer.
"""

from __future__ import annotations

import inspect
import logging
from types import ModuleType
from typing import Any

import paddle.amp
from paddle.amp import grad_scaler as paddle_grad_scaler

from .core import scaler

__all__ = ["install", "installed", "uninstall"]

logger = logging.getLogger("paddle_amp_scaler")

_NAMES = ("AmpScaler", "GradScaler")
_MODULES: tuple[ModuleType, ...] = (paddle.amp, paddle_grad_scaler)
# Paddle's own classes, taken when this module is first imported: before any install().
_PADDLES = {name: getattr(paddle_grad_scaler, name) for name in _NAMES}


def install(**defaults: Any) -> None:
    """Make ``paddle.amp.GradScaler`` and ``paddle.amp.AmpScaler`` this package's, with
    ``defaults`` (keyword arguments of their constructors, e.g. ``policy="headroom"``) as
    the defaults of the scalers built from then on. Idempotent; a bad default is a
    ``ValueError`` here, naming it.
    """
    classes = {name: _with_defaults(getattr(scaler, name), defaults) for name in _NAMES}
    for module in _MODULES:
        for name in _NAMES:
            setattr(module, name, classes[name])
    logger.info("paddle.amp.GradScaler and paddle.amp.AmpScaler are paddle_amp_scaler's")


def _with_defaults(cls: type[scaler.AmpScaler], defaults: dict[str, Any]) -> type:
    """``cls``, or a subclass of the same name whose constructor defaults to ``defaults``
    (an argument the trainer passes still wins), checked by building a disabled scaler
    with them: an unknown name too, where the scaler's own check says "did you mean".
    """
    if not defaults:
        return cls
    try:
        cls(enable=False, **defaults)
    except (TypeError, ValueError) as error:
        raise ValueError(f"install(): {error}") from None
    names = list(inspect.signature(cls.__init__).parameters)[1:]  # after self

    def __init__(self: scaler.AmpScaler, *args: Any, **kwargs: Any) -> None:
        given = set(names[: len(args)]) | set(kwargs)
        unless_given = {name: value for name, value in defaults.items() if name not in given}
        cls.__init__(self, *args, **{**unless_given, **kwargs})

    namespace = {
        "__module__": cls.__module__,
        "__doc__": cls.__doc__,
        "__init__": __init__,
        # Pickled as the package's own class, which an unpickling process can import:
        # the defaults served the constructor and nothing after it.
        "__reduce_ex__": lambda self, protocol: (_rebuilt, (cls, self.__getstate__())),
    }
    return type(cls.__name__, (cls,), namespace)


def uninstall() -> None:
    """Put Paddle's own ``GradScaler`` and ``AmpScaler`` back. Idempotent."""
    for module in _MODULES:
        for name in _NAMES:
            setattr(module, name, _PADDLES[name])


def installed() -> bool:
    """Whether ``paddle.amp.GradScaler`` is this package's now."""
    return isinstance(paddle.amp.GradScaler, type) and issubclass(
        paddle.amp.GradScaler, scaler.GradScaler
    )


def _rebuilt(cls: type[scaler.AmpScaler], state: dict[str, Any]) -> scaler.AmpScaler:
    rebuilt = cls.__new__(cls)
    rebuilt.__setstate__(state)
    return rebuilt
