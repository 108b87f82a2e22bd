"""Ranks in agreement (``docs/distributed.md``): each unscale's found-inf flag reduced
(MAX) over the group on the device before any rank decides, a check that the ranks hold
the same scaler, and logs from rank 0 only. Under Paddle 3's semi-automatic parallelism,
where there may be no global group (``dist.all_reduce`` refuses), the flag is reduced
over the gradients' process meshes as Paddle reduces a partial tensor: one all-reduce.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import paddle
import paddle.distributed as dist
from paddle import Tensor
from paddle.distributed.communication.group import Group

from . import validation


class RankZeroOnly(logging.Filter):
    """Lets a record through on rank 0 only, so that N ranks log once. Installed on the
    ``paddle_amp_scaler`` logger as ``rank_zero_only``: remove it to hear every rank.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return on_rank_zero()


rank_zero_only = RankZeroOnly()
logging.getLogger("paddle_amp_scaler").addFilter(rank_zero_only)


def on_rank_zero() -> bool:
    """Whether this process is rank 0 of the run (or the only one)."""
    return bool(dist.get_rank() == 0)


class FoundInfSync:
    """Reduces found-inf flags over ``group`` (None: every rank) when
    ``paddle.distributed`` runs more than one rank and ``enabled`` is True.
    """

    def __init__(self, group: Any, enabled: Any) -> None:
        if group is not None and not isinstance(group, Group):
            raise TypeError(
                "group must be None or a paddle.distributed group (from "
                f"paddle.distributed.new_group), got {type(group).__name__}"
            )

        self.group = group
        self.enabled = validation.check_bool(enabled, "sync_found_inf")

    def agree(
        self, flag: Tensor, amax: Tensor | None, mesh: Any = None
    ) -> tuple[Tensor, Tensor | None]:
        """An unscale's found-inf ``flag`` OR-ed over the ranks, and its ``amax`` (where
        measured) the largest over them, in one collective on the device; both as they
        are when no reduction is due. The ranks: those of ``mesh``, the process mesh of
        the unscale's dist gradients (``mesh_of``), else ``group``'s. Every rank must call
        it for the same unscales in the same order, whatever its gradients.
        """
        if not self._reduces(mesh):
            return flag, amax

        if amax is None:
            # Collectives take no bool: as int32, MAX over ranks is OR.
            return self.largest(flag.astype(paddle.int32), mesh).astype(paddle.bool), None

        # The flag rides beside the amax as 0.0 or 1.0: MAX of both in one reduction.
        both = self.largest(paddle.concat([flag.astype(paddle.float32), amax]), mesh)
        return both[:1] > 0, both[1:]

    def largest(self, values: Tensor, mesh: Any = None) -> Tensor:
        """``values``' elementwise largest over the ranks of ``mesh`` (else of ``group``),
        on the device; ``values`` themselves when no reduction is due.
        """
        if not self._reduces(mesh):
            return values

        if mesh is None:
            dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.group)
            return values

        # Over a mesh, as Paddle reduces a partial tensor: made partial (MAX), then replicated.
        largest = [dist.Partial(dist.ReduceType.kRedMax)] * mesh.ndim
        partial = paddle.base.core.dtensor_from_local(values, mesh, largest)
        return dist.reshard(partial, mesh, [dist.Replicate()] * mesh.ndim)._local_value()

    def _reduces(self, mesh: Any) -> bool:
        """Whether a reduction is due: over ``mesh`` if any, else where ``group`` has
        several ranks, asked at each call so that ``init_parallel_env`` may come later.
        """
        if not self.enabled or mesh is not None:
            return self.enabled

        return bool(dist.is_initialized() and dist.get_world_size(self.group) > 1)


def mesh_of(tensors: Sequence[Tensor | None]) -> Any:
    """The process mesh over every rank that holds a shard of the dist tensors among
    ``tensors`` (gradients, or parameters, whose gradients share their meshes), or None
    where none is one (Paddle 2.6, or no semi-automatic parallelism).
    """
    ranks: set[int] = set()
    for tensor in tensors:
        if tensor is not None and tensor.is_dist():
            ranks.update(tensor.process_mesh.process_ids)

    return dist.ProcessMesh(sorted(ranks)) if ranks else None


def check_consistency(scaler: Any, group: Group | None) -> None:
    """``RuntimeError`` naming the ranks of ``group`` whose ``scaler`` holds another
    scale, counters or statistics than the group's first rank, and the values. A
    collective (every rank of the group must call it) that reads the device.
    """
    # Under semi-automatic parallelism the global group may not be set up: the launcher's
    # world size counts the ranks all the same.
    if dist.get_world_size(group) <= 1:
        return

    stats = scaler.stats()
    # A rank counts the losses it computes: in a pipeline only the last stage has one.
    counts = {key: value for key, value in stats.to_state().items() if key != "nonfinite_loss"}
    values = {
        "scale": stats.scale,
        "incr_count": scaler.get_incr_count(),
        "decr_count": scaler.get_decr_count(),
        **counts,
    }
    mine = paddle.to_tensor([float(value) for value in values.values()], dtype=paddle.float64)

    if dist.is_initialized():
        gathered: list[Tensor] = []
        dist.all_gather(gathered, mine, group=group)
        rows = [row.numpy().tolist() for row in gathered]
    else:
        # No global group: the rows travel as the shards of one dist tensor made replicated.
        mesh = dist.ProcessMesh(list(range(dist.get_world_size())))
        shards = paddle.base.core.dtensor_from_local(mine.reshape([1, -1]), mesh, [dist.Shard(0)])
        rows = dist.reshard(shards, mesh, [dist.Replicate()])._local_value().numpy().tolist()

    ranks = list(group.ranks) if group is not None else list(range(len(rows)))
    differences = [
        f"rank {rank}: "
        + ", ".join(
            f"{name} {value:g} (rank {ranks[0]}: {expected:g})"
            for name, value, expected in zip(values, row, rows[0])
            if value != expected
        )
        for rank, row in zip(ranks, rows)
        if row != rows[0]
    ]

    if differences:
        raise RuntimeError(
            "the scaler differs between ranks; "
            + "; ".join(differences)
            + ". Every rank must build it alike, load the same state and step the same "
            "optimizers; keep sync_found_inf=True unless every rank's gradients are "
            "identical"
        )
