"""Every operation of docs/openapi.json sent to a real `quiver standalone`
(QUIVER_BIN): the status must be one the document lists for the operation, and
the body must validate against the schema it gives for that status. An
operation the document gains without a request here fails the test, so the
document and the server cannot drift apart unseen."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

import httpx
import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

DOCUMENT_PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
DOCUMENT: Dict[str, Any] = json.loads(DOCUMENT_PATH.read_text())
NAME = "openapi_contract"
DIM = 4


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    binary = os.environ["QUIVER_BIN"]
    data_dir = tempfile.mkdtemp(prefix="quiver-openapi-")
    http_port, grpc_port = _free_port(), _free_port()
    log_path = Path(data_dir) / "quiver.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [binary, "standalone", "--data-dir", str(Path(data_dir) / "data"),
             "--http-listen", f"127.0.0.1:{http_port}", "--grpc-listen", f"127.0.0.1:{grpc_port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"standalone not ready:\n{log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# One request per documented operation, in an order that makes sense on one
# server: (method, path template, path values, JSON body or None). Destructive
# admin operations are sent so that they are refused (an unknown node, an
# unknown metadata member): their error answers are documented responses too.
REQUESTS = [
    ("put", "/v1/collections/{name}", {"name": NAME},
     {"dimension": DIM, "metric": "cosine", "payload_schema": {"lang": "keyword"}}),
    ("get", "/v1/collections", {}, None),
    ("get", "/v1/collections/{name}", {"name": NAME}, None),
    ("post", "/v1/collections/{name}/points", {"name": NAME},
     {"points": [{"id": i, "vector": [1.0, float(i), 0.5, -1.0], "payload": {"lang": "en"}}
                 for i in range(1, 6)]}),
    ("post", "/v1/collections/{name}/points/get", {"name": NAME}, {"ids": [1, 2, 99]}),
    ("post", "/v1/collections/{name}/search", {"name": NAME},
     {"vector": [1.0, 2.0, 0.5, -1.0], "k": 3, "filter": "lang = \"en\"", "include_vector": True}),
    ("post", "/v1/collections/{name}/search/batch", {"name": NAME},
     {"searches": [{"vector": [1.0, 2.0, 0.5, -1.0], "k": 2}, {"vector": [0.0, 1.0, 0.0, 0.0]}]}),
    ("post", "/v1/collections/{name}/points/delete", {"name": NAME}, {"ids": [5]}),
    ("get", "/admin/v1/cluster", {}, None),
    ("get", "/admin/v1/collections/{name}/shards", {"name": NAME}, None),
    ("post", "/admin/v1/collections/{name}/compact", {"name": NAME}, None),
    ("get", "/admin/v1/orphans", {}, None),
    ("post", "/admin/v1/nodes/{id}/drain", {"id": "no-such-node"}, None),
    ("post", "/admin/v1/meta/members", {}, {"action": "promote", "id": 987654}),
    ("delete", "/v1/collections/{name}", {"name": NAME}, None),
]

# A request that must be refused, per operation kind: a bad body is answered
# with a documented 4XX and an error body.
BAD_REQUESTS = [
    ("put", "/v1/collections/{name}", {"name": "bad_one"}, {"dimension": 0, "metric": "cosine"}),
    ("post", "/v1/collections/{name}/search", {"name": "missing_collection"}, {"vector": [1.0]}),
]


def _registry() -> Registry:
    return Registry().with_resource("urn:openapi", Resource(contents=DOCUMENT, specification=DRAFT202012))


def _response_spec(operation: Dict[str, Any], status: int) -> Optional[Dict[str, Any]]:
    responses = operation["responses"]
    return responses.get(str(status)) or responses.get(f"{str(status)[0]}XX") or responses.get("default")


def _check(method: str, template: str, values: Dict[str, str], response: httpx.Response) -> Tuple[int, str]:
    operation = DOCUMENT["paths"][template][method]
    spec = _response_spec(operation, response.status_code)
    assert spec is not None, (
        f"{method.upper()} {template} answered {response.status_code}, which the document does not list: "
        f"{response.text[:500]}"
    )
    schema = spec["content"]["application/json"]["schema"]
    # Resolve the component references against the whole document.
    wrapped = {"$ref": "urn:openapi#" + schema["$ref"][1:]} if "$ref" in schema else schema
    validator = jsonschema.Draft202012Validator(wrapped, registry=_registry())
    errors = sorted(validator.iter_errors(response.json()), key=lambda error: error.path)
    assert not errors, (
        f"{method.upper()} {template} → {response.status_code}: the body does not match the document: "
        f"{errors[0].message} at {list(errors[0].path)}\nbody: {response.text[:800]}"
    )
    return response.status_code, operation.get("operationId", "")


def _send(server: str, method: str, template: str, values: Dict[str, str], body: Any) -> httpx.Response:
    path = template.format(**values)
    return httpx.request(method.upper(), server + path, json=body, timeout=60)


def test_the_document_is_openapi_3_1_with_every_operation_answered(server: str) -> None:
    assert DOCUMENT["openapi"].startswith("3.1")
    documented = {(method, path) for path, item in DOCUMENT["paths"].items() for method in item
                  if method in {"get", "put", "post", "delete", "patch"}}
    sent = {(method, path) for method, path, _, _ in REQUESTS}
    assert documented == sent, (
        f"documented but not sent: {sorted(documented - sent)}; sent but not documented: {sorted(sent - documented)}"
    )
    statuses = {}
    for method, template, values, body in REQUESTS:
        response = _send(server, method, template, values, body)
        statuses[(method, template)] = _check(method, template, values, response)[0]
    # The operations that must succeed on a fresh standalone did.
    for key in [("put", "/v1/collections/{name}"), ("post", "/v1/collections/{name}/points"),
                ("post", "/v1/collections/{name}/search"), ("post", "/v1/collections/{name}/search/batch"),
                ("get", "/admin/v1/cluster"), ("delete", "/v1/collections/{name}")]:
        assert 200 <= statuses[key] < 300, f"{key}: {statuses[key]}"
    # The refused admin requests were refused, not performed.
    assert statuses[("post", "/admin/v1/nodes/{id}/drain")] >= 400
    assert statuses[("post", "/admin/v1/meta/members")] >= 400


def test_refused_requests_answer_a_documented_error(server: str) -> None:
    for method, template, values, body in BAD_REQUESTS:
        response = _send(server, method, template, values, body)
        assert 400 <= response.status_code < 500, response.text
        _check(method, template, values, response)


def test_the_server_serves_the_committed_document(server: str) -> None:
    served = httpx.get(f"{server}/openapi.json", timeout=10)
    assert served.status_code == 200
    assert served.headers["content-type"].startswith("application/json")
    assert served.json() == DOCUMENT
