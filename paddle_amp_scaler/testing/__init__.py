"""Tools for testing a mixed-precision training loop on a machine without fp16 kernels.

``emulation``: a float32 model that computes with float16's range (``emulate_fp16_grads``,
``round_linear_layers``, ``round_through_float16``). ``census``: what float16 does to the
gradients (``UnderflowCensus``, ``count_float16_range``). ``counters``: what a step costs
on a GPU, counted anywhere (``HostReadCounter``, ``OperationCounter``). Import the names
from here: ``from paddle_amp_scaler.testing import emulate_fp16_grads``.
"""

from .census import (
    FLUSH_LIMIT,
    OVERFLOW_LIMIT,
    SUBNORMAL_LIMIT,
    CensusCounts,
    UnderflowCensus,
    count_float16_range,
)
from .counters import HostReadCounter, OperationCounter
from .emulation import (
    RestoredForward,
    emulate_fp16_grads,
    round_linear_layers,
    round_through_float16,
)

__all__ = [
    "emulate_fp16_grads",
    "round_linear_layers",
    "round_through_float16",
    "RestoredForward",
    "UnderflowCensus",
    "CensusCounts",
    "count_float16_range",
    "FLUSH_LIMIT",
    "SUBNORMAL_LIMIT",
    "OVERFLOW_LIMIT",
    "HostReadCounter",
    "OperationCounter",
]
