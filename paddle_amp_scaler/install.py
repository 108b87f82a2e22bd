"""install() / uninstall(): existing trainers build this package's scalers unchanged.

Paddle's high-level API (``paddle.Model`` in ``hapi/model.py``), fleet's model wrapper,
the auto-parallel engine, PaddleNLP/PaddleFormers' ``Trainer`` and PaddleDetection's
trainer build their scaler as ``paddle.amp.GradScaler(...)`` (or ``AmpScaler``),
looking the name up when they build it. ``install()`` points those names, in
``paddle.amp`` and in ``paddle.amp.grad_scaler`` where Paddle defines them, at this
package's classes; ``uninstall()`` puts Paddle's back.

It cannot reach a name copied before it ran: ``from paddle.amp import GradScaler`` at
the top of a module imported earlier keeps Paddle's class. Call ``install()`` first,
then import the trainer.
"""

from __future__ import annotations

import logging
from types import ModuleType

import paddle.amp
from paddle.amp import grad_scaler as paddle_grad_scaler

from .core import scaler

__all__ = ["install", "installed", "uninstall"]

logger = logging.getLogger("paddle_amp_scaler")

_NAMES = ("AmpScaler", "GradScaler")
_MODULES: tuple[ModuleType, ...] = (paddle.amp, paddle_grad_scaler)
# Paddle's own classes, taken when this module is first imported: before any install().
_PADDLES = {name: getattr(paddle_grad_scaler, name) for name in _NAMES}


def install() -> None:
    """Make ``paddle.amp.GradScaler`` and ``paddle.amp.AmpScaler`` this package's. Idempotent."""
    for module in _MODULES:
        for name in _NAMES:
            setattr(module, name, getattr(scaler, name))
    logger.info("paddle.amp.GradScaler and paddle.amp.AmpScaler are paddle_amp_scaler's")


def uninstall() -> None:
    """Put Paddle's own ``GradScaler`` and ``AmpScaler`` back. Idempotent."""
    for module in _MODULES:
        for name in _NAMES:
            setattr(module, name, _PADDLES[name])


def installed() -> bool:
    """Whether ``paddle.amp.GradScaler`` is this package's now."""
    return paddle.amp.GradScaler is scaler.GradScaler
