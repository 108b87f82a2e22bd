"""Dynamic loss scaling for PaddlePaddle dygraph, with Paddle's scaler API.

``AmpScaler`` and ``GradScaler`` keep Paddle's names and meaning, run on every place
Paddle runs (CPU included), keep the scale and counters on the device, and skip a step
with inf/nan gradients without changing any parameter or optimizer state.
"""

import warnings

try:
    with warnings.catch_warnings():
        # Paddle 3 warns on import that ccache is missing, which matters only to whoever
        # builds C++ extensions: where this package is imported first, it stays quiet.
        warnings.filterwarnings("ignore", message="No ccache found")
        import paddle  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "paddle_amp_scaler needs PaddlePaddle 2.6 or newer, which is not installed: "
        "`pip install paddlepaddle` (the CPU build) or `pip install paddlepaddle-gpu` "
        "(the GPU build; see paddlepaddle.org.cn for the one that fits your CUDA)"
    ) from error

from ._version import __version__
from .autocast import amp_guard, auto_cast, custom_bwd, custom_fwd, decorate
from .checkpoint import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from .compat.keras import LossScaleOptimizer
from .core.monitoring import LossScaleStuckError, ScalerStats
from .core.reports import OverflowEntry, UnderflowEntry, UnderflowReading
from .core.scaler import AmpScaler, GradScaler
from .core.validation import UnknownArgumentError
from .install import install, uninstall
from .locate import OverflowOrigin, locate_overflow

__all__ = [
    "__version__",
    "AmpScaler",
    "GradScaler",
    "amp_guard",
    "auto_cast",
    "decorate",
    "custom_fwd",
    "custom_bwd",
    "LossScaleOptimizer",
    "ScalerStats",
    "OverflowEntry",
    "UnderflowEntry",
    "UnderflowReading",
    "LossScaleStuckError",
    "locate_overflow",
    "OverflowOrigin",
    "install",
    "uninstall",
    "save_checkpoint",
    "load_checkpoint",
    "read_checkpoint",
    "CheckpointError",
    "UnknownArgumentError",
]
