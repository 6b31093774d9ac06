"""The README's examples run, unchanged but for the endpoint, against the fake gateway."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import quiver
from fake_gateway import FakeGateway

pytest.importorskip("numpy")

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def run_block(code: str, gateway: FakeGateway) -> None:
    code = code.replace("http://localhost:7700", gateway.endpoint)
    code = code.replace("https://quiver.example.com", gateway.endpoint)
    exec(compile(code, str(README), "exec"), {"__name__": "readme"})


def test_the_readme_has_its_examples() -> None:
    assert len(python_blocks()) >= 3


def test_quickstart(gateway: FakeGateway, capsys: pytest.CaptureFixture) -> None:
    run_block(python_blocks()[0], gateway)
    assert "docs" not in gateway.collections  # it drops what it made
    assert gateway.requests_to("/search")


def test_walk_through(gateway: FakeGateway) -> None:
    # The same code on a tenth of the points (the fake searches by brute force in Python).
    code = python_blocks()[1].replace("50_000", "5_000")
    run_block(code, gateway)
    assert "articles" not in gateway.collections
    assert len(gateway.requests_to("/v1/collections/articles/points")) == 5


def test_asyncio_example(gateway: FakeGateway) -> None:
    with quiver.Client(gateway.endpoint) as client:
        client.create_collection("docs", dimension=384)
        client.upsert("docs", ids=[1], vectors=[[0.1] * 384])
    run_block(python_blocks()[2], gateway)
    assert len(gateway.requests_to("/search")) == 2
