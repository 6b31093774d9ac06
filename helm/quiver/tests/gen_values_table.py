#!/usr/bin/env python3
"""Writes the values table of helm/quiver/README.md from the comments of values.yaml.

    python3 helm/quiver/tests/gen_values_table.py           # rewrite README.md
    python3 helm/quiver/tests/gen_values_table.py --check   # exit 1 if it is out of date

Every key of values.yaml is a row (key path, type, default, description); the
description is the block of `#` comment lines directly above the key (a leading
`-- ` is dropped, lines are joined). A map is one row when its comment starts with
`# --` (e.g. `resources`, `podSecurityContext`); other maps, such as `objectStore`
under a plain section comment, are listed key by key. Empty maps and lists are rows.
The table goes between the `<!-- values-table:start -->` and
`<!-- values-table:end -->` lines of README.md; the rest of the file is kept.

Needs Python 3.10+ and PyYAML (in tests/requirements.txt; run.sh's virtualenv has it).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import yaml
except ImportError:  # pragma: no cover - depends on the interpreter
    sys.exit(
        "gen_values_table.py needs PyYAML: `python3 -m pip install PyYAML`, or run it with "
        "the tests' virtualenv (/var/tmp/quiver-helm-venv/bin/python)"
    )

CHART_DIR = Path(__file__).resolve().parent.parent
VALUES_FILE = CHART_DIR / "values.yaml"
README_FILE = CHART_DIR / "README.md"

START_MARKER = "<!-- values-table:start -->"
END_MARKER = "<!-- values-table:end -->"
WHOLE_MAP_MARKER = "--"


@dataclass(frozen=True)
class Row:
    path: str
    type: str
    default: Any
    description: str


class ValuesError(Exception):
    """values.yaml cannot be turned into a table (e.g. a key without a comment)."""


def comment_above(lines: list[str], line_index: int) -> list[str]:
    """The `#` comment lines directly above line `line_index` (0-based), top first,
    with the `#` and surrounding spaces removed."""
    block: list[str] = []
    index = line_index - 1
    while index >= 0 and lines[index].lstrip().startswith("#"):
        block.append(lines[index].strip()[1:].strip())
        index -= 1
    return block[::-1]


def description_of(comment: list[str]) -> str:
    text = " ".join(line for line in comment if line)
    if text == WHOLE_MAP_MARKER:
        return ""
    return text.removeprefix(f"{WHOLE_MAP_MARKER} ")


def type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    if value is None:
        return "null"
    raise ValuesError(f"unexpected value type {type(value).__name__}")


def rows_of(text: str) -> list[Row]:
    """The table rows of a values.yaml text, in file order."""
    lines = text.splitlines()
    root = yaml.compose(text)
    if root is None:
        return []
    if not isinstance(root, yaml.MappingNode):
        raise ValuesError("values.yaml is not a map")
    constructor = yaml.SafeLoader("")
    rows: list[Row] = []
    missing: list[str] = []

    def walk(node: yaml.MappingNode, prefix: str) -> None:
        for key_node, value_node in node.value:
            path = f"{prefix}{key_node.value}"
            comment = comment_above(lines, key_node.start_mark.line)
            whole = bool(comment) and comment[0].split(" ", 1)[0] == WHOLE_MAP_MARKER
            if isinstance(value_node, yaml.MappingNode) and value_node.value and not whole:
                walk(value_node, f"{path}.")
                continue
            description = description_of(comment)
            if not description:
                missing.append(path)
            value = constructor.construct_object(value_node, deep=True)
            rows.append(Row(path, type_of(value), value, description))

    walk(root, "")
    if missing:
        raise ValuesError(
            "values.yaml keys without a comment directly above them: " + ", ".join(missing)
        )
    return rows


def cell(text: str) -> str:
    """Text made safe for a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def default_cell(value: Any) -> str:
    shown = json.dumps(value, ensure_ascii=False)
    return f"`{cell(shown)}`"


def table(rows: list[Row]) -> str:
    out = ["| key | type | default | description |", "|---|---|---|---|"]
    for row in rows:
        out.append(
            f"| `{cell(row.path)}` | {row.type} | {default_cell(row.default)} | {cell(row.description)} |"
        )
    return "\n".join(out) + "\n"


def with_table(readme: str, values_text: str) -> str:
    """README text with the table between the markers replaced by a fresh one."""
    start = readme.find(START_MARKER)
    end = readme.find(END_MARKER)
    if start < 0 or end < 0 or end < start:
        raise ValuesError(f"README.md needs a {START_MARKER} line followed by a {END_MARKER} line")
    head = readme[: start + len(START_MARKER)]
    tail = readme[end:]
    notice = (
        "\n<!-- Generated from values.yaml by tests/gen_values_table.py; edit the comments"
        " there, not this table. -->\n\n"
    )
    return head + notice + table(rows_of(values_text)) + "\n" + tail


def main(arguments: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="do not write; exit 1 if README.md is out of date"
    )
    options = parser.parse_args(arguments)
    readme = README_FILE.read_text(encoding="utf-8")
    try:
        fresh = with_table(readme, VALUES_FILE.read_text(encoding="utf-8"))
    except ValuesError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if fresh == readme:
        print(f"{README_FILE.name} is up to date")
        return 0
    if options.check:
        print(
            f"{README_FILE.name}'s values table is out of date: run "
            "python3 helm/quiver/tests/gen_values_table.py",
            file=sys.stderr,
        )
        return 1
    README_FILE.write_text(fresh, encoding="utf-8")
    print(f"wrote the values table of {README_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
