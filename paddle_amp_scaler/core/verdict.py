"""What one unscale-and-check found: the domain type every unscale path returns."""

from __future__ import annotations

import dataclasses

from paddle import Tensor


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether an unscale found inf/nan: a bool [1] ``flag`` on the device, and the same
    as a host bool where it came with no read (on a CPU the compiled unscale hands it
    back with the flag), else None. ``amax``: where the unscale measured it, the largest
    magnitude among the gradients as they came, float32 [1] on the device (meaningful
    only where nothing was found)."""

    flag: Tensor
    on_host: bool | None = None
    amax: Tensor | None = None
