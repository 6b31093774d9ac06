"""An in-memory Quiver gateway speaking the REST contract of docs/api.md.

It runs a real HTTP/1.1 server (``http.server``, keep-alive) on a loopback port in a
thread, so the clients are tested over real sockets: request shapes, headers,
connection reuse, response parsing and error mapping. Search is brute force; filters
take both the string and the JSON forms. Tests can script failures
(:meth:`FakeGateway.fail_next`) and read every request back (:attr:`requests`).
"""

from __future__ import annotations

import array
import base64
import binascii
import json
import math
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import unquote, urlsplit

STATUS_OF_CODE = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "FAILED_PRECONDITION": 412,
    "RESOURCE_EXHAUSTED": 429,
    "INTERNAL": 500,
    "DATA_LOSS": 500,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
FIELD_TYPES = ("keyword", "integer", "float", "bool")
MAX_U64 = (1 << 64) - 1



def wire_floats(vector: Any) -> Any:
    """A vector as the server reads it: the base64 of little-endian 32-bit floats
    decoded to a list of floats; any other value as it is."""
    if not isinstance(vector, str):
        return vector
    try:
        raw = base64.b64decode(vector, validate=True)
    except binascii.Error as error:
        raise ValueError(f"not standard base64: {error}") from None
    if not raw or len(raw) % 4:
        raise ValueError(f"a base64 vector must hold whole 32-bit floats, got {len(raw)} bytes")
    floats = array.array("f")
    floats.frombytes(raw)
    return floats.tolist()

class ApiError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Recorded:
    """One request the fake received."""

    method: str
    path: str  # raw, still percent-encoded
    headers: Dict[str, str]
    body: Any
    client_port: int


@dataclass
class ScriptedFailure:
    status: int
    body: bytes
    headers: Dict[str, str]
    remaining: int
    path_contains: Optional[str]
    close_connection: bool = False


@dataclass
class Collection:
    name: str
    dimension: int
    metric: str
    id_type: str
    shards: int
    replication: int
    index: Dict[str, Any]
    payload_schema: List[Dict[str, str]]
    points: Dict[Any, Tuple[List[float], Optional[Dict[str, Any]]]] = field(default_factory=dict)

    def describe(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "dimension": self.dimension,
            "metric": self.metric,
            "id_type": self.id_type,
            "shards": self.shards,
            "replication": self.replication,
            "index": self.index,
            "payload_schema": self.payload_schema,
            "points": len(self.points),
            "segments": 0,
            "wal_tail_rows": len(self.points),
            "bytes": sum(4 * len(vector) for vector, _ in self.points.values()),
        }


# ------------------------------------------------------------------ filters


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:[^"\\]|\\.)*")
      | (?P<number>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
      | (?P<op><=|>=|!=|=|<|>)
      | (?P<punct>[()\[\],])
      | (?P<word>[A-Za-z_][A-Za-z0-9_.]*)
    )""",
    re.VERBOSE,
)


def _tokenize(text: str) -> List[Tuple[str, Any]]:
    tokens: List[Tuple[str, Any]] = []
    position = 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if not match:
            raise ApiError("INVALID_ARGUMENT", f"filter: cannot parse at offset {position}")
        position = match.end()
        kind = match.lastgroup
        value: Any = match.group(kind)
        if kind == "string":
            value = json.loads(value)
        elif kind == "number":
            value = float(value) if any(c in value for c in ".eE") else int(value)
        tokens.append((kind, value))
    return tokens


class _FilterParser:
    """Recursive descent over the string form; produces the JSON form."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.position = 0

    def peek(self) -> Optional[Tuple[str, Any]]:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> Tuple[str, Any]:
        token = self.peek()
        if token is None:
            raise ApiError("INVALID_ARGUMENT", "filter: unexpected end")
        self.position += 1
        return token

    def is_word(self, word: str) -> bool:
        token = self.peek()
        return token is not None and token[0] == "word" and token[1].lower() == word

    def parse(self) -> Dict[str, Any]:
        tree = self.parse_or()
        if self.peek() is not None:
            raise ApiError("INVALID_ARGUMENT", f"filter: unexpected {self.peek()[1]!r}")
        return tree

    def parse_or(self) -> Dict[str, Any]:
        items = [self.parse_and()]
        while self.is_word("or"):
            self.take()
            items.append(self.parse_and())
        return items[0] if len(items) == 1 else {"or": items}

    def parse_and(self) -> Dict[str, Any]:
        items = [self.parse_unary()]
        while self.is_word("and"):
            self.take()
            items.append(self.parse_unary())
        return items[0] if len(items) == 1 else {"and": items}

    def parse_unary(self) -> Dict[str, Any]:
        if self.is_word("not"):
            self.take()
            return {"not": self.parse_unary()}
        if self.peek() == ("punct", "("):
            self.take()
            inner = self.parse_or()
            if self.take() != ("punct", ")"):
                raise ApiError("INVALID_ARGUMENT", "filter: missing )")
            return inner
        kind, name = self.take()
        if kind != "word":
            raise ApiError("INVALID_ARGUMENT", f"filter: expected a field, got {name!r}")
        if self.is_word("in"):
            self.take()
            return {"field": name, "in": self.parse_list()}
        if self.is_word("not"):
            self.take()
            if not self.is_word("in"):
                raise ApiError("INVALID_ARGUMENT", "filter: expected 'in' after 'not'")
            self.take()
            return {"field": name, "not_in": self.parse_list()}
        kind, op = self.take()
        if kind != "op":
            raise ApiError("INVALID_ARGUMENT", f"filter: expected an operator, got {op!r}")
        return {"field": name, "op": op, "value": self.parse_literal()}

    def parse_list(self) -> List[Any]:
        if self.take() != ("punct", "["):
            raise ApiError("INVALID_ARGUMENT", "filter: expected [")
        values = []
        while self.peek() != ("punct", "]"):
            values.append(self.parse_literal())
            if self.peek() == ("punct", ","):
                self.take()
        self.take()
        return values

    def parse_literal(self) -> Any:
        kind, value = self.take()
        if kind in ("string", "number"):
            return value
        if kind == "word" and value in ("true", "false"):
            return value == "true"
        raise ApiError("INVALID_ARGUMENT", f"filter: expected a literal, got {value!r}")


def _compare(stored: Any, op: str, literal: Any) -> bool:
    if op == "!=":
        return not _compare(stored, "=", literal)
    if stored is None:
        return False
    numeric = (int, float)
    if isinstance(stored, bool) or isinstance(literal, bool):
        if not (isinstance(stored, bool) and isinstance(literal, bool)):
            return False
    elif isinstance(stored, numeric) != isinstance(literal, numeric):
        return False
    try:
        return {
            "=": stored == literal,
            "<": stored < literal,
            "<=": stored <= literal,
            ">": stored > literal,
            ">=": stored >= literal,
        }[op]
    except (TypeError, KeyError):
        return False


def _check_filter(tree: Any, schema: Dict[str, str], depth: int = 0) -> None:
    if depth > 32 or not isinstance(tree, dict):
        raise ApiError("INVALID_ARGUMENT", "filter: must be an object tree (depth <= 32)")
    for key in ("and", "or"):
        if key in tree:
            if not isinstance(tree[key], list):
                raise ApiError("INVALID_ARGUMENT", f"filter: '{key}' takes a list")
            for item in tree[key]:
                _check_filter(item, schema, depth + 1)
            return
    if "not" in tree:
        _check_filter(tree["not"], schema, depth + 1)
        return
    name = tree.get("field")
    # A declared field must be compared with values of its type; any other
    # field is read from the payloads, as the server does.
    kind = schema.get(name)
    numeric = (int, float)
    for literal in tree.get("in", tree.get("not_in", [tree.get("value")])):
        if kind == "keyword" and not isinstance(literal, str) or kind in ("integer", "float") and (
            isinstance(literal, bool) or not isinstance(literal, numeric)
        ):
            raise ApiError("INVALID_ARGUMENT", f"filter compares field {name!r} ({kind}) with {literal!r}")
    if "op" in tree and tree["op"] not in ("=", "!=", "<", "<=", ">", ">="):
        raise ApiError("INVALID_ARGUMENT", f"filter: unknown operator {tree['op']!r}")


def _matches(tree: Dict[str, Any], payload: Dict[str, Any]) -> bool:
    if "and" in tree:
        return all(_matches(item, payload) for item in tree["and"])
    if "or" in tree:
        return any(_matches(item, payload) for item in tree["or"])
    if "not" in tree:
        return not _matches(tree["not"], payload)
    stored = payload.get(tree["field"])
    if "in" in tree:
        return any(_compare(stored, "=", value) for value in tree["in"])
    if "not_in" in tree:
        return not any(_compare(stored, "=", value) for value in tree["not_in"])
    return _compare(stored, tree.get("op", "="), tree["value"])


# ------------------------------------------------------------------- server


class FakeGateway:
    """The in-memory gateway. Start with :meth:`start`, stop with :meth:`stop`."""

    def __init__(self, api_key: Optional[str] = None) -> None:
        self.api_key = api_key
        self.lock = threading.Lock()
        self.collections: Dict[str, Collection] = {}
        self.compact_rounds: Dict[str, int] = {}
        self.sequence = 0
        self.requests: List[Recorded] = []
        self.failures: List[ScriptedFailure] = []
        self.ready = True
        self.delay_seconds = 0.0
        # Bumped by reset(): a request still sleeping from an earlier test must not
        # consume the next test's scripted failures or touch its state.
        self.generation = 0
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # -- control

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeGateway":
        gateway = self

        class Handler(_Handler):
            fake = gateway

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.timeout = 0.05
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def reset(self) -> None:
        with self.lock:
            self.collections.clear()
            self.requests.clear()
            self.failures.clear()
            self.sequence = 0
            self.ready = True
            self.api_key = None
            self.delay_seconds = 0.0
            self.generation += 1

    def fail_next(
        self,
        status: int,
        body: Any,
        *,
        times: int = 1,
        headers: Optional[Dict[str, str]] = None,
        path_contains: Optional[str] = None,
        close_connection: bool = False,
    ) -> None:
        """Answers the next ``times`` matching requests with this status and body.

        ``body``: bytes as is, or a dict/list encoded as JSON. ``close_connection``
        drops the connection without any answer instead.
        """
        encoded = body if isinstance(body, bytes) else json.dumps(body).encode()
        with self.lock:
            self.failures.append(
                ScriptedFailure(status, encoded, dict(headers or {}), times, path_contains, close_connection)
            )

    def requests_to(self, fragment: str) -> List[Recorded]:
        with self.lock:
            return [request for request in self.requests if fragment in request.path]

    # -- dispatch (called from handler threads)

    def take_failure(self, path: str) -> Optional[ScriptedFailure]:
        with self.lock:
            for failure in self.failures:
                if failure.remaining > 0 and (
                    failure.path_contains is None or failure.path_contains in path
                ):
                    failure.remaining -= 1
                    return failure
        return None

    def dispatch(self, method: str, segments: List[str], body: Any) -> Tuple[int, Any]:
        with self.lock:
            return self._dispatch(method, segments, body)

    def _dispatch(self, method: str, segments: List[str], body: Any) -> Tuple[int, Any]:
        if segments[:2] == ["v1", "collections"]:
            rest = segments[2:]
            if not rest:
                if method == "GET":
                    return 200, {"collections": [c.describe() for c in self.collections.values()]}
                raise ApiError("INVALID_ARGUMENT", f"method {method} not allowed")
            name, action = rest[0], tuple(rest[1:])
            if action == () and method == "PUT":
                return 200, self._create(name, body)
            collection = self.collections.get(name)
            if collection is None:
                raise ApiError("NOT_FOUND", f"collection {name!r} does not exist")
            if action == () and method == "GET":
                return 200, collection.describe()
            if action == () and method == "DELETE":
                del self.collections[name]
                return 200, {}
            if method == "POST":
                if action == ("points",):
                    return 200, self._upsert(collection, body)
                if action == ("points", "delete"):
                    return 200, self._delete(collection, body)
                if action == ("points", "get"):
                    return 200, self._get(collection, body)
                if action == ("search",):
                    return 200, self._search(collection, body)
                if action == ("search", "batch"):
                    searches = _require(body, "searches", list)
                    return 200, {"results": [self._search(collection, s) for s in searches]}
            raise ApiError("NOT_FOUND", f"no route {method} /{'/'.join(segments)}")
        if segments[:2] == ["admin", "v1"]:
            rest = segments[2:]
            if rest == ["cluster"] and method == "GET":
                return 200, {
                    "meta": {"leader": 1, "term": 3, "members": [{"id": 1, "address": "127.0.0.1:7702", "role": "voter"}]},
                    "nodes": [{"id": "standalone", "role": "gateway", "address": "127.0.0.1:7700", "state": "alive"}],
                    "collections": len(self.collections),
                }
            if len(rest) == 3 and rest[0] == "collections":
                collection = self.collections.get(rest[1])
                if collection is None:
                    raise ApiError("NOT_FOUND", f"collection {rest[1]!r} does not exist")
                if rest[2] == "shards" and method == "GET":
                    return 200, {"shards": [{"shard": s, "indexer": "standalone", "epoch": 1, "searchers": [{"id": "standalone", "ready": True}], "manifest_version": 1, "segments": 0} for s in range(collection.shards)]}
                if rest[2] == "compact" and method == "POST":
                    # Like the real gateway on a large shard: the first answer comes
                    # back while shard 0 still compacts (202), the next one joins it.
                    rounds = self.compact_rounds.get(collection.name, 0)
                    if rounds == 0:
                        self.compact_rounds[collection.name] = 1
                        return 202, {"collection": collection.name, "merges": 1, "done": False, "running_shards": [0]}
                    self.compact_rounds[collection.name] = 0
                    return 200, {"collection": collection.name, "merges": 2, "done": True}
            if len(rest) == 3 and rest[0] == "nodes" and rest[2] == "drain" and method == "POST":
                if rest[1] != "standalone":
                    raise ApiError("NOT_FOUND", f"node {rest[1]!r} does not exist")
                return 200, {"node": rest[1], "state": "draining"}
        raise ApiError("NOT_FOUND", f"no route {method} /{'/'.join(segments)}")

    def _create(self, name: str, body: Any) -> Dict[str, Any]:
        if name in self.collections:
            raise ApiError("ALREADY_EXISTS", f"collection {name!r} already exists")
        dimension = _require(body, "dimension", int)
        if dimension <= 0 or isinstance(dimension, bool):
            raise ApiError("INVALID_ARGUMENT", "dimension must be positive")
        metric = body.get("metric", "cosine")
        if metric not in ("cosine", "dot", "l2"):
            raise ApiError("INVALID_ARGUMENT", f"metric {metric!r} is unknown")
        id_type = body.get("id_type", "u64")
        if id_type not in ("u64", "string"):
            raise ApiError("INVALID_ARGUMENT", f"id_type {id_type!r} is unknown")
        schema = body.get("payload_schema", [])
        if not isinstance(schema, list) or any(
            not isinstance(f, dict) or set(f) != {"name", "type"} or f["type"] not in FIELD_TYPES
            for f in schema
        ):
            raise ApiError("INVALID_ARGUMENT", "payload_schema must be [{name, type}]")
        collection = Collection(
            name=name,
            dimension=dimension,
            metric=metric,
            id_type=id_type,
            shards=body.get("shards", 1),
            replication=body.get("replication", 1),
            index=body.get("index", {}),
            payload_schema=schema,
        )
        self.collections[name] = collection
        return collection.describe()

    def _check_id(self, collection: Collection, point_id: Any, where: str) -> Any:
        if collection.id_type == "u64":
            if isinstance(point_id, bool) or not isinstance(point_id, int) or not 0 <= point_id <= MAX_U64:
                raise ApiError("INVALID_ARGUMENT", f"{where}: id must be an unsigned 64-bit integer")
        elif not isinstance(point_id, str) or not point_id or len(point_id.encode()) > 128:
            raise ApiError("INVALID_ARGUMENT", f"{where}: id must be a string of 1..128 bytes")
        return point_id

    def _check_vector(self, collection: Collection, vector: Any, where: str) -> List[float]:
        if isinstance(vector, str):
            try:
                vector = wire_floats(vector)
            except ValueError as error:
                raise ApiError("INVALID_ARGUMENT", f"{where}.vector: {error}") from None
        if not isinstance(vector, list) or len(vector) != collection.dimension:
            got = len(vector) if isinstance(vector, list) else type(vector).__name__
            raise ApiError(
                "INVALID_ARGUMENT",
                f"{where}.vector: dimension {got} does not match the collection's {collection.dimension}",
            )
        for value in vector:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ApiError("INVALID_ARGUMENT", f"{where}.vector: values must be finite numbers")
        return [float(value) for value in vector]

    def _upsert(self, collection: Collection, body: Any) -> Dict[str, Any]:
        points = _require(body, "points", list)
        staged = []
        for index, point in enumerate(points):
            where = f"points[{index}]"
            if not isinstance(point, dict):
                raise ApiError("INVALID_ARGUMENT", f"{where} must be an object")
            point_id = self._check_id(collection, point.get("id"), where)
            vector = self._check_vector(collection, point.get("vector"), where)
            payload = point.get("payload")
            if payload is not None and not isinstance(payload, dict):
                raise ApiError("INVALID_ARGUMENT", f"{where}.payload must be an object")
            staged.append((point_id, vector, payload))
        for point_id, vector, payload in staged:
            collection.points[point_id] = (vector, payload)
        self.sequence += 1
        return {"sequence": self.sequence}

    def _delete(self, collection: Collection, body: Any) -> Dict[str, Any]:
        for index, point_id in enumerate(_require(body, "ids", list)):
            collection.points.pop(self._check_id(collection, point_id, f"ids[{index}]"), None)
        self.sequence += 1
        return {"sequence": self.sequence}

    def _get(self, collection: Collection, body: Any) -> Dict[str, Any]:
        include_vector = bool(body.get("include_vector", False))
        found = []
        for index, point_id in enumerate(_require(body, "ids", list)):
            self._check_id(collection, point_id, f"ids[{index}]")
            if point_id in collection.points:
                vector, payload = collection.points[point_id]
                item: Dict[str, Any] = {"id": point_id}
                if payload is not None:
                    item["payload"] = payload
                if include_vector:
                    item["vector"] = vector
                found.append(item)
        return {"points": found}

    def _search(self, collection: Collection, body: Any) -> Dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError("INVALID_ARGUMENT", "a search must be an object")
        query = self._check_vector(collection, body.get("vector"), "search")
        k = body.get("k", 10)
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            raise ApiError("INVALID_ARGUMENT", "k must be a positive integer")
        consistency = body.get("consistency", "strong")
        if consistency not in ("strong", "eventual"):
            raise ApiError("INVALID_ARGUMENT", f"consistency {consistency!r} is unknown")
        tree = body.get("filter")
        if isinstance(tree, str):
            tree = _FilterParser(tree).parse()
        schema = {f["name"]: f["type"] for f in collection.payload_schema}
        if tree is not None:
            _check_filter(tree, schema)
        scored = []
        for point_id, (vector, payload) in collection.points.items():
            if tree is not None and not _matches(tree, payload or {}):
                continue
            scored.append((_score(collection.metric, query, vector), point_id))
        smaller_is_better = collection.metric == "l2"
        scored.sort(key=lambda pair: pair[0] if smaller_is_better else -pair[0])
        hits = []
        for score, point_id in scored[:k]:
            vector, payload = collection.points[point_id]
            hit: Dict[str, Any] = {"id": point_id, "score": score}
            if body.get("include_payload", True) and payload is not None:
                hit["payload"] = payload
            if body.get("include_vector", False):
                hit["vector"] = vector
            hits.append(hit)
        return {"hits": hits, "took_ms": 0.25}


def _score(metric: str, query: List[float], vector: List[float]) -> float:
    dot = sum(a * b for a, b in zip(query, vector))
    if metric == "dot":
        return dot
    if metric == "l2":
        return sum((a - b) ** 2 for a, b in zip(query, vector))
    norms = math.sqrt(sum(a * a for a in query)) * math.sqrt(sum(b * b for b in vector))
    return dot / norms if norms else 0.0


def _require(body: Any, key: str, kind: type) -> Any:
    if not isinstance(body, dict) or key not in body:
        raise ApiError("INVALID_ARGUMENT", f"field {key!r} is required")
    value = body[key]
    if not isinstance(value, kind):
        raise ApiError("INVALID_ARGUMENT", f"field {key!r} must be a {kind.__name__}")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeGateway

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes: without this, Nagle + delayed ACK
        # add ~40 ms to every keep-alive request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        self.handle_any("GET")

    def do_PUT(self) -> None:
        self.handle_any("PUT")

    def do_POST(self) -> None:
        self.handle_any("POST")

    def do_DELETE(self) -> None:
        self.handle_any("DELETE")

    def send(self, status: int, body: bytes, headers: Optional[Dict[str, str]] = None) -> None:
        self.send_response(status)
        headers = dict(headers or {})
        headers.setdefault("content-type", "application/json")
        request_id = self.headers.get("x-request-id")
        if request_id:
            headers.setdefault("x-request-id", request_id)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_error_json(self, code: str, message: str) -> None:
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        self.send(STATUS_OF_CODE.get(code, 500), body)

    def handle_any(self, method: str) -> None:
        fake = self.fake
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        raw_path = urlsplit(self.path).path
        try:
            body = json.loads(raw, parse_constant=_reject_constant) if raw else None
            parse_error = None
        except ValueError as error:
            body, parse_error = None, str(error)
        with fake.lock:
            generation = fake.generation
            delay_seconds = fake.delay_seconds
            fake.requests.append(
                Recorded(method, raw_path, {k.lower(): v for k, v in self.headers.items()}, body, self.client_address[1])
            )
        if delay_seconds:
            threading.Event().wait(delay_seconds)
            if fake.generation != generation:  # the test that sent it is over
                self.close_connection = True
                return

        failure = fake.take_failure(raw_path)
        if failure is not None:
            if failure.close_connection:
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.send(failure.status, failure.body, failure.headers)
            return

        if raw_path in ("/healthz", "/readyz"):
            ready = raw_path == "/healthz" or fake.ready
            self.send(200 if ready else 503, b"ok" if ready else b"not ready", {"content-type": "text/plain"})
            return
        if fake.api_key is not None and self.headers.get("authorization") != f"Bearer {fake.api_key}":
            self.send_error_json("UNAUTHENTICATED", "missing or unknown API key")
            return
        if parse_error is not None:
            self.send_error_json("INVALID_ARGUMENT", f"request body is not valid JSON: {parse_error}")
            return
        segments = [unquote(segment) for segment in raw_path.strip("/").split("/")]
        try:
            status, answer = fake.dispatch(method, segments, body)
        except ApiError as error:
            self.send_error_json(error.code, error.message)
            return
        self.send(status, json.dumps(answer).encode())


def main() -> None:
    """Serves the fake on a loopback port until interrupted (to try the SDK by hand)."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=7700)
    arguments = parser.parse_args()
    gateway = FakeGateway()

    class Handler(_Handler):
        fake = gateway

    server = ThreadingHTTPServer(("127.0.0.1", arguments.port), Handler)
    server.daemon_threads = True
    print(f"fake quiver gateway on http://127.0.0.1:{arguments.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
