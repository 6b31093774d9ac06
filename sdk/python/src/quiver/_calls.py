"""The REST mapping of every client method (docs/api.md), as :class:`ApiCall` values.

Both clients execute these; keeping the mapping in one place keeps them identical.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from . import _convert as convert
from ._convert import Filter, PayloadSchema, Vectors
from ._core import ApiCall
from .types import Point, SearchResult


def _collection_path(name: str, suffix: str = "") -> str:
    return f"/v1/collections/{convert.path_segment(name, 'collection name')}{suffix}"


def _ignore(_: Any) -> None:
    return None


def create_collection(
    name: str,
    dimension: int,
    metric: str = "cosine",
    id_type: Optional[str] = None,
    shards: Optional[int] = None,
    replication: Optional[int] = None,
    index: Optional[Mapping[str, Any]] = None,
    payload_schema: Optional[PayloadSchema] = None,
) -> ApiCall[Dict[str, Any]]:
    body = convert.create_collection_body(
        dimension, metric, id_type, shards, replication, index, payload_schema
    )
    # Not idempotent: a retry after a lost answer would report ALREADY_EXISTS.
    return ApiCall("PUT", _collection_path(name), convert.as_dict, body, idempotent=False)


def list_collections() -> ApiCall[List[Dict[str, Any]]]:
    return ApiCall("GET", "/v1/collections", convert.collections_list)


def describe(name: str) -> ApiCall[Dict[str, Any]]:
    return ApiCall("GET", _collection_path(name), convert.as_dict)


def drop_collection(name: str) -> ApiCall[None]:
    # Not idempotent: a retry after a lost answer would report NOT_FOUND.
    return ApiCall("DELETE", _collection_path(name), _ignore, idempotent=False)


def upsert(name: str, ids: Any, vectors: Vectors, payloads: Any = None) -> ApiCall[int]:
    # Idempotent: an upsert replaces the points with the same ids.
    body = convert.upsert_body(ids, vectors, payloads)
    return ApiCall("POST", _collection_path(name, "/points"), convert.sequence_of, body)


def delete(name: str, ids: Any) -> ApiCall[int]:
    id_list = convert.convert_ids(ids)
    body = convert.encode_json({"ids": id_list})
    return ApiCall("POST", _collection_path(name, "/points/delete"), convert.sequence_of, body)


def get(name: str, ids: Any, include_vector: bool = False) -> ApiCall[List[Point]]:
    id_list = convert.convert_ids(ids)
    body = convert.encode_json({"ids": id_list, "include_vector": bool(include_vector)})
    return ApiCall("POST", _collection_path(name, "/points/get"), convert.points_list, body)


def search(
    name: str,
    vector: Any,
    k: int = 10,
    filter: Optional[Filter] = None,
    nprobe: Optional[int] = None,
    rescore: Optional[int] = None,
    consistency: Optional[str] = None,
    include_payload: bool = True,
    include_vector: bool = False,
) -> ApiCall[SearchResult]:
    request = convert.search_request(
        vector, k, filter, nprobe, rescore, consistency, include_payload, include_vector
    )
    body = convert.encode_search_json(request)
    return ApiCall("POST", _collection_path(name, "/search"), convert.search_result, body)


def search_batch(name: str, searches: Sequence[Mapping[str, Any]]) -> ApiCall[List[SearchResult]]:
    body = convert.search_batch_body(searches)
    return ApiCall(
        "POST", _collection_path(name, "/search/batch"), convert.search_batch_results, body
    )


def cluster_status() -> ApiCall[Dict[str, Any]]:
    return ApiCall("GET", "/admin/v1/cluster", convert.as_dict)


def collection_shards(name: str) -> ApiCall[Dict[str, Any]]:
    path = f"/admin/v1/collections/{convert.path_segment(name, 'collection name')}/shards"
    return ApiCall("GET", path, convert.as_dict)


def compact(name: str) -> ApiCall[Dict[str, Any]]:
    path = f"/admin/v1/collections/{convert.path_segment(name, 'collection name')}/compact"
    return ApiCall("POST", path, convert.as_dict)


def drain_node(node_id: str) -> ApiCall[Dict[str, Any]]:
    path = f"/admin/v1/nodes/{convert.path_segment(str(node_id), 'node id')}/drain"
    return ApiCall("POST", path, convert.as_dict)
