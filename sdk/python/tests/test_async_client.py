"""The asyncio client against the fake gateway."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

import quiver
from fake_gateway import FakeGateway

np = pytest.importorskip("numpy")


async def test_the_whole_flow(async_client: quiver.AsyncClient, gateway: FakeGateway) -> None:
    await async_client.create_collection("docs", dimension=4, payload_schema=[{"name": "lang", "type": "keyword"}])
    vectors = np.eye(4, dtype=np.float32)
    sequence = await async_client.upsert("docs", ids=[1, 2, 3, 4], vectors=vectors, payloads=[{"lang": "en"}, {"lang": "de"}, {"lang": "en"}, None])
    assert sequence > 0
    hits = await async_client.search("docs", vectors[2], k=2, filter='lang = "en"', consistency="strong")
    assert [hit.id for hit in hits] == [3, 1] and hits[0].payload == {"lang": "en"}
    assert isinstance(hits[0], quiver.Hit) and hits.took_ms == 0.25
    batch = await async_client.search_batch("docs", [{"vector": vectors[0], "k": 1}, {"vector": vectors[1], "k": 1}])
    assert [result[0].id for result in batch] == [1, 2]
    assert await async_client.get("docs", ids=[4], include_vector=True) == [quiver.Point(id=4, vector=[0.0, 0.0, 0.0, 1.0])]
    await async_client.delete("docs", ids=[3])
    assert 3 not in [hit.id for hit in await async_client.search("docs", vectors[2], consistency="strong")]
    assert (await async_client.describe("docs"))["points"] == 3
    assert [c["name"] for c in await async_client.list_collections()] == ["docs"]
    assert (await async_client.cluster_status())["collections"] == 1
    assert (await async_client.collection_shards("docs"))["shards"]
    compacted = await async_client.compact("docs")
    assert compacted["done"] is True and compacted["merges"] == 3
    assert (await async_client.drain_node("standalone"))["state"] == "draining"
    assert await async_client.healthz() and await async_client.readyz()
    await async_client.wait_until_ready(timeout=1.0)
    await async_client.drop_collection("docs")
    with pytest.raises(quiver.NotFound) as caught:
        await async_client.describe("docs")
    assert caught.value.status == 404 and caught.value.request_id


async def test_concurrent_searches_share_connections(async_client: quiver.AsyncClient, gateway: FakeGateway) -> None:
    await async_client.create_collection("docs", dimension=2)
    await async_client.upsert("docs", ids=[1, 2], vectors=[[1, 0], [0, 1]])
    results = await asyncio.gather(*(async_client.search("docs", [1, i % 2], k=1) for i in range(20)))
    assert all(result[0].id == 1 for result in results)
    ports = {request.client_port for request in gateway.requests_to("/search")}
    assert len(ports) <= 20
    ids = {request.headers["x-request-id"] for request in gateway.requests_to("/search")}
    assert len(ids) == 20


async def test_retry_after_is_honoured(async_client: quiver.AsyncClient, gateway: FakeGateway) -> None:
    gateway.fail_next(503, {"error": {"code": "UNAVAILABLE", "message": "electing"}}, times=1, headers={"retry-after": "0.3"})
    started = time.monotonic()
    assert await async_client.list_collections() == []
    assert time.monotonic() - started >= 0.3
    assert len(gateway.requests) == 2


async def test_errors_and_no_retry(async_client: quiver.AsyncClient, gateway: FakeGateway, closed_port: int) -> None:
    gateway.fail_next(400, {"error": {"code": "INVALID_ARGUMENT", "message": "bad k"}}, times=5)
    with pytest.raises(quiver.InvalidArgument, match="bad k"):
        await async_client.list_collections()
    assert len(gateway.requests) == 1
    async with quiver.AsyncClient(f"http://127.0.0.1:{closed_port}", retries=1, backoff_base=0.01) as unreachable:
        with pytest.raises(quiver.Unavailable, match="cannot connect"):
            await unreachable.list_collections()
        assert await unreachable.healthz() is False


async def test_timeout(gateway: FakeGateway) -> None:
    gateway.delay_seconds = 0.5
    async with quiver.AsyncClient(gateway.endpoint, timeout=0.1) as client:
        with pytest.raises(quiver.DeadlineExceeded):
            await client.list_collections()


@pytest.mark.parametrize("concurrency", [1, 3])
async def test_upsert_batches_with_progress(async_client: quiver.AsyncClient, gateway: FakeGateway, concurrency: int) -> None:
    await async_client.create_collection("bulk", dimension=4)
    vectors = np.random.default_rng(5).standard_normal((950, 4))
    progress = []
    sequence = await async_client.upsert_batches(
        "bulk", ids=np.arange(950), vectors=vectors, batch_size=100, concurrency=concurrency,
        progress=lambda done, total: progress.append((done, total)),
    )
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)
    assert progress[-1] == (950, 950) and len(progress) == 10
    assert sequence == 10
    assert (await async_client.describe("bulk"))["points"] == 950


async def test_a_failing_batch_cancels_the_rest(async_client: quiver.AsyncClient, gateway: FakeGateway) -> None:
    await async_client.create_collection("bulk", dimension=4)
    gateway.fail_next(404, {"error": {"code": "NOT_FOUND", "message": "collection dropped"}}, times=1, path_contains="/points")
    with pytest.raises(quiver.NotFound, match="collection dropped"):
        await async_client.upsert_batches("bulk", ids=range(1000), vectors=np.zeros((1000, 4)), batch_size=100, concurrency=2)
    assert len(gateway.requests_to("/points")) < 10


async def test_a_custom_async_transport() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"sequence": 42})

    async with quiver.AsyncClient("http://quiver.test", transport=httpx.MockTransport(handler)) as client:
        assert await client.delete("c", ids=["a"]) == 42


async def test_large_upserts_do_not_block_the_event_loop(async_client: quiver.AsyncClient, gateway: FakeGateway) -> None:
    await async_client.create_collection("big", dimension=64)
    vectors = np.random.default_rng(9).standard_normal((4000, 64))
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    ticking = asyncio.ensure_future(ticker())
    await async_client.upsert("big", ids=range(2000), vectors=vectors[:2000])
    await async_client.upsert_batches("big", ids=range(2000, 4000), vectors=vectors[2000:], batch_size=500)
    stop.set()
    await ticking
    assert ticks > 5
    assert (await async_client.describe("big"))["points"] == 4000
    with pytest.raises(quiver.InvalidArgument, match="1 rows but there are 300 ids"):
        await async_client.upsert("big", ids=range(300), vectors=vectors[:1])
