"""Rows that expire in tables the loops do not own, pruned by the reconciler.

The reconciler (dispatch) prunes expired Idempotency-Key records, whose table belongs to the HTTP
surface above it. Importing the web from dispatch would point an arrow up, so the owner registers
its pruning here when its app loads (scheduler_project.web.apps) and the reconciler runs whatever is
registered."""

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Pruner:
    name: str
    prune: Callable[[], int]  # deletes at most `batch` expired rows, returns how many it deleted
    batch: int


_PRUNERS: dict[str, Pruner] = {}


def register(name: str, prune: Callable[[], int], *, batch: int) -> None:
    _PRUNERS[name] = Pruner(name, prune, batch)


def prune_expired() -> bool:
    """One batch from each registered pruner; True when one of them deleted a full batch (more are
    waiting)."""
    more = False
    for pruner in list(_PRUNERS.values()):
        more |= pruner.prune() >= pruner.batch
    return more
