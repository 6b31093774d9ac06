"""Turns Python arguments into request bodies and response bodies into results.

Everything here is shared by the sync and async clients and does no I/O. Input
problems the client can see on its own (lengths that disagree, NaN, a bool id)
raise :class:`~quiver.errors.InvalidArgument` before anything is sent, with the
argument and index named; everything else is left to the server, which is the
authority on dimensions, id types and filters.

numpy is optional: it is never imported here. An array can only reach us if the
caller imported numpy, so ``sys.modules`` tells whether to look for one.
"""

from __future__ import annotations

import array
import base64
import json
import math
import operator
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

from .errors import InvalidArgument
from .types import Hit, Point, PointId, SearchResult

_MAX_U64 = (1 << 64) - 1
_MAX_STRING_ID_BYTES = 128
_METRICS = ("cosine", "dot", "l2")
_CONSISTENCY_LEVELS = ("strong", "eventual")
_FIELD_TYPES = ("keyword", "integer", "float", "bool")

#: Vectors: a 2-D numpy array, or a sequence of rows (lists, tuples or 1-D arrays).
Vectors = Any
#: A filter: the string form (``'lang = "en"'``) or the JSON tree form (a dict).
Filter = Union[str, Mapping[str, Any]]
#: A payload schema: ``[{"name": "lang", "type": "keyword"}]`` or ``{"lang": "keyword"}``.
PayloadSchema = Union[Mapping[str, str], Sequence[Mapping[str, str]]]


_orjson: Any
try:  # Optional accelerator for bulk upserts (pip install quiver-client[fast]).
    import orjson as _orjson_module

    # Fragment (orjson >= 3.9.8) lets payloads keep the standard library's rules.
    _orjson = _orjson_module if hasattr(_orjson_module, "Fragment") else None
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


def _numpy() -> Any:
    return sys.modules.get("numpy")


def _is_ndarray(value: Any) -> bool:
    numpy = _numpy()
    return numpy is not None and isinstance(value, numpy.ndarray)


def encode_json(body: Any) -> bytes:
    """Returns the compact JSON bytes of a request body (NaN and Infinity refused)."""
    try:
        return json.dumps(body, allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8"
        )
    except ValueError as error:
        raise InvalidArgument(
            f"the request holds NaN or Infinity, which JSON cannot carry ({error})"
        ) from None
    except TypeError as error:
        raise InvalidArgument(f"the request holds a value JSON cannot encode: {error}") from None


def path_segment(value: str, what: str) -> str:
    """Returns ``value`` escaped as one URL path segment (``/`` included)."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty string, got {value!r}")
    return quote(value, safe="")


# ---------------------------------------------------------------------------- ids


def _point_id(value: Any, where: str) -> PointId:
    if isinstance(value, str):
        if not value:
            raise InvalidArgument(f"{where} is an empty string")
        if len(value.encode("utf-8")) > _MAX_STRING_ID_BYTES:
            raise InvalidArgument(f"{where} is longer than {_MAX_STRING_ID_BYTES} bytes")
        return value
    if isinstance(value, bool):
        raise InvalidArgument(f"{where} is a bool; ids are unsigned integers or strings")
    try:
        integer = operator.index(value)  # int and numpy integers
    except TypeError:
        raise InvalidArgument(
            f"{where} is a {type(value).__name__}; ids are unsigned integers or strings"
        ) from None
    if not 0 <= integer <= _MAX_U64:
        raise InvalidArgument(f"{where} = {integer} is outside the unsigned 64-bit range")
    return integer


def convert_ids(ids: Any, what: str = "ids") -> List[PointId]:
    """Returns the ids as a list of ``int``/``str``, each checked."""
    if isinstance(ids, (str, bytes)):
        raise InvalidArgument(f"{what} must be a sequence of ids, not a single {type(ids).__name__}")
    if _is_ndarray(ids):
        if ids.ndim != 1:
            raise InvalidArgument(f"{what} must be a 1-D array, got shape {ids.shape}")
        ids = ids.tolist()
    try:
        id_list = list(ids)
    except TypeError:
        raise InvalidArgument(f"{what} must be a sequence of ids, got {type(ids).__name__}") from None
    return [_point_id(value, f"{what}[{index}]") for index, value in enumerate(id_list)]


# ------------------------------------------------------------------------ vectors


def _row_from_numbers(row: Sequence[Any], where: str) -> List[float]:
    """The slow path: a row with numpy scalars, bools or junk in it."""
    values: List[float] = []
    for index, value in enumerate(row):
        if isinstance(value, (bool, str, bytes)):
            raise InvalidArgument(f"{where}[{index}] is {value!r}, not a number")
        try:
            values.append(float(value))
        except (TypeError, ValueError):
            raise InvalidArgument(f"{where}[{index}] is {value!r}, not a number") from None
    return values


def _check_finite_row(values: Sequence[float], where: str) -> None:
    for index, value in enumerate(values):
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an int beyond float range
            finite = False
        if not finite:
            raise InvalidArgument(f"{where}[{index}] is {value}; vector values must be finite")


def _check_finite_fast(values: Sequence[float], where: str) -> None:
    # sum() runs in C; it is finite whenever every value is (an overflow of huge
    # finite values only sends us to the exact scan, which then passes).
    try:
        total_is_finite = math.isfinite(sum(values))
    except OverflowError:
        total_is_finite = False
    if not total_is_finite:
        _check_finite_row(values, where)


def convert_vector(vector: Any, where: str = "vector") -> List[float]:
    """Returns one vector as a list of finite floats (from a 1-D array or a sequence)."""
    if _is_ndarray(vector):
        if vector.ndim != 1:
            raise InvalidArgument(f"{where} must be 1-D, got shape {vector.shape}")
        return _ndarray_rows(vector.reshape(1, -1), where)[0]
    if isinstance(vector, (str, bytes, Mapping)) or not hasattr(vector, "__len__"):
        raise InvalidArgument(f"{where} must be a sequence of numbers, got {type(vector).__name__}")
    if len(vector) == 0:
        raise InvalidArgument(f"{where} is empty")
    if all(type(value) is float or type(value) is int for value in vector):
        values = list(vector)
    else:
        values = _row_from_numbers(vector, where)
    _check_finite_fast(values, where)
    return values


def wire_vector(values: Any, where: str) -> str:
    """Returns a checked vector (a list of finite numbers, or a 1-D float array
    checked finite) in its wire form: the base64 of its little-endian 32-bit floats,
    which the server reads as the same floats the JSON numbers would give. Writing
    it takes microseconds; ``json`` spends ~0.4 ms on 768 numbers."""
    if _is_ndarray(values):
        numpy = _numpy()
        with numpy.errstate(over="ignore"):  # beyond ±3.4e38: refused just below
            narrow = numpy.ascontiguousarray(values, dtype="<f4")
        if not numpy.isfinite(narrow).all():
            index = int(numpy.argmin(numpy.isfinite(narrow)))
            raise InvalidArgument(
                f"{where}[{index}] = {values[index]} is outside the range of a 32-bit float (±3.4e38)"
            )
        raw = narrow.tobytes()
    else:
        floats = array.array("f", values)
        if max(floats) == math.inf or min(floats) == -math.inf:
            index = next(i for i, value in enumerate(floats) if math.isinf(value))
            raise InvalidArgument(
                f"{where}[{index}] = {values[index]} is outside the range of a 32-bit float (±3.4e38)"
            )
        if sys.byteorder == "big":  # pragma: no cover - little-endian machines run the tests
            floats.byteswap()
        raw = floats.tobytes()
    return base64.b64encode(raw).decode("ascii")


def _check_finite_array(array: Any, what: str) -> None:
    numpy = _numpy()
    finite_rows = numpy.isfinite(array).all(axis=1)
    if not finite_rows.all():
        row = int(numpy.argmin(finite_rows))
        column = int(numpy.argmin(numpy.isfinite(array[row])))
        raise InvalidArgument(
            f"{what}[{row}][{column}] is {array[row, column]}; vector values must be finite"
        )


def _ndarray_rows(array: Any, what: str) -> List[List[float]]:
    numpy = _numpy()
    if array.dtype.kind not in "fiu":
        raise InvalidArgument(f"{what} must hold real numbers, got dtype {array.dtype}")
    if array.shape[1] == 0:
        raise InvalidArgument(f"{what} has zero-length vectors")
    if array.dtype.kind == "f":
        _check_finite_array(array, what)
    else:
        array = array.astype(numpy.float64)
    rows: List[List[float]] = array.tolist()  # one C loop; float32 widens exactly
    return rows


def convert_vectors(
    vectors: Vectors, count: int, what: str = "vectors", keep_arrays: bool = False
) -> List[Any]:
    """Returns ``count`` vectors as lists of floats, all of one length.

    Accepts a 2-D numpy array (any real dtype) or a sequence of rows, each a list,
    tuple or 1-D array. Non-finite values are refused here, with their position.
    With ``keep_arrays``, the rows of a float32/float64 array stay 1-D arrays (for
    an encoder that writes them directly).
    """
    if _is_ndarray(vectors):
        if vectors.ndim != 2:
            raise InvalidArgument(
                f"{what} must be a 2-D array (one row per id), got shape {vectors.shape}"
            )
        if vectors.shape[0] != count:
            raise InvalidArgument(f"{what} has {vectors.shape[0]} rows but there are {count} ids")
        numpy = _numpy()
        native_float = vectors.dtype in (numpy.dtype(numpy.float32), numpy.dtype(numpy.float64))
        if keep_arrays and native_float and vectors.shape[1] > 0:
            _check_finite_array(vectors, what)
            return list(numpy.ascontiguousarray(vectors))
        return _ndarray_rows(vectors, what)
    if isinstance(vectors, (str, bytes, Mapping)) or not hasattr(vectors, "__len__"):
        raise InvalidArgument(f"{what} must be a 2-D array or a sequence of vectors")
    if len(vectors) != count:
        raise InvalidArgument(f"{what} has {len(vectors)} vectors but there are {count} ids")
    rows: List[List[float]] = []
    dimension: Optional[int] = None
    for index, row in enumerate(vectors):
        where = f"{what}[{index}]"
        if _is_ndarray(row):
            if row.ndim != 1:
                raise InvalidArgument(f"{where} must be 1-D, got shape {row.shape}")
            values = _ndarray_rows(row.reshape(1, -1), where)[0]
        elif isinstance(row, (list, tuple)):
            # Fast path: plain Python numbers pass through untouched.
            if all(type(value) is float or type(value) is int for value in row):
                values = row if isinstance(row, list) else list(row)
            else:
                values = _row_from_numbers(row, where)
            _check_finite_fast(values, where)
        else:
            raise InvalidArgument(
                f"{where} must be a list, tuple or 1-D array, got {type(row).__name__}"
            )
        if dimension is None:
            dimension = len(values)
            if dimension == 0:
                raise InvalidArgument(f"{where} is empty")
        elif len(values) != dimension:
            raise InvalidArgument(
                f"{where} has {len(values)} values but {what}[0] has {dimension}"
            )
        rows.append(values)
    return rows


# ----------------------------------------------------------------------- payloads


def convert_payloads(payloads: Any, count: int) -> Optional[List[Optional[Dict[str, Any]]]]:
    """Returns the payloads as a list of dicts (or ``None`` entries), one per id."""
    if payloads is None:
        return None
    if isinstance(payloads, (str, bytes, Mapping)) or not hasattr(payloads, "__len__"):
        raise InvalidArgument("payloads must be a sequence with one dict (or None) per id")
    if len(payloads) != count:
        raise InvalidArgument(f"payloads has {len(payloads)} entries but there are {count} ids")
    converted: List[Optional[Dict[str, Any]]] = []
    for index, payload in enumerate(payloads):
        if payload is None:
            converted.append(None)
        elif isinstance(payload, Mapping):
            converted.append(dict(payload))
        else:
            raise InvalidArgument(
                f"payloads[{index}] must be a dict or None, got {type(payload).__name__}"
            )
    return converted


def upsert_body(ids: Any, vectors: Vectors, payloads: Any) -> bytes:
    """Returns the encoded body of ``POST …/points``: ``{points: [{id, vector, payload?}]}``.

    With orjson installed, vectors are encoded by it (about 10x faster; float32
    arrays are written in their shortest exact form) and payloads still by the
    standard library, so both encoders accept and refuse the same inputs.
    """
    id_list = convert_ids(ids)
    if not id_list:
        raise InvalidArgument("ids is empty; nothing to upsert")
    fast_encoder = _orjson
    rows = convert_vectors(vectors, len(id_list), keep_arrays=True)
    payload_list = convert_payloads(payloads, len(id_list))
    points: List[Dict[str, Any]] = []
    for index, (point_id, row) in enumerate(zip(id_list, rows)):
        point: Dict[str, Any] = {"id": point_id, "vector": wire_vector(row, f"vectors[{index}]")}
        payload = None if payload_list is None else payload_list[index]
        if payload is not None:
            point["payload"] = (
                payload
                if fast_encoder is None
                else fast_encoder.Fragment(_encode_payload(payload, index))
            )
        points.append(point)
    if fast_encoder is not None:
        encoded: bytes = fast_encoder.dumps({"points": points})
        return encoded
    try:
        return json.dumps(
            {"points": points}, allow_nan=False, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")
    except (ValueError, TypeError):
        # Vectors were checked already, so a payload is at fault: name it.
        for index, payload in enumerate(payload_list or []):
            if payload is not None:
                _encode_payload(payload, index)
        raise


def _encode_payload(payload: Dict[str, Any], index: int) -> bytes:
    try:
        return json.dumps(
            payload, allow_nan=False, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")
    except ValueError:
        raise InvalidArgument(
            f"payloads[{index}] holds NaN or Infinity, which JSON cannot carry"
        ) from None
    except TypeError as error:
        raise InvalidArgument(
            f"payloads[{index}] holds a value JSON cannot encode: {error}"
        ) from None


# -------------------------------------------------------------------- collections


def payload_schema_list(schema: PayloadSchema) -> List[Dict[str, str]]:
    """Returns a payload schema in wire form: ``[{"name": ..., "type": ...}]``.

    Accepts that form, a dict ``{field: type}``, or ``(name, type)`` pairs.
    """
    if isinstance(schema, Mapping):
        entries: List[Tuple[Any, Any]] = list(schema.items())
    elif isinstance(schema, (str, bytes)):
        raise InvalidArgument("payload_schema must be a dict {field: type} or a list of fields")
    else:
        entries = []
        for index, field in enumerate(schema):
            if isinstance(field, Mapping):
                if "name" not in field or "type" not in field:
                    raise InvalidArgument(f"payload_schema[{index}] needs 'name' and 'type'")
                entries.append((field["name"], field["type"]))
            elif isinstance(field, (tuple, list)) and len(field) == 2:
                entries.append((field[0], field[1]))
            else:
                raise InvalidArgument(
                    f"payload_schema[{index}] must be {{'name': ..., 'type': ...}} or (name, type)"
                )
    converted: List[Dict[str, str]] = []
    for name, field_type in entries:
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"payload_schema field name {name!r} must be a non-empty string")
        if field_type not in _FIELD_TYPES:
            raise InvalidArgument(
                f"payload_schema field {name!r} has type {field_type!r}; "
                f"expected one of {', '.join(_FIELD_TYPES)}"
            )
        converted.append({"name": name, "type": field_type})
    return converted


def create_collection_body(
    dimension: int,
    metric: str,
    id_type: Optional[str],
    shards: Optional[int],
    replication: Optional[int],
    index: Optional[Mapping[str, Any]],
    payload_schema: Optional[PayloadSchema],
) -> bytes:
    """Returns the encoded body of ``PUT /v1/collections/{name}``."""
    if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension <= 0:
        raise InvalidArgument(f"dimension must be a positive integer, got {dimension!r}")
    if metric not in _METRICS:
        raise InvalidArgument(f"metric {metric!r} is not one of {', '.join(_METRICS)}")
    body: Dict[str, Any] = {"dimension": dimension, "metric": metric}
    if id_type is not None:
        body["id_type"] = id_type
    if shards is not None:
        body["shards"] = shards
    if replication is not None:
        body["replication"] = replication
    if index is not None:
        body["index"] = dict(index)
    if payload_schema is not None:
        body["payload_schema"] = payload_schema_list(payload_schema)
    return encode_json(body)


class MalformedResponse(ValueError):
    """A 2xx answer whose JSON does not have the contract's shape."""


def _object(response: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(response, Mapping):
        raise MalformedResponse(f"{what}: expected a JSON object, got {type(response).__name__}")
    return response


def _list_field(response: Any, key: str, what: str) -> List[Any]:
    value = _object(response, what).get(key)
    if not isinstance(value, list):
        raise MalformedResponse(f"{what}: expected a list in {key!r}, got {type(value).__name__}")
    return value


def collections_list(response: Any) -> List[Dict[str, Any]]:
    """Returns the collections of ``GET /v1/collections`` as dicts (each has ``name``).

    Accepts ``{"collections": [...]}`` or a bare list, of objects or of names.
    """
    items = response if isinstance(response, list) else _list_field(response, "collections", "list")
    collections: List[Dict[str, Any]] = []
    for item in items:
        if isinstance(item, str):
            collections.append({"name": item})
        elif isinstance(item, Mapping) and isinstance(item.get("name"), str):
            collections.append(dict(item))
        else:
            raise MalformedResponse(f"list: a collection without a name: {item!r}")
    return collections


# ------------------------------------------------------------------------- search


def search_request(
    vector: Any,
    k: int = 10,
    filter: Optional[Filter] = None,
    nprobe: Optional[int] = None,
    rescore: Optional[int] = None,
    consistency: Optional[str] = None,
    include_payload: bool = True,
    include_vector: bool = False,
    where: str = "vector",
) -> Dict[str, Any]:
    """Returns one search in wire form (a dict, not yet encoded)."""
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise InvalidArgument(f"k must be a positive integer, got {k!r}")
    request: Dict[str, Any] = {
        "vector": wire_vector(_checked_vector(vector, where), where),
        "k": k,
    }
    if filter is not None:
        if not isinstance(filter, (str, Mapping)):
            raise InvalidArgument(
                f"filter must be a string or a dict (JSON filter tree), got {type(filter).__name__}"
            )
        if isinstance(filter, str):
            request["filter"] = filter
        elif _orjson is not None:
            # Encoded by the standard library's rules (NaN refused), as without orjson.
            request["filter"] = _orjson.Fragment(encode_json(dict(filter)))
        else:
            request["filter"] = dict(filter)
    if nprobe is not None:
        request["nprobe"] = nprobe
    if rescore is not None:
        request["rescore"] = rescore
    if consistency is not None:
        if consistency not in _CONSISTENCY_LEVELS:
            raise InvalidArgument(
                f"consistency {consistency!r} is not one of {', '.join(_CONSISTENCY_LEVELS)}"
            )
        request["consistency"] = consistency
    request["include_payload"] = bool(include_payload)
    request["include_vector"] = bool(include_vector)
    return request


_SEARCH_KEYS = frozenset(
    ("vector", "k", "filter", "nprobe", "rescore", "consistency", "include_payload", "include_vector")
)


def _checked_vector(vector: Any, where: str) -> Any:
    """A query vector checked as :func:`convert_vector` checks it; a 1-D float32 or
    float64 array stays an array (checked finite), for :func:`wire_vector`."""
    numpy = _numpy()
    if (
        _is_ndarray(vector)
        and vector.ndim == 1
        and vector.shape[0] > 0
        and vector.dtype in (numpy.dtype(numpy.float32), numpy.dtype(numpy.float64))
    ):
        _check_finite_array(vector.reshape(1, -1), where)
        return vector
    return convert_vector(vector, where)


def encode_search_json(body: Any) -> bytes:
    """Returns the JSON bytes of a search or batch search body: by orjson when it is
    installed (every vector and filter tree in it already checked and encoded), else
    as :func:`encode_json`."""
    if _orjson is None:
        return encode_json(body)
    try:
        encoded: bytes = _orjson.dumps(body)
    except TypeError as error:
        raise InvalidArgument(f"the request holds a value JSON cannot encode: {error}") from None
    return encoded


def search_batch_body(searches: Sequence[Mapping[str, Any]]) -> bytes:
    """Returns the encoded body of ``POST …/search/batch``: ``{searches: [...]}``."""
    if isinstance(searches, (str, bytes, Mapping)) or not hasattr(searches, "__len__"):
        raise InvalidArgument("searches must be a sequence of dicts, one per search")
    requests = []
    for index, search in enumerate(searches):
        if not isinstance(search, Mapping):
            raise InvalidArgument(f"searches[{index}] must be a dict, got {type(search).__name__}")
        unknown = set(search) - _SEARCH_KEYS
        if unknown:
            raise InvalidArgument(
                f"searches[{index}] has unknown keys {sorted(unknown)}; "
                f"known: {sorted(_SEARCH_KEYS)}"
            )
        if "vector" not in search:
            raise InvalidArgument(f"searches[{index}] has no 'vector'")
        arguments = dict(search)
        requests.append(search_request(where=f"searches[{index}].vector", **arguments))
    return encode_search_json({"searches": requests})


def _hit(item: Any) -> Hit:
    if not isinstance(item, Mapping) or "id" not in item or "score" not in item:
        raise MalformedResponse(f"search: a hit without id and score: {item!r}")
    return Hit(
        id=item["id"],
        score=float(item["score"]),
        payload=item.get("payload"),
        vector=item.get("vector"),
    )


def search_result(response: Any) -> SearchResult:
    """Returns the hits of one search response ``{hits, took_ms}``."""
    hits = [_hit(item) for item in _list_field(response, "hits", "search")]
    took_ms = response.get("took_ms")
    return SearchResult(hits, took_ms=float(took_ms) if isinstance(took_ms, (int, float)) else None)


def search_batch_results(response: Any) -> List[SearchResult]:
    """Returns one hit list per search of a batch response ``{results: [...]}``."""
    return [search_result(result) for result in _list_field(response, "results", "search batch")]


def points_list(response: Any) -> List[Point]:
    """Returns the points of ``POST …/points/get``: ``{points: [{id, payload?, vector?}]}``."""
    points = []
    for item in _list_field(response, "points", "get"):
        if not isinstance(item, Mapping) or "id" not in item:
            raise MalformedResponse(f"get: a point without an id: {item!r}")
        points.append(Point(id=item["id"], payload=item.get("payload"), vector=item.get("vector")))
    return points


def sequence_of(response: Any) -> int:
    """Returns the ``sequence`` of a write acknowledgement ``{sequence}``."""
    sequence = _object(response, "write").get("sequence")
    if isinstance(sequence, bool) or not isinstance(sequence, int):
        raise MalformedResponse(f"write: expected an integer 'sequence', got {sequence!r}")
    return sequence


def as_dict(response: Any) -> Dict[str, Any]:
    """Returns a JSON object response as a dict ({} for an empty body)."""
    if response is None:
        return {}
    return dict(_object(response, "response"))
