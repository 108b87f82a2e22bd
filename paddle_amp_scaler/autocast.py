"""Paddle's autocast helpers, under the names that fluid-era code imports.

They are Paddle's own functions, so signatures and behaviour are Paddle's: code written
against ``fluid.dygraph.amp_guard`` runs with only its import changed.
"""

from paddle.amp import amp_guard, auto_cast, decorate

__all__ = ["amp_guard", "auto_cast", "decorate"]
