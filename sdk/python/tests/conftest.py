"""Fixtures: one in-memory fake gateway per session, reset before each test."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_gateway import FakeGateway  # noqa: E402

import quiver  # noqa: E402


@pytest.fixture(scope="session")
def _session_gateway() -> Iterator[FakeGateway]:
    gateway = FakeGateway().start()
    yield gateway
    gateway.stop()


@pytest.fixture
def gateway(_session_gateway: FakeGateway) -> FakeGateway:
    _session_gateway.reset()
    return _session_gateway


def fast_retries() -> dict:
    """Client settings that keep retry tests quick (Retry-After still wins)."""
    return {"retries": 3, "backoff_base": 0.01, "backoff_max": 0.05}


@pytest.fixture
def client(gateway: FakeGateway, monkeypatch: pytest.MonkeyPatch) -> Iterator[quiver.Client]:
    monkeypatch.delenv("QUIVER_API_KEY", raising=False)
    with quiver.Client(gateway.endpoint, timeout=5.0, **fast_retries()) as client:
        yield client


@pytest.fixture
async def async_client(
    gateway: FakeGateway, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[quiver.AsyncClient]:
    monkeypatch.delenv("QUIVER_API_KEY", raising=False)
    async with quiver.AsyncClient(gateway.endpoint, timeout=5.0, **fast_retries()) as client:
        yield client


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(params=["json", "orjson"])
def each_encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test with the standard library's encoder and with orjson (if installed)."""
    from quiver import _convert

    if request.param == "json":
        monkeypatch.setattr(_convert, "_orjson", None)
    elif _convert._orjson is None:
        pytest.skip("orjson (>= 3.9.8) is not installed")
    return str(request.param)
