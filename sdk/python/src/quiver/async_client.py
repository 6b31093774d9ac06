"""The asyncio client: the same methods as :class:`quiver.Client`, awaited."""

from __future__ import annotations

import asyncio
import time
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

__all__ = ["AsyncClient"]

#: Upserts of at least this many points are encoded off the event loop.
_LARGE_UPSERT_POINTS = 256


def _is_large(ids: Any) -> bool:
    try:
        return len(ids) >= _LARGE_UPSERT_POINTS
    except TypeError:
        return False


class AsyncClient:
    """An asyncio connection to a Quiver gateway; see :class:`quiver.Client`.

    Example::

        async with AsyncClient("http://localhost:7700") as client:
            hits = await client.search("docs", query, k=10, consistency="strong")

    Takes the same arguments as :class:`quiver.Client` (``transport`` is an
    ``httpx.AsyncBaseTransport``). Safe to share between tasks of one event loop.
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
        transport: Optional[httpx.AsyncBaseTransport] = None,
        backoff_base: float = 0.1,
        backoff_max: float = 5.0,
        max_retry_after: float = 60.0,
    ) -> None:
        self._settings = ClientSettings.build(
            endpoint, api_key, timeout, retries, backoff_base, backoff_max, max_retry_after, headers
        )
        self._http = httpx.AsyncClient(
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
        return f"AsyncClient({self._settings.endpoint!r})"

    # ------------------------------------------------------------- lifecycle

    async def aclose(self) -> None:
        """Closes the pooled connections. The client cannot be used afterwards."""
        await self._http.aclose()

    async def close(self) -> None:
        """Same as :meth:`aclose`."""
        await self.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        await self.aclose()

    # ------------------------------------------------------------- execution

    async def _execute(self, call: ApiCall[T]) -> T:
        request_id = new_request_id()
        budget = retry_budget(self._settings, call)
        attempt = 0
        while True:
            try:
                response = await self._http.request(
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
            await asyncio.sleep(delay)
            attempt += 1

    async def _probe(self, path: str) -> bool:
        try:
            response = await self._http.get(path, headers={"x-request-id": new_request_id()})
        except httpx.HTTPError:
            return False
        return 200 <= response.status_code < 300

    # ----------------------------------------------------------- collections

    async def create_collection(
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
        """Creates a collection; see :meth:`quiver.Client.create_collection`."""
        return await self._execute(
            _calls.create_collection(
                name, dimension, metric, id_type, shards, replication, index, payload_schema
            )
        )

    async def list_collections(self) -> List[Dict[str, Any]]:
        """Returns the collections, each a dict with at least ``name``."""
        return await self._execute(_calls.list_collections())

    async def describe(self, name: str) -> Dict[str, Any]:
        """Returns a collection's parameters and stats; see :meth:`quiver.Client.describe`."""
        return await self._execute(_calls.describe(name))

    async def drop_collection(self, name: str) -> None:
        """Deletes a collection and all its points."""
        await self._execute(_calls.drop_collection(name))

    # ---------------------------------------------------------------- points

    async def upsert(
        self, name: str, ids: Sequence[Any], vectors: Vectors, payloads: Optional[Sequence[Any]] = None
    ) -> int:
        """Inserts or replaces points; see :meth:`quiver.Client.upsert`.

        Large requests are encoded in a worker thread, so the event loop stays responsive.
        """
        if _is_large(ids):
            call = await asyncio.get_running_loop().run_in_executor(
                None, _calls.upsert, name, ids, vectors, payloads
            )
        else:
            call = _calls.upsert(name, ids, vectors, payloads)
        return await self._execute(call)

    async def upsert_batches(
        self,
        name: str,
        ids: Sequence[Any],
        vectors: Vectors,
        payloads: Optional[Sequence[Any]] = None,
        batch_size: int = 1000,
        progress: Optional[ProgressCallback] = None,
        concurrency: int = 1,
    ) -> int:
        """Loads many points in batches; see :meth:`quiver.Client.upsert_batches`.

        With ``concurrency > 1`` that many batches are in flight as tasks.
        """
        total, batches = plan_batches(ids, vectors, payloads, batch_size, concurrency)
        done = 0
        highest_sequence = 0
        in_flight: Dict["asyncio.Task[int]", int] = {}

        async def collect(return_when: str) -> Tuple[int, int]:
            nonlocal done, highest_sequence
            finished: Set["asyncio.Task[int]"]
            finished, _ = await asyncio.wait(list(in_flight), return_when=return_when)
            for task in finished:
                rows = in_flight.pop(task)
                highest_sequence = max(highest_sequence, task.result())
                done += rows
                if progress is not None:
                    progress(done, total)
            return done, highest_sequence

        loop = asyncio.get_running_loop()
        try:
            for batch in batches:
                # Encoding a batch takes milliseconds of CPU: keep it off the event loop.
                call = await loop.run_in_executor(None, batch.call, name)
                task = asyncio.ensure_future(self._execute(call))
                in_flight[task] = batch.stop - batch.start
                if len(in_flight) >= concurrency:
                    await collect(asyncio.FIRST_COMPLETED)
            while in_flight:
                await collect(asyncio.FIRST_COMPLETED)
        except BaseException:
            for task in in_flight:
                task.cancel()
            if in_flight:
                await asyncio.gather(*in_flight, return_exceptions=True)
            raise
        return highest_sequence

    async def delete(self, name: str, ids: Sequence[Any]) -> int:
        """Deletes points by id and returns the sequence number."""
        return await self._execute(_calls.delete(name, ids))

    async def get(self, name: str, ids: Sequence[Any], include_vector: bool = False) -> List[Point]:
        """Returns the stored points with these ids (ids not found are left out)."""
        return await self._execute(_calls.get(name, ids, include_vector))

    # ---------------------------------------------------------------- search

    async def search(
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
        """Returns the ``k`` nearest points, best first; see :meth:`quiver.Client.search`."""
        return await self._execute(
            _calls.search(
                name, vector, k, filter, nprobe, rescore, consistency, include_payload, include_vector
            )
        )

    async def search_batch(
        self, name: str, searches: Sequence[Mapping[str, Any]]
    ) -> List[SearchResult]:
        """Runs several searches in one request; see :meth:`quiver.Client.search_batch`."""
        return await self._execute(_calls.search_batch(name, searches))

    # ----------------------------------------------------------------- admin

    async def cluster_status(self) -> Dict[str, Any]:
        """Returns the cluster: ``meta`` (leader, term, members), ``nodes``, ``collections``."""
        return await self._execute(_calls.cluster_status())

    async def collection_shards(self, name: str) -> Dict[str, Any]:
        """Returns per shard: indexer and epoch, searchers and readiness, manifest, segments."""
        return await self._execute(_calls.collection_shards(name))

    async def compact(self, name: str) -> Dict[str, Any]:
        """Merges a collection's segments and waits until every shard is done.

        See :meth:`quiver.Client.compact`: a ``"done": false`` answer (the
        compaction outlasted one request) is asked again until every shard is done.
        """
        merges = 0
        while True:
            answer = await self._execute(_calls.compact(name))
            merges += int(answer.get("merges", 0))
            if answer.get("done", True) is not False:
                answer["merges"] = merges
                return answer

    async def drain_node(self, node_id: Union[str, int]) -> Dict[str, Any]:
        """Moves all work off a node before it is taken down."""
        return await self._execute(_calls.drain_node(str(node_id)))

    async def healthz(self) -> bool:
        """Returns whether ``/healthz`` answers 2xx (``False`` when unreachable)."""
        return await self._probe("/healthz")

    async def readyz(self) -> bool:
        """Returns whether ``/readyz`` answers 2xx (``False`` when unreachable)."""
        return await self._probe("/readyz")

    async def wait_until_ready(self, timeout: float = 30.0, interval: float = 0.2) -> None:
        """Polls ``/readyz`` until it answers 2xx; raises DeadlineExceeded after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not await self.readyz():
            if time.monotonic() >= deadline:
                raise DeadlineExceeded(
                    f"{self._settings.endpoint} was not ready within {timeout:g}s"
                )
            await asyncio.sleep(interval)
