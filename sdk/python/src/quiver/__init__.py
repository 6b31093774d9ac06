"""Python client for Quiver, a distributed vector search cluster.

    from quiver import Client              # AsyncClient for asyncio
    c = Client("http://localhost:7700", api_key=None)
    c.create_collection("docs", dimension=384, metric="cosine")
    c.upsert("docs", ids=[1, 2], vectors=vectors, payloads=[{"lang": "en"}, {"lang": "de"}])
    hits = c.search("docs", vector, k=10, filter='lang = "en"', consistency="strong")

Errors raise :class:`QuiverError` subclasses named after the API's error codes.
"""

from ._version import __version__
from .async_client import AsyncClient
from .client import Client
from .errors import (
    AlreadyExists,
    DataLoss,
    DataLossError,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    QuiverError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from .types import Hit, Point, PointId, SearchResult

__all__ = [
    "__version__",
    "Client",
    "AsyncClient",
    "Hit",
    "Point",
    "PointId",
    "SearchResult",
    "QuiverError",
    "InvalidArgument",
    "NotFound",
    "AlreadyExists",
    "FailedPrecondition",
    "ResourceExhausted",
    "Unauthenticated",
    "PermissionDenied",
    "Unavailable",
    "DeadlineExceeded",
    "Internal",
    "DataLoss",
    "DataLossError",
]
