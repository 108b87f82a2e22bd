"""The interface every monitor of a run implements (``Monitor``), and what it hears at
an iteration's end (``IterationEnd``).

A monitor may look at an iteration's scaled gradients before an unscale writes them
(``looks_at``, ``before_unscale``), and hears the end of every iteration
(``end_iteration``). The monitors themselves are in ``monitoring`` (the run's statistics,
the stuck policy, and the set a scaler holds) and ``reports`` (what is learnt per
gradient).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from paddle import Tensor

if TYPE_CHECKING:
    from .monitoring import ScalerStats
    from .step import Verdict


class IterationEnd(NamedTuple):
    """An iteration as it ends, told to every monitor.

    Args:
        number: the iteration's number, from 1.
        verdict: whether any stepped optimizer found inf/nan, joined over them.
        acted: whether the rule grew or backed off (a host bool, or a bool [1] tensor).
        stats: reads the scaler's ``ScalerStats`` (a device read).
    """

    number: int
    verdict: Verdict
    acted: bool | Tensor
    stats: Callable[[], ScalerStats]


class Monitor:
    """What watches a run: a monitor overrides the hooks it needs, each a no-op here."""

    def looks_at(self, iteration: int) -> bool:
        """Whether ``before_unscale`` should see the gradients of ``iteration`` (from 1)."""
        return False

    def before_unscale(
        self, params: list[Any] | None, grads: list[Tensor | None], times: Tensor | None
    ) -> Tensor | None:
        """See one unscale's gradients as backward left them (``params``: their parameters,
        None for gradients handed over without); ``times``: a scale they are to be seen at.
        Returns their largest magnitude, float32 [1] on the device, where it measured them.
        """
        return None

    def end_iteration(self, end: IterationEnd) -> None:
        """Hear the end of an iteration (in the order the scaler lists the monitors)."""
