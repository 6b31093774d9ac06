"""Shared helpers of the chart and deployment tests: paths, rendering, the CLI contract."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

TESTS_DIR = Path(__file__).resolve().parent
CHART_DIR = TESTS_DIR.parent
REPO_ROOT = CHART_DIR.parent.parent
VALUES_DIR = TESTS_DIR / "values"
DEPLOY_DIR = REPO_ROOT / "deploy"
OPERATIONS_DOC = REPO_ROOT / "docs" / "operations.md"

RELEASE = "quiver"
NAMESPACE = "vectors"

# Kubernetes versions every manifest is validated against: the chart's kubeVersion
# floor and the newest schema kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.27.0", "1.37.0")

# The command lines of INTERFACES.md ("`quiver` binary"), verbatim. If the shared
# contract is beside the repository (as in CI), test_contract checks these lines
# are still in it, so a change of the contract fails here until the chart follows.
CONTRACT_LINES = {
    "standalone": "quiver standalone --data-dir DIR [--http-listen 127.0.0.1:7700] [--grpc-listen 127.0.0.1:7701]",
    "meta": "quiver meta      --node-id N --data-dir DIR --listen ADDR [--peers 1=ADDR,2=ADDR,3=ADDR] [--init]",
    "indexer": "quiver indexer   --meta ADDR[,ADDR…] --object-store URL --listen ADDR [--node-id ID]",
    "searcher": "quiver searcher  --meta ADDR[,ADDR…] --object-store URL --cache-dir DIR --cache-size BYTES --listen ADDR [--node-id ID]",
    "gateway": "quiver gateway   --meta ADDR[,ADDR…] --http-listen ADDR --grpc-listen ADDR",
}

# Flags every role takes (INTERFACES.md: --config, --log-format, /metrics on an HTTP
# port) plus the drain time and TLS between roles (--cluster-tls-*, every role but
# standalone); --advertise-address (meta) and --tls-cert/--tls-key (gateway) are the
# other flags the roles' owners fixed for deployment.
CLUSTER_TLS_FLAGS = {"--cluster-tls-ca", "--cluster-tls-cert", "--cluster-tls-key"}
GLOBAL_FLAGS = {"--config", "--log-format", "--http-listen", "--shutdown-grace-ms"} | CLUSTER_TLS_FLAGS
EXTRA_FLAGS = {"meta": {"--advertise-address"}, "gateway": {"--tls-cert", "--tls-key"}}
# Flags that take no value.
SWITCHES = {"--init"}


def contract_flags(role: str) -> tuple[set[str], set[str]]:
    """Returns (required, optional) flags of a role from its contract line."""
    line = CONTRACT_LINES[role]
    required = set(re.findall(r"(?<!\[)(--[a-z-]+)", line))
    optional = set(re.findall(r"\[(--[a-z-]+)", line))
    return required, optional


def allowed_flags(role: str) -> set[str]:
    required, optional = contract_flags(role)
    return required | optional | GLOBAL_FLAGS | EXTRA_FLAGS.get(role, set())


def parse_flags(arguments: list[str]) -> dict[str, str | bool]:
    """Parses `--flag value` pairs (and switches) into a dict; fails on stray words."""
    flags: dict[str, str | bool] = {}
    index = 0
    while index < len(arguments):
        word = arguments[index]
        assert word.startswith("--"), f"expected a flag, got {word!r} in {arguments}"
        assert word not in flags, f"flag {word} given twice in {arguments}"
        if word in SWITCHES:
            flags[word] = True
            index += 1
            continue
        assert index + 1 < len(arguments), f"flag {word} has no value in {arguments}"
        flags[word] = arguments[index + 1]
        index += 2
    return flags


def check_role_command(role: str, arguments: list[str]) -> dict[str, str | bool]:
    """Asserts a `quiver <role> …` argument list uses only contract flags and every
    required one; returns the parsed flags."""
    assert arguments and arguments[0] == role, f"expected role {role}, got {arguments[:1]}"
    flags = parse_flags(arguments[1:])
    required, _ = contract_flags(role)
    missing = required - set(flags)
    assert not missing, f"{role}: missing required flags {sorted(missing)}"
    unknown = set(flags) - allowed_flags(role)
    assert not unknown, f"{role}: flags outside the contract {sorted(unknown)}"
    return flags


def load_values(name: str) -> dict[str, Any] | None:
    if name == "default":
        return None
    return yaml.safe_load((VALUES_DIR / f"{name}.yaml").read_text())


VALUE_SETS = ("default", "minimal", "ha", "autoscaling", "tls", "cluster-tls")


@functools.lru_cache(maxsize=1)
def chart() -> helm.Chart:
    return helm.Chart.load(CHART_DIR)


def render(values: dict[str, Any] | None) -> dict[str, str]:
    """Renders the chart offline with the real Helm engine (template path → text)."""
    return chart().render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)


@functools.lru_cache(maxsize=None)
def rendered_objects(value_set: str) -> tuple[dict[str, Any], ...]:
    """Every Kubernetes object the chart renders for a value set."""
    return objects_of(load_values(value_set))


def objects_of(values: dict[str, Any] | None) -> tuple[dict[str, Any], ...]:
    """Every Kubernetes object the chart renders with these values."""
    objects = []
    for path, text in sorted(render(values).items()):
        if path.endswith("NOTES.txt"):
            continue
        for document in yaml.safe_load_all(text):
            if document:
                objects.append(document)
    return tuple(objects)


def find(objects, kind: str, name_suffix: str) -> dict[str, Any]:
    matches = [
        item
        for item in objects
        if item["kind"] == kind and item["metadata"]["name"].endswith(name_suffix)
    ]
    assert len(matches) == 1, f"expected one {kind} *{name_suffix}, found {len(matches)}"
    return matches[0]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def meta_exec_line(workload: dict[str, Any]) -> list[str]:
    """The words of the meta container's `exec quiver meta …` line."""
    script = container(workload)["args"][0]
    lines = [line.strip() for line in script.splitlines() if line.strip().startswith("exec ")]
    assert len(lines) == 1, script
    return shlex.split(lines[0])
