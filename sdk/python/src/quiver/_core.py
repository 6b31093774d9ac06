"""The transport-independent half of a call: what to send, how to read the answer,
whether and when to try again. The sync and async clients only add the I/O loop.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import random
import ssl
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generic, Mapping, Optional, Tuple, TypeVar, Union

import httpx

from ._version import __version__
from ._convert import MalformedResponse
from .errors import (
    DeadlineExceeded,
    Internal,
    QuiverError,
    Unavailable,
    error_from_code,
)

logger = logging.getLogger("quiver")

T = TypeVar("T")

#: The header carrying the id of one logical call (kept across its retries).
REQUEST_ID_HEADER = "x-request-id"
#: Codes that say "try again later": the request was not applied.
RETRYABLE_CODES = frozenset(("UNAVAILABLE", "RESOURCE_EXHAUSTED"))
#: Environment variable naming a PEM CA bundle to trust for ``https://`` endpoints.
CA_CERT_ENV = "QUIVER_CA_CERT"
#: Statuses of non-Quiver answers (proxies, load balancers) worth trying again.
RETRYABLE_FOREIGN_STATUSES = frozenset((429, 502, 503, 504))

TimeoutType = Union[float, httpx.Timeout, None]


@dataclass(frozen=True)
class ApiCall(Generic[T]):
    """One REST call: method, path, encoded body and the parser of its JSON answer.

    ``idempotent`` says whether it is safe to send again when the first attempt may
    have reached the server (a connection dropped mid-answer). Calls that were
    provably not applied (connection refused, ``UNAVAILABLE``) are retried either way.
    """

    method: str
    path: str
    parse: Callable[[Any], T]
    body: Optional[bytes] = None
    idempotent: bool = True
    retries: Optional[int] = None  # None: the client's setting


@dataclass(frozen=True)
class ProbeCall:
    """A health probe: the answer is whether the status is 2xx, never an error."""

    path: str


@dataclass
class ClientSettings:
    """The settings shared by :class:`~quiver.Client` and :class:`~quiver.AsyncClient`."""

    endpoint: str
    api_key: Optional[str]
    timeout: TimeoutType
    retries: int
    backoff_base: float
    backoff_max: float
    max_retry_after: float
    headers: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        endpoint: str,
        api_key: Optional[str],
        timeout: TimeoutType,
        retries: int,
        backoff_base: float,
        backoff_max: float,
        max_retry_after: float,
        headers: Optional[Mapping[str, str]],
    ) -> "ClientSettings":
        """Returns checked settings; ``api_key=None`` falls back to ``$QUIVER_API_KEY``."""
        if not isinstance(endpoint, str) or not endpoint:
            raise ValueError("endpoint must be a URL such as http://localhost:7700")
        parsed = httpx.URL(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"endpoint {endpoint!r} must be an http:// or https:// URL with a host")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a non-negative integer, got {retries!r}")
        if backoff_base < 0 or backoff_max < 0 or max_retry_after < 0:
            raise ValueError("backoff_base, backoff_max and max_retry_after must be >= 0")
        if api_key is None:
            api_key = os.environ.get("QUIVER_API_KEY") or None
        return cls(
            endpoint=endpoint.rstrip("/"),
            api_key=api_key,
            timeout=timeout,
            retries=retries,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            max_retry_after=max_retry_after,
            headers=dict(headers or {}),
        )

    def default_headers(self) -> Dict[str, str]:
        """Returns the headers every request carries (auth, user agent, JSON)."""
        headers = {
            "user-agent": f"quiver-python/{__version__}",
            "accept": "application/json",
        }
        headers.update({name.lower(): value for name, value in self.headers.items()})
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers


def tls_verify(verify: Any) -> Any:
    """Returns what httpx's ``verify`` gets.

    ``None`` means ``$QUIVER_CA_CERT`` when set, else the system's CA certificates;
    a path (``str`` or ``os.PathLike``) becomes an ``ssl.SSLContext`` trusting the
    system's CAs plus that PEM bundle; ``True``, ``False`` and ``ssl.SSLContext``
    pass through.
    """
    if verify is None:
        verify = os.environ.get(CA_CERT_ENV) or True
    if isinstance(verify, (str, os.PathLike)):
        path = os.fspath(verify)
        try:
            context = ssl.create_default_context()
            context.load_verify_locations(cafile=path)
        except (OSError, ssl.SSLError) as error:
            raise ValueError(f"verify: cannot use {path!r} as a PEM CA bundle: {error}") from error
        return context
    return verify


def _tls_failure(exception: BaseException) -> Optional[BaseException]:
    """Returns the ``ssl.SSLError`` behind a failed connection, if TLS is what failed."""
    seen = set()
    cause: Optional[BaseException] = exception
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ssl.SSLError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def new_request_id() -> str:
    """Returns a fresh request id (32 hex digits)."""
    return uuid.uuid4().hex


def request_headers(call: Union[ApiCall[Any], ProbeCall], request_id: str) -> Dict[str, str]:
    """Returns the per-call headers."""
    headers = {REQUEST_ID_HEADER: request_id}
    if isinstance(call, ApiCall) and call.body is not None:
        headers["content-type"] = "application/json"
    return headers


@dataclass(frozen=True)
class Outcome:
    """What one attempt came to: a parsed JSON value, or an error and whether to retry."""

    value: Any = None
    error: Optional[QuiverError] = None
    retryable: bool = False
    retry_after: Optional[float] = None
    status: Optional[int] = None
    request_id: Optional[str] = None


def _snippet(content: bytes, limit: int = 200) -> str:
    text = content.decode("utf-8", errors="replace").strip()
    text = " ".join(text.split())
    if not text:
        return "an empty body"
    return repr(text[:limit] + ("…" if len(text) > limit else ""))


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Returns the seconds a ``Retry-After`` header asks for (seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if moment is None:
            return None
        seconds = moment.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


def parse_retry_after_ms(value: Optional[str]) -> Optional[float]:
    """Returns the seconds a Quiver ``retry-after-ms`` header asks for.

    Quiver sends it beside ``Retry-After`` (whole seconds, rounded up): a 50 ms
    overload hint read from ``Retry-After`` alone would wait a full second.
    """
    if not value:
        return None
    try:
        milliseconds = float(value.strip())
    except ValueError:
        return None
    if milliseconds != milliseconds:  # NaN
        return None
    return max(0.0, milliseconds / 1000.0)


def decode_response(response: httpx.Response, request_id: str) -> Outcome:
    """Returns the outcome of one HTTP answer: its JSON, or the error it stands for."""
    request_id = response.headers.get(REQUEST_ID_HEADER) or request_id
    status = response.status_code
    content = response.content
    if 200 <= status < 300:
        if not content.strip():
            return Outcome(value=None, status=status, request_id=request_id)
        try:
            return Outcome(value=json.loads(content), status=status, request_id=request_id)
        except ValueError:
            return Outcome(
                error=Unavailable(
                    f"{response.request.method} {response.request.url} answered HTTP {status} "
                    f"with a body that is not JSON ({_snippet(content)}); "
                    "is the endpoint a Quiver gateway?",
                    status=status,
                    request_id=request_id,
                )
            )

    retry_after = parse_retry_after_ms(response.headers.get("retry-after-ms"))
    if retry_after is None:
        retry_after = parse_retry_after(response.headers.get("retry-after"))
    error_object: Any = None
    try:
        error_object = json.loads(content).get("error")
    except (ValueError, AttributeError):
        pass
    if (
        isinstance(error_object, Mapping)
        and isinstance(error_object.get("code"), str)
        and error_object["code"]
    ):
        code = error_object["code"]
        message = error_object.get("message")
        error = error_from_code(
            code,
            message if isinstance(message, str) and message else f"HTTP {status}",
            status=status,
            request_id=request_id,
            details=error_object,
        )
        return Outcome(error=error, retryable=code in RETRYABLE_CODES, retry_after=retry_after)

    # Not a Quiver error body: a proxy, a load balancer or the wrong port answered.
    reason = response.reason_phrase or ""
    error = Unavailable(
        f"{response.request.method} {response.request.url} answered HTTP {status} {reason} "
        f"without a Quiver error body ({_snippet(content)}); is the endpoint a Quiver gateway?",
        status=status,
        request_id=request_id,
    )
    return Outcome(
        error=error, retryable=status in RETRYABLE_FOREIGN_STATUSES, retry_after=retry_after
    )


def transport_outcome(
    exception: httpx.HTTPError, call: ApiCall[Any], request_id: str, endpoint: str
) -> Outcome:
    """Returns the outcome of an attempt that got no HTTP answer."""
    outcome = _transport_outcome(exception, call, request_id, endpoint)
    if outcome.error is not None:
        outcome.error.__cause__ = exception
    return outcome


def _transport_outcome(
    exception: httpx.HTTPError, call: ApiCall[Any], request_id: str, endpoint: str
) -> Outcome:
    description = f"{call.method} {endpoint}{call.path}"
    tls_failure = _tls_failure(exception)
    if isinstance(exception, httpx.ConnectError) and tls_failure is not None:
        # A certificate the client does not trust fails the same way every time.
        return Outcome(
            error=Unavailable(
                f"TLS with {endpoint} failed ({tls_failure}); if the server's certificate "
                f"comes from a private CA, pass verify='/path/to/ca.pem' or set ${CA_CERT_ENV}",
                request_id=request_id,
            ),
            retryable=False,
        )
    if isinstance(exception, (httpx.ConnectError, httpx.ConnectTimeout)):
        # Nothing was sent: always safe to try again.
        return Outcome(
            error=Unavailable(
                f"cannot connect to {endpoint} ({type(exception).__name__}: {exception})",
                request_id=request_id,
            ),
            retryable=True,
        )
    if isinstance(exception, httpx.PoolTimeout):
        return Outcome(
            error=Unavailable(
                f"{description}: no free connection in the client's pool in time",
                request_id=request_id,
            ),
            retryable=True,
        )
    if isinstance(exception, httpx.TimeoutException):
        return Outcome(
            error=DeadlineExceeded(
                f"{description} timed out ({type(exception).__name__}); "
                "raise the client's timeout for large requests",
                request_id=request_id,
            ),
            retryable=False,
        )
    # The connection broke after the request (or part of it) went out.
    return Outcome(
        error=Unavailable(
            f"{description} failed: {type(exception).__name__}: {exception}",
            request_id=request_id,
        ),
        retryable=call.idempotent,
    )


def backoff_seconds(settings: ClientSettings, attempt: int, retry_after: Optional[float]) -> float:
    """Returns how long to wait before retry number ``attempt + 1``.

    The server's hint (``retry-after-ms`` or ``Retry-After``) wins when present: a
    random wait in ``[h, 1.25 h]`` for the hint ``h`` capped at ``max_retry_after``, so
    the many clients one overload or one shard move turned away do not all come back
    at the same instant. Otherwise exponential backoff with jitter: a random wait in
    ``[d/2, d]`` for ``d = min(backoff_max, backoff_base * 2**attempt)``.
    """
    if retry_after is not None:
        hint = min(retry_after, settings.max_retry_after)
        return hint + random.uniform(0.0, hint / 4.0)
    ceiling = min(settings.backoff_max, settings.backoff_base * (2.0**attempt))
    return ceiling / 2.0 + random.uniform(0.0, ceiling / 2.0)


def retry_budget(settings: ClientSettings, call: ApiCall[Any]) -> int:
    """Returns the number of retries allowed for ``call``."""
    return settings.retries if call.retries is None else call.retries


def log_retry(
    call: ApiCall[Any], request_id: str, attempt: int, error: QuiverError, delay: float
) -> None:
    """Logs one retry at INFO on the ``quiver`` logger."""
    logger.info(
        "retrying %s %s in %.3fs (attempt %d, request id %s): %s",
        call.method,
        call.path,
        delay,
        attempt + 1,
        request_id,
        error,
    )


def finish(outcome: Outcome, call: ApiCall[T]) -> T:
    """Returns the parsed result of a successful outcome, or raises its error."""
    if outcome.error is not None:
        raise outcome.error
    try:
        return call.parse(outcome.value)
    except MalformedResponse as error:
        raise Internal(
            f"{call.method} {call.path} answered with an unexpected shape ({error}); "
            "is the client newer than the server?",
            status=outcome.status,
            request_id=outcome.request_id,
        ) from None


def build_request_args(
    call: ApiCall[Any], request_id: str
) -> Tuple[str, str, Optional[bytes], Dict[str, str]]:
    """Returns (method, path, content, headers) for httpx."""
    return call.method, call.path, call.body, request_headers(call, request_id)
