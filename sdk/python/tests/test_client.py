"""The sync client against the fake gateway: every method, its REST shape and its result."""

from __future__ import annotations

import pathlib
import re

import httpx
import pytest

import quiver
from fake_gateway import FakeGateway, wire_floats


def unit(index: int, dimension: int = 4) -> list:
    vector = [0.0] * dimension
    vector[index % dimension] = 1.0
    return vector


@pytest.fixture
def docs(client: quiver.Client) -> str:
    client.create_collection("docs", dimension=4, metric="cosine", payload_schema={"lang": "keyword", "year": "integer"})
    client.upsert(
        "docs",
        ids=[1, 2, 3, 4],
        vectors=[[1, 0, 0, 0], [0.9, 0.1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]],
        payloads=[{"lang": "en", "year": 2020}, {"lang": "de", "year": 2021}, {"lang": "en", "year": 2022}, None],
    )
    return "docs"


def test_create_collection_sends_the_contract_body(client: quiver.Client, gateway: FakeGateway) -> None:
    description = client.create_collection(
        "docs",
        dimension=16,
        metric="l2",
        id_type="string",
        shards=4,
        replication=2,
        index={"quantization": "rabitq"},
        payload_schema={"lang": "keyword", "price": "float"},
    )
    request = gateway.requests_to("/v1/collections/docs")[0]
    assert request.method == "PUT"
    assert request.body == {
        "dimension": 16,
        "metric": "l2",
        "id_type": "string",
        "shards": 4,
        "replication": 2,
        "index": {"quantization": "rabitq"},
        "payload_schema": [{"name": "lang", "type": "keyword"}, {"name": "price", "type": "float"}],
    }
    assert description["name"] == "docs" and description["dimension"] == 16


def test_create_collection_leaves_out_unset_options(client: quiver.Client, gateway: FakeGateway) -> None:
    client.create_collection("plain", dimension=8)
    assert gateway.requests_to("/v1/collections/plain")[0].body == {"dimension": 8, "metric": "cosine"}


def test_create_twice_raises_already_exists(client: quiver.Client) -> None:
    client.create_collection("docs", dimension=4)
    with pytest.raises(quiver.AlreadyExists) as caught:
        client.create_collection("docs", dimension=4)
    error = caught.value
    assert isinstance(error, quiver.QuiverError)
    assert error.code == "ALREADY_EXISTS" and error.status == 409
    assert "already exists" in error.message
    assert re.fullmatch(r"[0-9a-f]{32}", error.request_id or "")


def test_list_describe_drop(client: quiver.Client, docs: str) -> None:
    client.create_collection("other", dimension=2)
    names = [collection["name"] for collection in client.list_collections()]
    assert sorted(names) == ["docs", "other"]
    assert client.describe("docs")["points"] == 4
    client.drop_collection("other")
    with pytest.raises(quiver.NotFound):
        client.describe("other")
    with pytest.raises(quiver.NotFound):
        client.drop_collection("other")
    assert [c["name"] for c in client.list_collections()] == ["docs"]


def test_upsert_sends_points_and_returns_the_sequence(client: quiver.Client, gateway: FakeGateway) -> None:
    client.create_collection("docs", dimension=2)
    first = client.upsert("docs", ids=[7, 8], vectors=[[0.5, 1], (2.0, -1.5)], payloads=[{"a": 1}, None])
    second = client.upsert("docs", ids=[9], vectors=[[1.0, 1.0]])
    assert second > first > 0
    bodies = [request.body for request in gateway.requests_to("/points")]
    for body in bodies:  # vectors travel as base64 of little-endian float32
        for point in body["points"]:
            point["vector"] = wire_floats(point["vector"])
    assert bodies[0] == {"points": [{"id": 7, "vector": [0.5, 1], "payload": {"a": 1}}, {"id": 8, "vector": [2.0, -1.5]}]}
    assert bodies[1] == {"points": [{"id": 9, "vector": [1.0, 1.0]}]}


def test_search_returns_hits_best_first(client: quiver.Client, docs: str, gateway: FakeGateway) -> None:
    hits = client.search("docs", [1, 0, 0, 0], k=2)
    assert isinstance(hits, list) and isinstance(hits, quiver.SearchResult)
    assert [hit.id for hit in hits] == [1, 2]
    assert hits[0] == quiver.Hit(id=1, score=pytest.approx(1.0), payload={"lang": "en", "year": 2020})
    assert isinstance(hits[0].score, float) and hits[0].score >= hits[1].score
    assert hits[0].vector is None
    assert hits.took_ms == 0.25
    sent = gateway.requests_to("/search")[0].body
    assert isinstance(sent["vector"], str)
    assert {**sent, "vector": wire_floats(sent["vector"])} == {
        "vector": [1, 0, 0, 0],
        "k": 2,
        "include_payload": True,
        "include_vector": False,
    }


def test_search_options_are_sent(client: quiver.Client, docs: str, gateway: FakeGateway) -> None:
    hits = client.search(
        "docs", [0, 1, 0, 0], k=1, nprobe=32, rescore=4, consistency="eventual",
        include_payload=False, include_vector=True,
    )
    assert hits[0].id == 3 and hits[0].payload is None and hits[0].vector == [0.0, 1.0, 0.0, 0.0]
    body = gateway.requests_to("/search")[0].body
    assert body["nprobe"] == 32 and body["rescore"] == 4 and body["consistency"] == "eventual"
    assert body["include_payload"] is False and body["include_vector"] is True


@pytest.mark.parametrize(
    "search_filter",
    [
        'lang = "en"',
        {"field": "lang", "op": "=", "value": "en"},
        {"field": "lang", "in": ["en"]},
        {"not": {"field": "lang", "not_in": ["en"]}},
        'lang = "en" and (year >= 2020 or year < 0)',
        {"and": [{"field": "lang", "value": "en"}, {"or": [{"field": "year", "op": ">=", "value": 2020}]}]},
    ],
)
def test_filters_pass_through_as_given(client: quiver.Client, docs: str, gateway: FakeGateway, search_filter: object) -> None:
    hits = client.search("docs", [1, 0, 0, 0], k=10, filter=search_filter, consistency="strong")
    assert sorted(hit.id for hit in hits) == [1, 3]
    body = gateway.requests_to("/search")[0].body
    assert body["filter"] == search_filter and body["consistency"] == "strong"


def test_a_filter_on_an_undeclared_field_is_sent_and_a_mistyped_one_raises(client: quiver.Client, docs: str) -> None:
    assert client.search("docs", [1, 0, 0, 0], filter='color = "red"') == []
    with pytest.raises(quiver.InvalidArgument, match="compares field"):
        client.search("docs", [1, 0, 0, 0], filter='year = "old"')


def test_get_and_delete(client: quiver.Client, docs: str, gateway: FakeGateway) -> None:
    points = client.get("docs", ids=[2, 4, 99])
    assert points == [quiver.Point(id=2, payload={"lang": "de", "year": 2021}), quiver.Point(id=4)]
    assert gateway.requests_to("/points/get")[0].body == {"ids": [2, 4, 99], "include_vector": False}
    with_vector = client.get("docs", ids=[3], include_vector=True)
    assert with_vector[0].vector == [0.0, 1.0, 0.0, 0.0]

    sequence = client.delete("docs", ids=[1, 99])
    assert isinstance(sequence, int) and sequence > 0
    assert gateway.requests_to("/points/delete")[0].body == {"ids": [1, 99]}
    assert client.get("docs", ids=[1]) == []
    assert 1 not in [hit.id for hit in client.search("docs", [1, 0, 0, 0], consistency="strong")]


def test_string_ids(client: quiver.Client) -> None:
    client.create_collection("named", dimension=2, id_type="string")
    client.upsert("named", ids=["alpha", "beta"], vectors=[[1, 0], [0, 1]])
    assert client.search("named", [0, 1], k=1)[0].id == "beta"
    with pytest.raises(quiver.InvalidArgument, match="id must be a string"):
        client.upsert("named", ids=[5], vectors=[[1, 0]])


def test_search_batch(client: quiver.Client, docs: str, gateway: FakeGateway) -> None:
    results = client.search_batch(
        "docs",
        [{"vector": [1, 0, 0, 0], "k": 1}, {"vector": [0, 0, 1, 0], "k": 2, "filter": 'lang = "en"', "consistency": "strong"}],
    )
    assert len(results) == 2
    assert [hit.id for hit in results[0]] == [1]
    assert [hit.id for hit in results[1]] == [1, 3] or [hit.id for hit in results[1]] == [3, 1]
    assert results[0].took_ms == 0.25
    searches = gateway.requests_to("/search/batch")[0].body["searches"]
    searches[1]["vector"] = wire_floats(searches[1]["vector"])
    assert searches[1] == {"vector": [0, 0, 1, 0], "k": 2, "filter": 'lang = "en"', "consistency": "strong", "include_payload": True, "include_vector": False}


def test_search_batch_rejects_unknown_keys(client: quiver.Client, gateway: FakeGateway) -> None:
    with pytest.raises(quiver.InvalidArgument, match="unknown keys"):
        client.search_batch("docs", [{"vector": [1.0], "top_k": 3}])
    assert gateway.requests == []


def test_admin_calls(client: quiver.Client, docs: str, gateway: FakeGateway) -> None:
    status = client.cluster_status()
    assert status["meta"]["leader"] == 1 and status["collections"] == 1
    assert client.collection_shards("docs")["shards"][0]["epoch"] == 1
    # The first answer is "still running" (202): compact asks again until done.
    compacted = client.compact("docs")
    assert compacted["done"] is True and compacted["merges"] == 3
    assert client.drain_node("standalone")["state"] == "draining"
    with pytest.raises(quiver.NotFound):
        client.drain_node("node/7")
    assert gateway.requests_to("/drain")[-1].path == "/admin/v1/nodes/node%2F7/drain"
    assert [(r.method, r.path) for r in gateway.requests[-6:-1]] == [
        ("GET", "/admin/v1/cluster"),
        ("GET", "/admin/v1/collections/docs/shards"),
        ("POST", "/admin/v1/collections/docs/compact"),
        ("POST", "/admin/v1/collections/docs/compact"),
        ("POST", "/admin/v1/nodes/standalone/drain"),
    ]


def test_health_probes(client: quiver.Client, gateway: FakeGateway, closed_port: int) -> None:
    assert client.healthz() is True
    assert client.readyz() is True
    gateway.ready = False
    assert client.readyz() is False
    with pytest.raises(quiver.DeadlineExceeded, match="not ready"):
        client.wait_until_ready(timeout=0.2, interval=0.05)
    gateway.ready = True
    client.wait_until_ready(timeout=1.0)
    with quiver.Client(f"http://127.0.0.1:{closed_port}") as unreachable:
        assert unreachable.healthz() is False and unreachable.readyz() is False


def test_collection_names_are_path_escaped(client: quiver.Client, gateway: FakeGateway) -> None:
    client.create_collection("my docs/v2?", dimension=2)
    assert gateway.requests[-1].path == "/v1/collections/my%20docs%2Fv2%3F"
    assert client.describe("my docs/v2?")["name"] == "my docs/v2?"
    with pytest.raises(quiver.InvalidArgument, match="collection name"):
        client.describe("")


def test_headers_auth_and_request_ids(gateway: FakeGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUIVER_API_KEY", raising=False)
    gateway.api_key = "s3cret"
    with quiver.Client(gateway.endpoint) as anonymous:
        with pytest.raises(quiver.Unauthenticated) as caught:
            anonymous.list_collections()
        assert caught.value.status == 401
    with quiver.Client(gateway.endpoint, api_key="s3cret", headers={"X-Tenant": "a"}) as client:
        client.list_collections()
        client.list_collections()
    first, second = gateway.requests[-2:]
    assert first.headers["authorization"] == "Bearer s3cret"
    assert first.headers["x-tenant"] == "a"
    assert first.headers["user-agent"].startswith("quiver-python/")
    assert re.fullmatch(r"[0-9a-f]{32}", first.headers["x-request-id"])
    assert first.headers["x-request-id"] != second.headers["x-request-id"]

    monkeypatch.setenv("QUIVER_API_KEY", "s3cret")
    with quiver.Client(gateway.endpoint) as from_environment:
        assert from_environment.list_collections() == []


def test_connections_are_reused(client: quiver.Client, docs: str, gateway: FakeGateway) -> None:
    for _ in range(5):
        client.search("docs", [1, 0, 0, 0])
    ports = {request.client_port for request in gateway.requests_to("/search")}
    assert len(ports) == 1


def test_context_manager_closes_the_pool(gateway: FakeGateway) -> None:
    with quiver.Client(gateway.endpoint) as client:
        assert client.list_collections() == []
    with pytest.raises(RuntimeError):
        client.list_collections()


def test_bad_endpoints_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="http"):
        quiver.Client("localhost:7700")
    with pytest.raises(ValueError, match="retries"):
        quiver.Client("http://localhost:7700", retries=-1)


def test_a_custom_transport_is_used() -> None:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.headers["authorization"]))
        return httpx.Response(200, json={"hits": [{"id": 5, "score": 0.5}], "took_ms": 1})

    with quiver.Client("http://quiver.test", api_key="k", transport=httpx.MockTransport(handler)) as client:
        hits = client.search("c", [1.0, 2.0])
    assert hits == [quiver.Hit(id=5, score=0.5)]
    assert seen == [("POST", "/v1/collections/c/search", "Bearer k")]


def test_a_ca_bundle_that_cannot_be_read_is_refused(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "missing-ca.pem"
    with pytest.raises(ValueError, match="missing-ca.pem"):
        quiver.Client("https://localhost:7700", verify=str(missing))
    not_pem = tmp_path / "not-pem.pem"
    not_pem.write_text("hello\n")
    with pytest.raises(ValueError, match="not-pem.pem"):
        quiver.AsyncClient("https://localhost:7700", verify=not_pem)
    monkeypatch.setenv("QUIVER_CA_CERT", str(missing))
    with pytest.raises(ValueError, match="missing-ca.pem"):
        quiver.Client("https://localhost:7700")
