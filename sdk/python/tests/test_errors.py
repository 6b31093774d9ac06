"""Error mapping, retries, backoff and timeouts (sync client; the async one shares the logic)."""

from __future__ import annotations

import email.utils
import time

import pytest

import quiver
from quiver import _core
from quiver.errors import error_from_code
from fake_gateway import FakeGateway

CODES = [
    ("INVALID_ARGUMENT", quiver.InvalidArgument, 400),
    ("NOT_FOUND", quiver.NotFound, 404),
    ("ALREADY_EXISTS", quiver.AlreadyExists, 409),
    ("FAILED_PRECONDITION", quiver.FailedPrecondition, 412),
    ("RESOURCE_EXHAUSTED", quiver.ResourceExhausted, 429),
    ("UNAUTHENTICATED", quiver.Unauthenticated, 401),
    ("PERMISSION_DENIED", quiver.PermissionDenied, 403),
    ("UNAVAILABLE", quiver.Unavailable, 503),
    ("DEADLINE_EXCEEDED", quiver.DeadlineExceeded, 504),
    ("INTERNAL", quiver.Internal, 500),
    ("DATA_LOSS", quiver.DataLossError, 500),
]


def error_body(code: str, message: str = "it went wrong") -> dict:
    return {"error": {"code": code, "message": message}}


@pytest.mark.parametrize("code, error_class, status", CODES)
def test_every_code_maps_to_its_exception(gateway: FakeGateway, code: str, error_class: type, status: int) -> None:
    gateway.fail_next(status, error_body(code, f"{code.lower()} happened"), times=10)
    with quiver.Client(gateway.endpoint, retries=0) as client:
        with pytest.raises(error_class) as caught:
            client.describe("docs")
    error = caught.value
    assert type(error) is error_class and isinstance(error, quiver.QuiverError)
    assert error.code == code and error.status == status
    assert error.message == f"{code.lower()} happened"
    assert error.request_id == gateway.requests[-1].headers["x-request-id"]
    assert code in str(error) and error.request_id in str(error)


def test_an_unknown_code_raises_the_base_class(client: quiver.Client, gateway: FakeGateway) -> None:
    gateway.fail_next(409, {"error": {"code": "ABORTED", "message": "conflict", "retry_in": 3}})
    with pytest.raises(quiver.QuiverError) as caught:
        client.list_collections()
    assert type(caught.value) is quiver.QuiverError
    assert caught.value.code == "ABORTED" and caught.value.status == 409
    assert caught.value.details["retry_in"] == 3
    assert len(gateway.requests) == 1


def test_data_loss_has_its_own_class_and_is_not_retried(gateway: FakeGateway) -> None:
    gateway.fail_next(500, error_body("DATA_LOSS", "segment s1: checksum mismatch"), times=10)
    with quiver.Client(gateway.endpoint) as client:
        with pytest.raises(quiver.DataLossError) as caught:
            client.describe("docs")
    assert quiver.DataLossError is quiver.DataLoss
    assert caught.value.code == "DATA_LOSS" and caught.value.status == 500
    assert len(gateway.requests) == 1


def test_error_from_code_without_a_response() -> None:
    error = error_from_code("NOT_FOUND", "gone")
    assert isinstance(error, quiver.NotFound) and error.status is None
    assert str(error) == "NOT_FOUND: gone"
    assert "NotFound(code='NOT_FOUND'" in repr(error)


def test_a_non_json_error_body_is_unavailable(gateway: FakeGateway) -> None:
    gateway.fail_next(404, b"<html><body>404 page not found</body></html>", headers={"content-type": "text/html"})
    with quiver.Client(gateway.endpoint, retries=3) as client:
        with pytest.raises(quiver.Unavailable) as caught:
            client.list_collections()
    message = caught.value.message
    assert "HTTP 404" in message and "page not found" in message and "Quiver gateway" in message
    assert caught.value.status == 404
    assert len(gateway.requests) == 1  # a foreign 404 is not retried


def test_a_json_body_without_the_error_shape_is_unavailable(client: quiver.Client, gateway: FakeGateway) -> None:
    gateway.fail_next(400, {"detail": "bad"})
    with pytest.raises(quiver.Unavailable, match="without a Quiver error body"):
        client.list_collections()


def test_a_non_json_success_body_is_unavailable(client: quiver.Client, gateway: FakeGateway) -> None:
    gateway.fail_next(200, b"hello", headers={"content-type": "text/plain"})
    with pytest.raises(quiver.Unavailable, match="not JSON"):
        client.list_collections()


def test_a_refused_connection_is_unavailable(closed_port: int) -> None:
    with quiver.Client(f"http://127.0.0.1:{closed_port}", retries=2, backoff_base=0.01) as client:
        started = time.monotonic()
        with pytest.raises(quiver.Unavailable) as caught:
            client.list_collections()
    assert "cannot connect" in caught.value.message
    assert caught.value.status is None and caught.value.request_id
    assert caught.value.__cause__ is not None
    assert time.monotonic() - started < 2.0


def test_503_is_retried_honouring_retry_after(client: quiver.Client, gateway: FakeGateway) -> None:
    gateway.fail_next(503, error_body("UNAVAILABLE", "no ready searcher"), times=2, headers={"retry-after": "0.3"})
    started = time.monotonic()
    assert client.list_collections() == []
    elapsed = time.monotonic() - started
    assert elapsed >= 0.6  # two waits of Retry-After, not the 10 ms backoff
    assert len(gateway.requests) == 3
    assert len({request.headers["x-request-id"] for request in gateway.requests}) == 1


def test_retry_after_ms_is_preferred_to_the_rounded_retry_after(client: quiver.Client, gateway: FakeGateway) -> None:
    # A searcher overload hint of 200 ms: Retry-After says 1 s (rounded up).
    gateway.fail_next(
        429,
        error_body("RESOURCE_EXHAUSTED", "searcher overloaded"),
        times=1,
        headers={"retry-after-ms": "200", "retry-after": "1"},
    )
    started = time.monotonic()
    assert client.list_collections() == []
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed < 0.9
    assert _core.parse_retry_after_ms("1500") == 1.5
    assert _core.parse_retry_after_ms("soon") is None


def test_resource_exhausted_is_retried(client: quiver.Client, gateway: FakeGateway) -> None:
    client.create_collection("docs", dimension=2)
    gateway.fail_next(429, error_body("RESOURCE_EXHAUSTED", "write backlog"), times=1, path_contains="/points")
    assert client.upsert("docs", ids=[1], vectors=[[1, 2]]) > 0
    assert len(gateway.requests_to("/points")) == 2
    assert client.describe("docs")["points"] == 1


def test_proxy_gateway_errors_are_retried(client: quiver.Client, gateway: FakeGateway) -> None:
    gateway.fail_next(502, b"Bad Gateway", times=1)
    gateway.fail_next(504, b"", times=1)
    assert client.list_collections() == []
    assert len(gateway.requests) == 3


def test_retries_give_up_after_the_budget(gateway: FakeGateway) -> None:
    gateway.fail_next(503, error_body("UNAVAILABLE", "still down"), times=100)
    with quiver.Client(gateway.endpoint, retries=2, backoff_base=0.01) as client:
        with pytest.raises(quiver.Unavailable, match="still down"):
            client.list_collections()
    assert len(gateway.requests) == 3


@pytest.mark.parametrize("code, status", [("INVALID_ARGUMENT", 400), ("NOT_FOUND", 404), ("INTERNAL", 500), ("FAILED_PRECONDITION", 412)])
def test_other_errors_are_not_retried(client: quiver.Client, gateway: FakeGateway, code: str, status: int) -> None:
    gateway.fail_next(status, error_body(code), times=10)
    with pytest.raises(quiver.QuiverError):
        client.list_collections()
    assert len(gateway.requests) == 1


def test_a_dropped_connection_retries_idempotent_calls_only(client: quiver.Client, gateway: FakeGateway) -> None:
    client.create_collection("docs", dimension=2)
    gateway.fail_next(0, b"", close_connection=True, path_contains="/points")
    assert client.upsert("docs", ids=[1], vectors=[[1, 2]]) > 0  # idempotent by id
    assert len(gateway.requests_to("/points")) == 2

    gateway.fail_next(0, b"", close_connection=True, path_contains="/v1/collections/second")
    with pytest.raises(quiver.Unavailable):
        client.create_collection("second", dimension=2)
    assert len(gateway.requests_to("/v1/collections/second")) == 1


def test_a_timeout_is_deadline_exceeded_and_not_retried(gateway: FakeGateway) -> None:
    gateway.delay_seconds = 0.5
    with quiver.Client(gateway.endpoint, timeout=0.1, retries=3) as client:
        with pytest.raises(quiver.DeadlineExceeded, match="timed out"):
            client.list_collections()
    assert len(gateway.requests) == 1


def test_parse_retry_after() -> None:
    assert _core.parse_retry_after(None) is None
    assert _core.parse_retry_after("") is None
    assert _core.parse_retry_after("2") == 2.0
    assert _core.parse_retry_after("0.25") == 0.25
    assert _core.parse_retry_after("-3") == 0.0
    assert _core.parse_retry_after("soon") is None
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= (_core.parse_retry_after(future) or 0) <= 31
    past = email.utils.formatdate(time.time() - 30, usegmt=True)
    assert _core.parse_retry_after(past) == 0.0


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    settings = _core.ClientSettings.build("http://x", None, 1.0, 5, 0.1, 1.0, 10.0, None)
    for attempt in range(8):
        ceiling = min(1.0, 0.1 * 2**attempt)
        delays = [_core.backoff_seconds(settings, attempt, None) for _ in range(50)]
        assert all(ceiling / 2 <= delay <= ceiling for delay in delays)
        assert len(set(delays)) > 1

def test_a_server_hint_is_waited_with_a_quarter_of_jitter_on_top() -> None:
    settings = _core.ClientSettings.build("http://x", None, 1.0, 5, 0.1, 1.0, 10.0, None)
    hinted = [_core.backoff_seconds(settings, 0, 3.0) for _ in range(50)]
    assert all(3.0 <= delay <= 3.75 for delay in hinted)
    assert len(set(hinted)) > 1, "clients turned away together come back spread"
    capped = [_core.backoff_seconds(settings, 0, 300.0) for _ in range(50)]
    assert all(10.0 <= delay <= 12.5 for delay in capped)  # max_retry_after caps the hint


@pytest.mark.parametrize(
    "call, answer",
    [
        (lambda c: c.search("docs", [1.0]), {"results": []}),
        (lambda c: c.search("docs", [1.0]), {"hits": [{"id": 1}]}),
        (lambda c: c.search_batch("docs", [{"vector": [1.0]}]), {"hits": []}),
        (lambda c: c.upsert("docs", ids=[1], vectors=[[1.0]]), {}),
        (lambda c: c.get("docs", ids=[1]), {"points": [{"payload": {}}]}),
        (lambda c: c.list_collections(), {"names": ["a"]}),
        (lambda c: c.describe("docs"), [1, 2]),
    ],
)
def test_a_malformed_answer_is_internal(client: quiver.Client, gateway: FakeGateway, call: object, answer: object) -> None:
    gateway.fail_next(200, answer)
    with pytest.raises(quiver.Internal, match="unexpected shape") as caught:
        call(client)  # type: ignore[operator]
    assert caught.value.status == 200
    assert caught.value.request_id == gateway.requests[-1].headers["x-request-id"]


def test_list_collections_accepts_a_bare_list_of_names(client: quiver.Client, gateway: FakeGateway) -> None:
    gateway.fail_next(200, ["a", {"name": "b", "points": 3}])
    assert client.list_collections() == [{"name": "a"}, {"name": "b", "points": 3}]


def test_errors_survive_pickling() -> None:
    import pickle

    for error in (
        quiver.NotFound("gone", status=404, request_id="abc"),
        error_from_code("ABORTED", "conflict", status=409, details={"code": "ABORTED", "x": 1}),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert (copy.code, copy.message, copy.status, copy.request_id, copy.details) == (
            error.code, error.message, error.status, error.request_id, error.details,
        )
