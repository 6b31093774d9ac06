"""Result objects returned by the client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Union

__all__ = ["PointId", "Hit", "Point", "SearchResult"]

#: A point id: an unsigned 64-bit integer or a string (up to 128 bytes), per the
#: collection's ``id_type``.
PointId = Union[int, str]


@dataclass(frozen=True)
class Hit:
    """One search result.

    ``score`` is the cosine similarity for ``cosine`` collections, the inner product
    for ``dot`` and the squared Euclidean distance for ``l2`` (smaller is better
    there); hits always come best first. ``payload`` is ``None`` when the search
    asked for no payloads or the point has none; ``vector`` only when asked for.
    """

    id: PointId
    score: float
    payload: Optional[Dict[str, Any]] = None
    vector: Optional[List[float]] = None


@dataclass(frozen=True)
class Point:
    """A stored point, as returned by :meth:`quiver.Client.get`."""

    id: PointId
    payload: Optional[Dict[str, Any]] = None
    vector: Optional[List[float]] = None


class SearchResult(List[Hit]):
    """The hits of one search, best first: a plain ``list`` of :class:`Hit`.

    It also carries ``took_ms``, the server-side time of the search.
    """

    took_ms: Optional[float]

    def __init__(self, hits: Iterable[Hit] = (), took_ms: Optional[float] = None) -> None:
        super().__init__(hits)
        self.took_ms = took_ms

    def __repr__(self) -> str:
        return f"SearchResult({list.__repr__(self)}, took_ms={self.took_ms!r})"
