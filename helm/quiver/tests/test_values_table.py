"""README.md's values table is generated from values.yaml's comments
(gen_values_table.py) and must match them."""

from __future__ import annotations

import pytest
import yaml

import gen_values_table as generator
from support import CHART_DIR


def test_readme_values_table_is_up_to_date():
    readme = (CHART_DIR / "README.md").read_text(encoding="utf-8")
    values_text = (CHART_DIR / "values.yaml").read_text(encoding="utf-8")
    fresh = generator.with_table(readme, values_text)
    assert fresh == readme, (
        "README.md's values table is out of date with values.yaml: "
        "run python3 helm/quiver/tests/gen_values_table.py"
    )


def test_every_value_has_a_description_and_its_default():
    """Every key of values.yaml is a row (or inside a map listed whole), with a
    description and the default values.yaml gives."""
    values_text = (CHART_DIR / "values.yaml").read_text(encoding="utf-8")
    rows = generator.rows_of(values_text)  # raises on a key without a comment
    paths = [row.path for row in rows]
    assert len(paths) == len(set(paths))
    defaults = yaml.safe_load(values_text)

    def lookup(path: str):
        node = defaults
        for part in path.split("."):
            node = node[part]
        return node

    for row in rows:
        assert row.description, row.path
        assert row.default == lookup(row.path), row.path

    def covered(path: str) -> bool:
        return any(path == row or path.startswith(f"{row}.") for row in paths)

    def leaves(tree, prefix=""):
        for key, value in tree.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                yield from leaves(value, f"{path}.")
            else:
                yield path

    assert [path for path in leaves(defaults) if not covered(path)] == []
    # The test hook's values are documented like the rest.
    assert {"tests.enabled", "tests.image.repository", "tests.image.tag"} <= set(paths)


def test_generator_rules():
    text = """# File header, not a description.

# -- Listed whole: the comment starts with `# --`.
resources:
  requests: {cpu: 1}
# A section comment: the map is listed key by key.
section:
  # -- A number.
  # Second line | with a pipe.
  count: 3
  # Plain comment lines work too.
  names: [a, b]
  nested:
    # -- Deeper.
    flag: false
"""
    rows = generator.rows_of(text)
    assert [(row.path, row.type, row.default) for row in rows] == [
        ("resources", "object", {"requests": {"cpu": 1}}),
        ("section.count", "int", 3),
        ("section.names", "list", ["a", "b"]),
        ("section.nested.flag", "bool", False),
    ]
    assert rows[1].description == "A number. Second line | with a pipe."
    table = generator.table(rows)
    assert "| `section.count` | int | `3` | A number. Second line \\| with a pipe. |" in table
    readme = "intro\n<!-- values-table:start -->\nold table\n<!-- values-table:end -->\noutro\n"
    fresh = generator.with_table(readme, text)
    assert fresh.startswith("intro\n<!-- values-table:start -->\n")
    assert fresh.endswith("<!-- values-table:end -->\noutro\n")
    assert "old table" not in fresh and "`section.nested.flag`" in fresh
    assert generator.with_table(fresh, text) == fresh


def test_generator_refuses_undocumented_keys_and_missing_markers():
    with pytest.raises(generator.ValuesError, match="section.undocumented"):
        generator.rows_of("section:\n  # -- Documented.\n  ok: 1\n  undocumented: 2\n")
    with pytest.raises(generator.ValuesError, match="values-table:start"):
        generator.with_table("no markers here\n", "# -- A key.\nkey: 1\n")
