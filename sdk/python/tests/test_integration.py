"""Integration tests against a real Quiver server.

Run when one of these is set, skipped otherwise:

- ``QUIVER_TEST_ENDPOINT=http://127.0.0.1:7700``: a running server (e.g. ``quiver standalone``);
- ``QUIVER_BIN=/path/to/quiver``: the fixture starts ``quiver standalone`` on free loopback
  ports with a temporary data directory, and stops it afterwards.

Each run uses collections with a random suffix and drops them, so a shared server is fine.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import httpx
import pytest

import quiver

ENDPOINT = os.environ.get("QUIVER_TEST_ENDPOINT")
BINARY = os.environ.get("QUIVER_BIN")

pytestmark = pytest.mark.skipif(
    not ENDPOINT and not BINARY,
    reason="integration tests need QUIVER_TEST_ENDPOINT (a running server) or QUIVER_BIN (a quiver binary)",
)

DIMENSION = 16
POINTS = 200


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    if ENDPOINT:
        yield ENDPOINT.rstrip("/")
        return
    assert BINARY is not None
    data_dir = tempfile.mkdtemp(prefix="quiver-pysdk-it-")
    log_path = Path(data_dir) / "quiver.log"
    http_port, grpc_port = _free_port(), _free_port()
    url = f"http://127.0.0.1:{http_port}"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                BINARY, "standalone", "--data-dir", str(Path(data_dir) / "data"),
                "--http-listen", f"127.0.0.1:{http_port}", "--grpc-listen", f"127.0.0.1:{grpc_port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        with quiver.Client(url) as probe:
            deadline = time.monotonic() + 60
            while not probe.readyz():
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_text(errors="replace")[-3000:]
                    pytest.fail(f"quiver standalone did not become ready (exit {process.poll()}):\n{tail}")
                time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def client(endpoint: str) -> Iterator[quiver.Client]:
    with quiver.Client(endpoint, timeout=30.0) as client:
        yield client


def _unit(vector: List[float]) -> List[float]:
    norm = math.sqrt(sum(value * value for value in vector))
    return [value / norm for value in vector]


def _cosine(a: List[float], b: List[float]) -> float:
    return sum(x * y for x, y in zip(_unit(a), _unit(b)))


Loaded = Tuple[str, List[List[float]], List[Dict[str, Any]]]


@pytest.fixture(scope="module")
def loaded(client: quiver.Client) -> Iterator[Loaded]:
    name = f"pysdk_it_{uuid.uuid4().hex[:10]}"
    client.create_collection(name, dimension=DIMENSION, metric="cosine", payload_schema={"lang": "keyword"})
    generator = random.Random(7)
    vectors = [[generator.gauss(0.0, 1.0) for _ in range(DIMENSION)] for _ in range(POINTS)]
    payloads = [{"lang": "en" if point_id % 2 == 0 else "de", "n": point_id} for point_id in range(POINTS)]
    progress: List[int] = []
    sequence = client.upsert_batches(
        name, ids=list(range(POINTS)), vectors=vectors, payloads=payloads, batch_size=64,
        progress=lambda done, total: progress.append(done),
    )
    assert sequence > 0 and progress[-1] == POINTS
    yield name, vectors, payloads
    try:
        client.drop_collection(name)
    except quiver.NotFound:
        pass


def test_health_and_cluster_status(client: quiver.Client) -> None:
    assert client.healthz() and client.readyz()
    status = client.cluster_status()
    assert "meta" in status and "nodes" in status


def test_describe_and_list(client: quiver.Client, loaded: Loaded) -> None:
    name = loaded[0]
    assert name in [collection["name"] for collection in client.list_collections()]
    description = client.describe(name)
    assert description["dimension"] == DIMENSION and description["metric"] == "cosine"
    deadline = time.monotonic() + 10
    while client.describe(name)["points"] != POINTS and time.monotonic() < deadline:
        time.sleep(0.2)  # stats may trail the acknowledged writes briefly
    assert client.describe(name)["points"] == POINTS


def test_the_exact_vector_is_the_top_hit(client: quiver.Client, loaded: Loaded) -> None:
    name, vectors, payloads = loaded
    for point_id in (0, 17, 199):
        hits = client.search(name, vectors[point_id], k=10, consistency="strong")
        assert len(hits) == 10
        assert hits[0].id == point_id
        assert hits[0].score == pytest.approx(1.0, abs=1e-3)
        assert hits[0].payload == payloads[point_id]
        assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))
        expected = sorted(range(POINTS), key=lambda other: -_cosine(vectors[point_id], vectors[other]))[:10]
        assert len(set(hit.id for hit in hits) & set(expected)) >= 8  # recall@10 of an ANN index


def test_search_with_a_filter(client: quiver.Client, loaded: Loaded) -> None:
    name, vectors, _ = loaded
    for search_filter in ('lang = "en"', {"field": "lang", "op": "=", "value": "en"}, {"field": "lang", "in": ["en"]}):
        hits = client.search(name, vectors[42], k=10, filter=search_filter, consistency="strong")
        assert hits[0].id == 42
        assert len(hits) == 10 and all(hit.payload["lang"] == "en" for hit in hits)
    hits = client.search(name, vectors[43], k=5, filter='lang = "en"', consistency="strong")
    assert 43 not in [hit.id for hit in hits] and all(hit.id % 2 == 0 for hit in hits)
    hits = client.search(name, vectors[43], k=5, filter={"not": {"field": "lang", "op": "=", "value": "en"}}, consistency="strong")
    assert hits[0].id == 43


def test_a_filter_on_a_field_the_schema_does_not_declare(client: quiver.Client, loaded: Loaded) -> None:
    # `n` is in every payload but not in the payload schema: read from the payloads.
    name, vectors, _ = loaded
    hits = client.search(name, vectors[42], k=10, filter="n >= 40 and n < 45", consistency="strong")
    assert sorted(hit.id for hit in hits) == [40, 41, 42, 43, 44] and hits[0].id == 42
    hits = client.search(name, vectors[42], k=10, filter={"field": "n", "op": "=", "value": 7}, consistency="strong")
    assert [hit.id for hit in hits] == [7]
    assert client.search(name, vectors[42], k=10, filter='n = "42"', consistency="strong") == []


def test_search_options(client: quiver.Client, loaded: Loaded) -> None:
    name, vectors, _ = loaded
    hits = client.search(name, vectors[8], k=3, nprobe=64, rescore=4, consistency="eventual", include_payload=False, include_vector=True)
    assert hits[0].id == 8 and hits[0].payload is None
    assert hits[0].vector is not None and len(hits[0].vector) == DIMENSION


def test_search_batch(client: quiver.Client, loaded: Loaded) -> None:
    name, vectors, _ = loaded
    results = client.search_batch(name, [{"vector": vectors[i], "k": 3, "consistency": "strong"} for i in (3, 4, 5)])
    assert [result[0].id for result in results] == [3, 4, 5]


def test_get(client: quiver.Client, loaded: Loaded) -> None:
    name, vectors, payloads = loaded
    points = {point.id: point for point in client.get(name, ids=[10, 11, 987654])}
    assert set(points) == {10, 11}
    assert points[10].payload == payloads[10] and points[10].vector is None
    (with_vector,) = client.get(name, ids=[12], include_vector=True)
    assert with_vector.vector is not None
    # Cosine collections store (and return) vectors at unit length.
    norm = math.sqrt(sum(value * value for value in vectors[12]))
    expected = [value / norm for value in vectors[12]]
    assert all(math.isclose(a, b, rel_tol=1e-2, abs_tol=1e-2) for a, b in zip(with_vector.vector, expected))


def test_delete_then_gone(client: quiver.Client, loaded: Loaded) -> None:
    name, vectors, _ = loaded
    assert client.search(name, vectors[150], k=1, consistency="strong")[0].id == 150
    assert client.delete(name, ids=[150]) > 0
    hits = client.search(name, vectors[150], k=10, consistency="strong")
    assert 150 not in [hit.id for hit in hits]
    assert client.get(name, ids=[150]) == []


def test_bad_inputs(client: quiver.Client, loaded: Loaded, endpoint: str) -> None:
    name = loaded[0]
    with pytest.raises(quiver.InvalidArgument) as caught:
        client.upsert(name, ids=[1000], vectors=[[0.5] * (DIMENSION - 1)])
    assert caught.value.status == 400 and caught.value.message
    with pytest.raises(quiver.InvalidArgument):
        client.search(name, [0.5] * (DIMENSION + 1), k=3)
    with pytest.raises(quiver.InvalidArgument):
        client.upsert(name, ids=[1000], vectors=[[float("nan")] * DIMENSION])
    with pytest.raises(quiver.InvalidArgument):
        client.search(name, [0.5] * DIMENSION, filter="undeclared_field < true")
    with pytest.raises(quiver.InvalidArgument):
        client.search(name, [0.5] * DIMENSION, filter="lang = = ")
    with pytest.raises(quiver.AlreadyExists):
        client.create_collection(name, dimension=DIMENSION)
    # What the SDK refuses locally, the server must refuse too: NaN straight over HTTP.
    body = '{"points": [{"id": 1000, "vector": [NaN' + ", 0.5" * (DIMENSION - 1) + "]}]}"
    response = httpx.post(f"{endpoint}/v1/collections/{name}/points", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "INVALID_ARGUMENT"
    assert client.get(name, ids=[1000]) == []


def test_unknown_collection(client: quiver.Client) -> None:
    missing = f"pysdk_missing_{uuid.uuid4().hex[:8]}"
    for call in (
        lambda: client.describe(missing),
        lambda: client.search(missing, [0.5] * DIMENSION),
        lambda: client.upsert(missing, ids=[1], vectors=[[0.5] * DIMENSION]),
        lambda: client.drop_collection(missing),
    ):
        with pytest.raises(quiver.NotFound) as caught:
            call()
        assert caught.value.status == 404 and caught.value.code == "NOT_FOUND"


def test_drop(client: quiver.Client) -> None:
    name = f"pysdk_drop_{uuid.uuid4().hex[:8]}"
    client.create_collection(name, dimension=4, metric="l2")
    client.upsert(name, ids=[1], vectors=[[1.0, 2.0, 3.0, 4.0]])
    client.drop_collection(name)
    with pytest.raises(quiver.NotFound):
        client.describe(name)
    assert name not in [collection["name"] for collection in client.list_collections()]


async def test_async_client(endpoint: str, loaded: Loaded) -> None:
    name, vectors, _ = loaded
    async with quiver.AsyncClient(endpoint, timeout=30.0) as client:
        results = await asyncio.gather(
            *(client.search(name, vectors[i], k=1, consistency="strong") for i in (20, 21, 22))
        )
    assert [result[0].id for result in results] == [20, 21, 22]


def test_numpy_round_trip(client: quiver.Client) -> None:
    numpy = pytest.importorskip("numpy")
    name = f"pysdk_np_{uuid.uuid4().hex[:8]}"
    client.create_collection(name, dimension=DIMENSION, metric="dot")
    try:
        data = numpy.random.default_rng(11).standard_normal((300, DIMENSION)).astype(numpy.float32)
        client.upsert_batches(name, ids=numpy.arange(300, dtype=numpy.uint64), vectors=data, batch_size=100)
        hits = client.search(name, data[123], k=5, consistency="strong")
        expected = int(numpy.argmax(data @ data[123]))
        assert hits[0].id == expected
        assert hits[0].score == pytest.approx(float(data[expected] @ data[123]), rel=1e-3)
    finally:
        client.drop_collection(name)


def _openssl(*arguments: str) -> None:
    subprocess.run(["openssl", *arguments], check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[str, str]]:
    """``quiver standalone`` serving TLS with a certificate from a test CA made with
    the openssl command; yields (https endpoint, CA bundle path)."""
    if not BINARY:
        pytest.skip("TLS integration tests start their own server (QUIVER_BIN)")
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("the openssl command is not installed")
    directory = tmp_path_factory.mktemp("tls")
    ca_key, ca_pem = directory / "ca.key", directory / "ca.pem"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.pem"
    extensions = directory / "server.ext"
    extensions.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(ca_key), "-out", str(ca_pem), "-days", "2", "-subj", "/CN=quiver test CA")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_pem), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(extensions))
    http_port, grpc_port = _free_port(), _free_port()
    log_path = directory / "quiver.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                BINARY, "standalone", "--data-dir", str(directory / "data"),
                "--http-listen", f"127.0.0.1:{http_port}", "--grpc-listen", f"127.0.0.1:{grpc_port}",
                "--tls-cert", str(cert), "--tls-key", str(key),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"https://localhost:{http_port}"
    try:
        with quiver.Client(url, verify=str(ca_pem)) as probe:
            deadline = time.monotonic() + 60
            while not probe.readyz():
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_text(errors="replace")[-3000:]
                    pytest.fail(f"quiver standalone (TLS) did not become ready (exit {process.poll()}):\n{tail}")
                time.sleep(0.2)
        yield url, str(ca_pem)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_https_with_a_ca_bundle(tls_server: Tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    url, ca_pem = tls_server
    name = f"pysdk_tls_{uuid.uuid4().hex[:8]}"
    with quiver.Client(url, verify=ca_pem) as client:
        client.create_collection(name, dimension=4, metric="l2")
        client.upsert(name, ids=[1, 2], vectors=[[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
        assert client.search(name, [0.0, 0.9, 0.0, 0.0], k=1, consistency="strong")[0].id == 2
    monkeypatch.setenv("QUIVER_CA_CERT", ca_pem)
    with quiver.Client(url) as client:  # the CA bundle from $QUIVER_CA_CERT
        assert name in [collection["name"] for collection in client.list_collections()]
        client.drop_collection(name)


async def test_async_https_with_a_ca_bundle(tls_server: Tuple[str, str]) -> None:
    url, ca_pem = tls_server
    async with quiver.AsyncClient(url, verify=ca_pem) as client:
        assert await client.readyz()
        assert isinstance(await client.list_collections(), list)


def test_an_untrusted_certificate_fails_clearly(tls_server: Tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    url, _ = tls_server
    monkeypatch.delenv("QUIVER_CA_CERT", raising=False)
    with quiver.Client(url) as client:
        with pytest.raises(quiver.Unavailable) as raised:
            client.list_collections()
    assert "certificate" in str(raised.value).lower() and "verify=" in str(raised.value)
    http_url = url.replace("https://", "http://")
    with quiver.Client(http_url, retries=0) as client:
        with pytest.raises(quiver.InvalidArgument, match="https://"):
            client.list_collections()
