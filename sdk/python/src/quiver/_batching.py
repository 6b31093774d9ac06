"""Cutting a bulk load into upsert batches (shared by both clients)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Tuple

from . import _calls
from ._convert import convert_ids
from ._core import ApiCall
from .errors import InvalidArgument

#: Called after each batch with (points written so far, total points).
ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True)
class Batch:
    """One slice of a bulk load: rows ``[start, stop)``."""

    start: int
    stop: int
    ids: List[Any]
    vectors: Any
    payloads: Optional[Any]

    def call(self, name: str) -> ApiCall[int]:
        """Returns the upsert call of this batch; input errors name absolute rows."""
        try:
            return _calls.upsert(name, self.ids, self.vectors, self.payloads)
        except InvalidArgument as error:
            raise InvalidArgument(
                f"in the batch of rows {self.start}..{self.stop - 1}: {error.message} "
                "(indexes are relative to the batch; earlier batches were written)"
            ) from None


def _length(value: Any, what: str) -> int:
    try:
        return len(value)
    except TypeError:
        raise InvalidArgument(f"{what} must be a sequence or array, got {type(value).__name__}") from None


def plan_batches(
    ids: Any, vectors: Any, payloads: Any, batch_size: int, concurrency: int = 1
) -> Tuple[int, Iterator[Batch]]:
    """Returns the number of points and a lazy iterator over their batches.

    Lengths are checked up front, so a mismatch fails before anything is written.
    Vectors are converted one batch at a time (a numpy array is sliced, not copied).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise InvalidArgument(f"batch_size must be a positive integer, got {batch_size!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency <= 0:
        raise InvalidArgument(f"concurrency must be a positive integer, got {concurrency!r}")
    id_list = convert_ids(ids)
    total = len(id_list)
    vector_count = _length(vectors, "vectors")
    if vector_count != total:
        raise InvalidArgument(f"vectors has {vector_count} rows but there are {total} ids")
    if payloads is not None:
        payload_count = _length(payloads, "payloads")
        if payload_count != total:
            raise InvalidArgument(f"payloads has {payload_count} entries but there are {total} ids")

    def batches() -> Iterator[Batch]:
        for start in range(0, total, batch_size):
            stop = min(start + batch_size, total)
            yield Batch(
                start=start,
                stop=stop,
                ids=id_list[start:stop],
                vectors=vectors[start:stop],
                payloads=None if payloads is None else payloads[start:stop],
            )

    return total, batches()
