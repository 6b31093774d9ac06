"""The synchronous client."""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from types import TracebackType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Type, TypeVar, Union

import httpx

from . import _calls
from ._batching import ProgressCallback, plan_batches
from ._convert import Filter, PayloadSchema, Vectors
from ._core import (
    ApiCall,
    ClientSettings,
    TimeoutType,
    backoff_seconds,
    decode_response,
    finish,
    log_retry,
    new_request_id,
    request_headers,
    retry_budget,
    tls_verify,
    transport_outcome,
)
from .errors import DeadlineExceeded
from .types import Point, SearchResult

T = TypeVar("T")

__all__ = ["Client"]


class Client:
    """A connection to a Quiver gateway's REST API (thread-safe; reuses connections).

    Example::

        from quiver import Client

        with Client("http://localhost:7700") as client:
            client.create_collection("docs", dimension=384, metric="cosine")
            client.upsert("docs", ids=[1, 2], vectors=embeddings, payloads=[{...}, {...}])
            hits = client.search("docs", query, k=10, filter='lang = "en"')

    Args:
        endpoint: the gateway's base URL, e.g. ``http://localhost:7700``.
        api_key: sent as ``Authorization: Bearer <key>``; defaults to ``$QUIVER_API_KEY``.
        timeout: seconds per HTTP request (or an ``httpx.Timeout``); ``None`` waits forever.
        retries: how many times a call is retried when the server is unreachable or
            answers ``UNAVAILABLE``/``RESOURCE_EXHAUSTED`` (``Retry-After`` is honoured).
            Errors such as ``INVALID_ARGUMENT`` are never retried.
        headers: extra headers sent with every request.
        verify: TLS verification: a PEM CA bundle path (trusted besides the system's CAs),
            ``True`` (the system's CAs), ``False`` or an ``ssl.SSLContext``; by default
            ``$QUIVER_CA_CERT`` when set, else ``True``.
        transport: an ``httpx.BaseTransport`` to use instead of the network (tests, proxies).
        backoff_base: first retry waits about this many seconds, doubling each time...
        backoff_max: ...up to this many.
        max_retry_after: the longest ``Retry-After`` honoured, in seconds.
    """

    def __init__(
        self,
        endpoint: str,
        api_key: Optional[str] = None,
        timeout: TimeoutType = 30.0,
        retries: int = 3,
        *,
        headers: Optional[Mapping[str, str]] = None,
        verify: Any = None,
        transport: Optional[httpx.BaseTransport] = None,
        backoff_base: float = 0.1,
        backoff_max: float = 5.0,
        max_retry_after: float = 60.0,
    ) -> None:
        self._settings = ClientSettings.build(
            endpoint, api_key, timeout, retries, backoff_base, backoff_max, max_retry_after, headers
        )
        self._http = httpx.Client(
            base_url=self._settings.endpoint,
            headers=self._settings.default_headers(),
            timeout=timeout,
            verify=tls_verify(verify),
            transport=transport,
        )

    @property
    def endpoint(self) -> str:
        """The gateway's base URL."""
        return self._settings.endpoint

    def __repr__(self) -> str:
        return f"Client({self._settings.endpoint!r})"

    # ------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Closes the pooled connections. The client cannot be used afterwards."""
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()

    # ------------------------------------------------------------- execution

    def _execute(self, call: ApiCall[T]) -> T:
        request_id = new_request_id()
        budget = retry_budget(self._settings, call)
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    call.method,
                    call.path,
                    content=call.body,
                    headers=request_headers(call, request_id),
                )
                outcome = decode_response(response, request_id)
            except httpx.HTTPError as error:
                outcome = transport_outcome(error, call, request_id, self._settings.endpoint)
            if outcome.error is None or not outcome.retryable or attempt >= budget:
                return finish(outcome, call)
            delay = backoff_seconds(self._settings, attempt, outcome.retry_after)
            log_retry(call, request_id, attempt, outcome.error, delay)
            time.sleep(delay)
            attempt += 1

    def _probe(self, path: str) -> bool:
        try:
            response = self._http.get(path, headers={"x-request-id": new_request_id()})
        except httpx.HTTPError:
            return False
        return 200 <= response.status_code < 300

    # ----------------------------------------------------------- collections

    def create_collection(
        self,
        name: str,
        dimension: int,
        metric: str = "cosine",
        id_type: Optional[str] = None,
        shards: Optional[int] = None,
        replication: Optional[int] = None,
        index: Optional[Mapping[str, Any]] = None,
        payload_schema: Optional[PayloadSchema] = None,
    ) -> Dict[str, Any]:
        """Creates a collection and returns the server's description of it.

        Args:
            name: the collection name (escaped into the URL as one path segment).
            dimension: the vector length.
            metric: ``"cosine"``, ``"dot"`` or ``"l2"``.
            id_type: ``"u64"`` or ``"string"`` (server default when ``None``).
            shards: shard count, fixed at creation.
            replication: searchers per shard.
            index: index parameters (quantization, raw-vector precision, segment size).
            payload_schema: the fields indexed for filters (any payload field can be
                filtered on; declared ones are fast), as ``{"lang": "keyword"}`` or
                ``[{"name": "lang", "type": "keyword"}]``; types are ``keyword``,
                ``integer``, ``float`` and ``bool``.

        Raises:
            AlreadyExists: a collection with that name exists.
            InvalidArgument: a parameter is out of range.
        """
        return self._execute(
            _calls.create_collection(
                name, dimension, metric, id_type, shards, replication, index, payload_schema
            )
        )

    def list_collections(self) -> List[Dict[str, Any]]:
        """Returns the collections, each a dict with at least ``name``."""
        return self._execute(_calls.list_collections())

    def describe(self, name: str) -> Dict[str, Any]:
        """Returns a collection's parameters and stats (``points``, ``segments``, ``bytes``, …).

        Raises:
            NotFound: no such collection.
        """
        return self._execute(_calls.describe(name))

    def drop_collection(self, name: str) -> None:
        """Deletes a collection and all its points.

        Raises:
            NotFound: no such collection.
        """
        self._execute(_calls.drop_collection(name))

    # ---------------------------------------------------------------- points

    def upsert(
        self, name: str, ids: Sequence[Any], vectors: Vectors, payloads: Optional[Sequence[Any]] = None
    ) -> int:
        """Inserts or replaces points and returns the write's sequence number.

        The call returns once the write is durable (object storage + Raft); with
        ``consistency="strong"`` the next search sees it.

        Args:
            name: the collection.
            ids: unsigned integers or strings (per the collection's ``id_type``), or a
                1-D numpy integer array.
            vectors: a 2-D numpy array (float32/float64/int) with one row per id, or
                a sequence of rows (lists, tuples or 1-D arrays).
            payloads: ``None``, or one JSON-serialisable dict (or ``None``) per id.

        Raises:
            InvalidArgument: lengths disagree, a value is NaN/Infinity, or the server
                refused the input (wrong dimension, bad id, payload too large).
            NotFound: no such collection.
        """
        return self._execute(_calls.upsert(name, ids, vectors, payloads))

    def upsert_batches(
        self,
        name: str,
        ids: Sequence[Any],
        vectors: Vectors,
        payloads: Optional[Sequence[Any]] = None,
        batch_size: int = 1000,
        progress: Optional[ProgressCallback] = None,
        concurrency: int = 1,
    ) -> int:
        """Loads many points in batches of ``batch_size`` and returns the highest sequence.

        Args:
            progress: called as ``progress(points_done, points_total)`` after each
                batch (in the calling thread), e.g. to drive a progress bar.
            concurrency: batches in flight at once (threads); 1 sends them in order.

        Lengths are checked before anything is sent. A failing batch raises and stops
        the load; the batches before it are written (upserts are idempotent, so
        loading again from the start is safe).
        """
        total, batches = plan_batches(ids, vectors, payloads, batch_size, concurrency)
        done = 0
        highest_sequence = 0
        if concurrency == 1:
            for batch in batches:
                highest_sequence = max(highest_sequence, self._execute(batch.call(name)))
                done += batch.stop - batch.start
                if progress is not None:
                    progress(done, total)
            return highest_sequence

        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="quiver-upsert") as pool:
            in_flight: Dict[Future[int], int] = {}
            try:
                for batch in batches:
                    # Converting here keeps at most `concurrency` batches in memory.
                    future = pool.submit(self._execute, batch.call(name))
                    in_flight[future] = batch.stop - batch.start
                    if len(in_flight) >= concurrency:
                        done, highest_sequence = self._collect(
                            in_flight, done, total, highest_sequence, progress, FIRST_COMPLETED
                        )
                while in_flight:
                    done, highest_sequence = self._collect(
                        in_flight, done, total, highest_sequence, progress, FIRST_COMPLETED
                    )
            except BaseException:
                for future in in_flight:
                    future.cancel()
                raise
        return highest_sequence

    @staticmethod
    def _collect(
        in_flight: Dict["Future[int]", int],
        done: int,
        total: int,
        highest_sequence: int,
        progress: Optional[ProgressCallback],
        return_when: str,
    ) -> Tuple[int, int]:
        finished: Set[Future[int]]
        finished, _ = wait(list(in_flight), return_when=return_when)
        for future in finished:
            rows = in_flight.pop(future)
            highest_sequence = max(highest_sequence, future.result())
            done += rows
            if progress is not None:
                progress(done, total)
        return done, highest_sequence

    def delete(self, name: str, ids: Sequence[Any]) -> int:
        """Deletes points by id (missing ids are ignored) and returns the sequence number."""
        return self._execute(_calls.delete(name, ids))

    def get(self, name: str, ids: Sequence[Any], include_vector: bool = False) -> List[Point]:
        """Returns the stored points with these ids (ids not found are left out)."""
        return self._execute(_calls.get(name, ids, include_vector))

    # ---------------------------------------------------------------- search

    def search(
        self,
        name: str,
        vector: Any,
        k: int = 10,
        filter: Optional[Filter] = None,
        nprobe: Optional[int] = None,
        rescore: Optional[int] = None,
        consistency: Optional[str] = None,
        include_payload: bool = True,
        include_vector: bool = False,
    ) -> SearchResult:
        """Returns the ``k`` nearest points to ``vector``, best first.

        Args:
            vector: a list of floats or a 1-D numpy array.
            filter: a filter on payload fields (the schema's are indexed), as a string
                (``'lang = "en" and year >= 2020'``) or a JSON tree
                (``{"and": [{"field": "lang", "op": "=", "value": "en"}, ...]}``,
                ``{"field": "f", "in": [...]}``, ``{"not": {...}}``).
            nprobe: IVF lists probed per shard codebook (server default: calibrated).
            rescore: candidates rescored with full-precision vectors, as a multiple of k.
            consistency: ``"strong"`` (server default: acknowledged writes are
                visible) or ``"eventual"`` (may lag, never waits).
            include_payload: return payloads with the hits.
            include_vector: return the stored vectors with the hits (unit length in a
                cosine collection).

        Returns:
            A list of :class:`~quiver.Hit` (``.id``, ``.score``, ``.payload``,
            ``.vector``) that also has ``.took_ms``.
        """
        return self._execute(
            _calls.search(
                name, vector, k, filter, nprobe, rescore, consistency, include_payload, include_vector
            )
        )

    def search_batch(self, name: str, searches: Sequence[Mapping[str, Any]]) -> List[SearchResult]:
        """Runs several searches in one request and returns one hit list per search.

        Each search is a dict of :meth:`search`'s keyword arguments, e.g.
        ``{"vector": v, "k": 5, "filter": 'lang = "en"'}``.
        """
        return self._execute(_calls.search_batch(name, searches))

    # ----------------------------------------------------------------- admin

    def cluster_status(self) -> Dict[str, Any]:
        """Returns the cluster: ``meta`` (leader, term, members), ``nodes``, ``collections``."""
        return self._execute(_calls.cluster_status())

    def collection_shards(self, name: str) -> Dict[str, Any]:
        """Returns per shard: indexer and epoch, searchers and readiness, manifest, segments."""
        return self._execute(_calls.collection_shards(name))

    def compact(self, name: str) -> Dict[str, Any]:
        """Merges a collection's segments and waits until every shard is done.

        A large shard compacts for longer than one request waits: the gateway then
        answers ``{"done": false, "running_shards": [...]}`` while the compaction goes
        on, and this asks again (joining it). The answer's ``merges`` counts them all.
        """
        merges = 0
        while True:
            answer = self._execute(_calls.compact(name))
            merges += int(answer.get("merges", 0))
            if answer.get("done", True) is not False:
                answer["merges"] = merges
                return answer

    def drain_node(self, node_id: Union[str, int]) -> Dict[str, Any]:
        """Moves all work off a node before it is taken down; returns the server's answer."""
        return self._execute(_calls.drain_node(str(node_id)))

    def healthz(self) -> bool:
        """Returns whether the gateway process is up (``/healthz`` answers 2xx).

        Never raises: an unreachable server is ``False``.
        """
        return self._probe("/healthz")

    def readyz(self) -> bool:
        """Returns whether the gateway is ready to serve (``/readyz`` answers 2xx).

        Never raises: an unreachable server is ``False``.
        """
        return self._probe("/readyz")

    def wait_until_ready(self, timeout: float = 30.0, interval: float = 0.2) -> None:
        """Polls ``/readyz`` until it answers 2xx.

        Raises:
            DeadlineExceeded: not ready within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while not self.readyz():
            if time.monotonic() >= deadline:
                raise DeadlineExceeded(
                    f"{self._settings.endpoint} was not ready within {timeout:g}s"
                )
            time.sleep(interval)
