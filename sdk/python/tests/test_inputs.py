"""Input handling: numpy arrays and lists, ids, payloads, schemas, and the checks
the client makes before sending anything."""

from __future__ import annotations

import json
import math
import sys

import pytest

import quiver
from quiver import _convert
from fake_gateway import FakeGateway, wire_floats

np = pytest.importorskip("numpy")

pytestmark = pytest.mark.usefixtures("each_encoder")


@pytest.fixture
def vectors16(client: quiver.Client) -> str:
    client.create_collection("v", dimension=16, metric="dot")
    return "v"


def sent_vectors(gateway: FakeGateway) -> list:
    return [wire_floats(point["vector"]) for point in gateway.requests_to("/points")[-1].body["points"]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_numpy_float_arrays_are_sent_exactly(client: quiver.Client, gateway: FakeGateway, vectors16: str, dtype: type) -> None:
    array = np.random.default_rng(1).standard_normal((5, 16)).astype(dtype)
    client.upsert("v", ids=np.arange(5), vectors=array)
    sent = sent_vectors(gateway)
    assert all(type(value) is float for row in sent for value in row)
    # Sent as the float32 values the server stores (float16 and float32 exactly).
    assert np.array_equal(np.asarray(sent, dtype=np.float32), array.astype(np.float32))


def test_numpy_integer_arrays_become_floats(client: quiver.Client, gateway: FakeGateway, vectors16: str) -> None:
    client.upsert("v", ids=[1, 2], vectors=np.arange(32, dtype=np.int32).reshape(2, 16))
    assert sent_vectors(gateway)[1][:3] == [16.0, 17.0, 18.0]


def test_a_list_of_1d_arrays_and_numpy_scalars(client: quiver.Client, gateway: FakeGateway, vectors16: str) -> None:
    rows = [np.ones(16, dtype=np.float32), [np.float32(0.5)] * 16, tuple(range(16))]
    client.upsert("v", ids=[np.uint64(1), np.int64(2), 3], vectors=rows)
    sent = sent_vectors(gateway)
    assert sent[0] == [1.0] * 16 and sent[1] == [0.5] * 16 and sent[2] == list(range(16))
    assert [point["id"] for point in gateway.requests_to("/points")[-1].body["points"]] == [1, 2, 3]


def test_search_takes_a_numpy_vector(client: quiver.Client, gateway: FakeGateway, vectors16: str) -> None:
    data = np.eye(16, dtype=np.float32)
    client.upsert("v", ids=np.arange(16, dtype=np.uint64), vectors=data)
    hits = client.search("v", data[7], k=3)
    assert hits[0].id == 7 and hits[0].score == pytest.approx(1.0)
    assert wire_floats(gateway.requests_to("/search")[-1].body["vector"]) == data[7].tolist()
    with pytest.raises(quiver.InvalidArgument, match="1-D"):
        client.search("v", data[:2])


def test_uint64_ids_keep_full_range(client: quiver.Client, gateway: FakeGateway, vectors16: str) -> None:
    big = (1 << 64) - 1
    client.upsert("v", ids=np.array([big], dtype=np.uint64), vectors=np.ones((1, 16)))
    assert gateway.requests_to("/points")[-1].body["points"][0]["id"] == big
    assert client.get("v", ids=[big])[0].id == big


@pytest.mark.parametrize(
    "ids, vectors, payloads, message",
    [
        ([1, 2], [[0.0] * 16], None, "1 vectors but there are 2 ids"),
        ([1], np.zeros((2, 16)), None, "2 rows but there are 1 ids"),
        ([1, 2], [[0.0] * 16, [0.0] * 15], None, r"vectors\[1\] has 15 values but vectors\[0\] has 16"),
        ([1], [[0.0] * 16], [{}, {}], "payloads has 2 entries"),
        ([1], [[0.0] * 16], ["x"], r"payloads\[0\] must be a dict"),
        ([1], np.zeros(16), None, "2-D array"),
        ([1], np.zeros((1, 2, 8)), None, "2-D array"),
        ([1], np.zeros((1, 0)), None, "zero-length"),
        ([1], np.zeros((1, 16), dtype=complex), None, "real numbers"),
        ([1], np.zeros((1, 16), dtype=bool), None, "real numbers"),
        ([1], [[float("nan")] + [0.0] * 15], None, r"vectors\[0\]\[0\] is nan"),
        ([1, 2], [[0.0] * 16, [0.0] * 15 + [math.inf]], None, r"vectors\[1\]\[15\] is inf"),
        ([1], np.array([[0.0] * 3 + [np.nan] + [0.0] * 12]), None, r"vectors\[0\]\[3\] is nan"),
        ([1], [[0.0] * 15 + ["1"]], None, r"vectors\[0\]\[15\] is '1', not a number"),
        ([1], [[True] * 16], None, "not a number"),
        ([1], [{"a": 1}], None, "must be a list, tuple or 1-D array"),
        ([1], [[]], None, "is empty"),
        ([True], [[0.0] * 16], None, r"ids\[0\] is a bool"),
        ([-1], [[0.0] * 16], None, "outside the unsigned 64-bit range"),
        ([1 << 64], [[0.0] * 16], None, "outside the unsigned 64-bit range"),
        ([1.5], [[0.0] * 16], None, r"ids\[0\] is a float"),
        (["x" * 129], [[0.0] * 16], None, "longer than 128 bytes"),
        ([""], [[0.0] * 16], None, "empty string"),
        ("abc", [[0.0] * 16], None, "sequence of ids"),
        ([], [], None, "nothing to upsert"),
        ([1], [[0.0] * 16], [{"score": float("nan")}], r"payloads\[0\] holds NaN"),
        ([1], [[0.0] * 16], [{"when": object()}], r"payloads\[0\] holds a value JSON cannot encode"),
    ],
)
def test_bad_input_is_refused_before_sending(
    client: quiver.Client, gateway: FakeGateway, vectors16: str, ids: object, vectors: object, payloads: object, message: str
) -> None:
    before = len(gateway.requests)
    with pytest.raises(quiver.InvalidArgument, match=message) as caught:
        client.upsert("v", ids=ids, vectors=vectors, payloads=payloads)
    assert caught.value.status is None
    assert len(gateway.requests) == before


def test_the_server_checks_the_dimension(client: quiver.Client, vectors16: str) -> None:
    with pytest.raises(quiver.InvalidArgument, match="dimension") as caught:
        client.upsert("v", ids=[1], vectors=np.zeros((1, 8), dtype=np.float32))
    assert caught.value.status == 400
    with pytest.raises(quiver.InvalidArgument, match="dimension"):
        client.search("v", [0.0] * 8)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"k": 0}, "k must be a positive integer"),
        ({"k": True}, "k must be a positive integer"),
        ({"consistency": "linearizable"}, "consistency"),
        ({"filter": ["lang", "en"]}, "filter must be a string or a dict"),
    ],
)
def test_bad_search_arguments(client: quiver.Client, gateway: FakeGateway, arguments: dict, message: str) -> None:
    with pytest.raises(quiver.InvalidArgument, match=message):
        client.search("v", [1.0, 2.0], **arguments)
    with pytest.raises(quiver.InvalidArgument, match="vector"):
        client.search("v", [float("nan"), 1.0])
    with pytest.raises(quiver.InvalidArgument, match="sequence of numbers"):
        client.search("v", "1,2")
    assert gateway.requests == []


def test_payload_schema_forms() -> None:
    expected = [{"name": "lang", "type": "keyword"}, {"name": "n", "type": "integer"}]
    assert _convert.payload_schema_list({"lang": "keyword", "n": "integer"}) == expected
    assert _convert.payload_schema_list(expected) == expected
    assert _convert.payload_schema_list([("lang", "keyword"), ("n", "integer")]) == expected
    with pytest.raises(quiver.InvalidArgument, match="expected one of keyword, integer, float, bool"):
        _convert.payload_schema_list({"lang": "text"})
    with pytest.raises(quiver.InvalidArgument, match="needs 'name' and 'type'"):
        _convert.payload_schema_list([{"name": "lang"}])
    with pytest.raises(quiver.InvalidArgument):
        _convert.payload_schema_list("lang:keyword")


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"dimension": 0}, "dimension must be a positive integer"),
        ({"dimension": 4.0}, "dimension must be a positive integer"),
        ({"dimension": 4, "metric": "euclid"}, "metric 'euclid' is not one of cosine, dot, l2"),
    ],
)
def test_bad_collection_parameters(client: quiver.Client, gateway: FakeGateway, arguments: dict, message: str) -> None:
    with pytest.raises(quiver.InvalidArgument, match=message):
        client.create_collection("c", **arguments)
    assert gateway.requests == []


def test_lists_work_without_numpy(client: quiver.Client, gateway: FakeGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "numpy")
    client.create_collection("plain", dimension=3)
    client.upsert("plain", ids=[1, 2], vectors=[[1, 0, 0], (0.0, 1.0, 0.0)])
    assert client.search("plain", (0, 1, 0), k=1)[0].id == 2


def test_vectors_are_written_as_the_base64_of_their_float32_values(each_encoder: str) -> None:
    array = np.full((2, 4), 0.1, dtype=np.float32)
    body = _convert.upsert_body([1, 2], array, [{"t": "é"}, None])
    decoded = json.loads(body)
    # 0.1 as float32 is 0xCDCCCC3D little-endian: "zczMPQ==" once, repeated.
    assert decoded["points"][0]["vector"] == "zczMPc3MzD3NzMw9zczMPQ=="
    assert np.array_equal(np.asarray([wire_floats(p["vector"]) for p in decoded["points"]], dtype=np.float32), array)
    assert decoded["points"][0]["payload"] == {"t": "é"} and "payload" not in decoded["points"][1]
    assert b"0.1" not in body.replace("é".encode(), b"")
    # Lists of Python floats go the same way, rounded to float32 as the server would.
    listed = json.loads(_convert.upsert_body([3], [[0.1, 0.1, 0.1, 0.1]], None))
    assert listed["points"][0]["vector"] == decoded["points"][0]["vector"]
    with pytest.raises(quiver.InvalidArgument, match=r"vectors\[0\]\[1\] = 1e\+39 is outside the range of a 32-bit float"):
        _convert.upsert_body([4], [[0.5, 1e39]], None)
    with pytest.raises(quiver.InvalidArgument, match=r"vectors\[0\]\[0\] = -1e\+39 is outside the range"):
        _convert.upsert_body([4], np.array([[-1e39, 0.5]]), None)


def test_search_vectors_are_written_as_base64(each_encoder: str) -> None:
    vector = np.array([0.1, 0.2, -0.3], dtype=np.float32)
    tree = {"field": "lang", "value": "en"}
    body = _convert.encode_search_json(_convert.search_request(vector, k=5, filter=tree))
    decoded = json.loads(body)
    assert isinstance(decoded["vector"], str)
    assert np.array_equal(np.asarray(wire_floats(decoded["vector"]), dtype=np.float32), vector)
    assert decoded["k"] == 5 and decoded["filter"] == tree
    batch = json.loads(_convert.search_batch_body([{"vector": vector}, {"vector": [1, 2, 3], "k": 2}]))
    assert np.array_equal(np.asarray(wire_floats(batch["searches"][0]["vector"]), dtype=np.float32), vector)
    assert wire_floats(batch["searches"][1]["vector"]) == [1, 2, 3] and batch["searches"][1]["k"] == 2
    with pytest.raises(quiver.InvalidArgument, match=r"vector\[2\] = 1e\+39 is outside the range"):
        _convert.search_request([0.5, 0.5, 1e39])
    # What either encoder refuses, both refuse, naming it.
    with pytest.raises(quiver.InvalidArgument, match="NaN or Infinity"):
        _convert.encode_search_json(
            _convert.search_request(vector, filter={"field": "size", "op": ">", "value": math.nan})
        )
    with pytest.raises(quiver.InvalidArgument, match=r"vector\[0\]\[1\] is nan"):
        _convert.search_request(np.array([0.5, np.nan], dtype=np.float32))


def test_strided_and_fortran_arrays(client: quiver.Client, gateway: FakeGateway, vectors16: str) -> None:
    base = np.arange(64, dtype=np.float32).reshape(2, 32)
    client.upsert("v", ids=[1, 2], vectors=base[:, ::2])
    assert sent_vectors(gateway)[1] == base[1, ::2].tolist()
    client.upsert("v", ids=[3, 4], vectors=np.asfortranarray(base[:, :16]))
    assert sent_vectors(gateway)[0] == base[0, :16].tolist()
    client.upsert("v", ids=[5, 6], vectors=base[:, :16].astype(">f4"))
    assert sent_vectors(gateway)[1] == base[1, :16].tolist()
