"""Dynamic loss scaling for PaddlePaddle dygraph, with Paddle's scaler API.

``AmpScaler`` and ``GradScaler`` keep Paddle's names and meaning, run on every place
Paddle runs (CPU included), keep the scale and counters on the device, and skip a step
with inf/nan gradients without changing any parameter or optimizer state.
"""

try:
    import paddle  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "paddle_amp_scaler needs PaddlePaddle 2.6 or newer. Install it with "
        "`pip install 'paddle-amp-scaler[cpu]'` (CPU build) or "
        "`pip install 'paddle-amp-scaler[gpu]'` (GPU build)."
    ) from error

from .autocast import amp_guard, auto_cast, custom_bwd, custom_fwd, decorate
from .checkpoint import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from .install import install, uninstall
from .loss_scale_optimizer import LossScaleOptimizer
from .overflow_report import OverflowEntry
from .scaler import AmpScaler, GradScaler
from .statistics import LossScaleStuckError, ScalerStats
from .validation import UnknownArgumentError

__all__ = [
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
    "LossScaleStuckError",
    "install",
    "uninstall",
    "save_checkpoint",
    "load_checkpoint",
    "read_checkpoint",
    "CheckpointError",
    "UnknownArgumentError",
]
__version__ = "0.1.0"
