"""Bulk loading with upsert_batches (sync)."""

from __future__ import annotations

import pytest

import quiver
from fake_gateway import FakeGateway

np = pytest.importorskip("numpy")

pytestmark = pytest.mark.usefixtures("each_encoder")


@pytest.fixture
def loaded(client: quiver.Client) -> str:
    client.create_collection("bulk", dimension=8, metric="l2", payload_schema={"part": "integer"})
    return "bulk"


def test_batches_in_order_with_progress(client: quiver.Client, gateway: FakeGateway, loaded: str) -> None:
    vectors = np.random.default_rng(3).standard_normal((2500, 8)).astype(np.float32)
    payloads = [{"part": i % 5} for i in range(2500)]
    progress = []
    sequence = client.upsert_batches(
        "bulk", ids=np.arange(2500), vectors=vectors, payloads=payloads, batch_size=1000,
        progress=lambda done, total: progress.append((done, total)),
    )
    assert progress == [(1000, 2500), (2000, 2500), (2500, 2500)]
    batches = [request.body["points"] for request in gateway.requests_to("/points")]
    assert [len(batch) for batch in batches] == [1000, 1000, 500]
    assert batches[2][0]["id"] == 2000 and batches[2][0]["payload"] == {"part": 0}
    assert sequence == 3
    assert client.describe("bulk")["points"] == 2500
    hits = client.search("bulk", vectors[1234], k=1, filter="part = 4")
    assert hits[0].id == 1234 and hits[0].score == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("concurrency", [2, 4])
def test_concurrent_batches(client: quiver.Client, gateway: FakeGateway, loaded: str, concurrency: int) -> None:
    vectors = [[float(i)] * 8 for i in range(1050)]
    progress = []
    sequence = client.upsert_batches(
        "bulk", ids=list(range(1050)), vectors=vectors, batch_size=100, concurrency=concurrency,
        progress=lambda done, total: progress.append(done),
    )
    assert progress == sorted(progress) and progress[-1] == 1050 and len(progress) == 11
    assert sequence == 11
    assert client.describe("bulk")["points"] == 1050


def test_a_failing_batch_stops_the_load(client: quiver.Client, gateway: FakeGateway, loaded: str) -> None:
    vectors = np.zeros((30, 8))
    gateway.fail_next(400, {"error": {"code": "INVALID_ARGUMENT", "message": "payload too large"}}, times=1, path_contains="/points")
    progress = []
    with pytest.raises(quiver.InvalidArgument, match="payload too large"):
        client.upsert_batches("bulk", ids=range(30), vectors=vectors, batch_size=10, progress=lambda d, t: progress.append(d))
    assert progress == [] and len(gateway.requests_to("/points")) == 1


def test_bad_rows_name_their_batch(client: quiver.Client, gateway: FakeGateway, loaded: str) -> None:
    vectors = np.zeros((30, 8))
    vectors[25, 3] = np.nan
    with pytest.raises(quiver.InvalidArgument, match=r"rows 20\.\.29: vectors\[5\]\[3\] is nan"):
        client.upsert_batches("bulk", ids=range(30), vectors=vectors, batch_size=10)
    assert client.describe("bulk")["points"] == 20  # the batches before were written


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"ids": [1, 2], "vectors": np.zeros((3, 8))}, "3 rows but there are 2 ids"),
        ({"ids": [1, 2], "vectors": np.zeros((2, 8)), "payloads": [{}]}, "1 entries but there are 2 ids"),
        ({"ids": [1], "vectors": np.zeros((1, 8)), "batch_size": 0}, "batch_size"),
        ({"ids": [1], "vectors": np.zeros((1, 8)), "concurrency": 0}, "concurrency"),
        ({"ids": [1, True], "vectors": np.zeros((2, 8))}, "is a bool"),
    ],
)
def test_mismatches_fail_before_anything_is_sent(client: quiver.Client, gateway: FakeGateway, arguments: dict, message: str) -> None:
    with pytest.raises(quiver.InvalidArgument, match=message):
        client.upsert_batches("bulk", **arguments)
    assert gateway.requests == []


def test_an_empty_load_sends_nothing(client: quiver.Client, gateway: FakeGateway) -> None:
    assert client.upsert_batches("bulk", ids=[], vectors=[]) == 0
    assert gateway.requests == []
