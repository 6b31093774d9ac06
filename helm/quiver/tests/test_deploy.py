"""deploy/: the docker-compose cluster, the Prometheus configuration and alert rules, the
Grafana dashboard and the Dockerfile, checked without Docker against the CLI contract
and against docs/operations.md."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import promql_parser
import pytest
import yaml
from compose_spec import PyCompose

from support import (
    CONTRACT_LINES,
    DEPLOY_DIR,
    OPERATIONS_DOC,
    REPO_ROOT,
    check_role_command,
)

COMPOSE_FILE = DEPLOY_DIR / "docker-compose.yml"
PROMETHEUS_FILE = DEPLOY_DIR / "prometheus" / "prometheus.yml"
ALERTS_FILE = DEPLOY_DIR / "prometheus" / "alerts.yml"
DASHBOARD_FILE = DEPLOY_DIR / "grafana" / "quiver.json"
ROLES = ("meta", "indexer", "searcher", "gateway")
HTTP_PORTS = {"meta": 7101, "indexer": 7201, "searcher": 7301, "gateway": 7700}
GRPC_PORTS = {"meta": 7100, "indexer": 7200, "searcher": 7300, "gateway": 7701}


def interpolate(text: str) -> str:
    """Applies compose's `${VAR:-default}` with the defaults (the environment unset)."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", text)


@pytest.fixture(scope="module")
def compose():
    raw = COMPOSE_FILE.read_text()
    uncommented = "\n".join(line for line in raw.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"\$\{[A-Z0-9_]+\}", uncommented), "every variable needs a default"
    return yaml.safe_load(interpolate(raw))


@pytest.fixture(scope="module")
def quiver_services(compose):
    """Quiver services by role: {role: {service name: command words}}."""
    by_role: dict[str, dict[str, list[str]]] = {role: {} for role in ROLES}
    for name, service in compose["services"].items():
        if service.get("build", {}).get("dockerfile") == "deploy/Dockerfile":
            command = service["command"]
            assert command[0] in ROLES, f"{name}: unknown role {command[0]}"
            by_role[command[0]][name] = command
    return by_role


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data):
        return True


def test_compose_file_follows_the_compose_specification(compose):
    # The parser does not resolve YAML merge keys (`<<: *quiver`), so it gets the
    # file as compose sees it after interpolation and merging.
    try:
        parsed = PyCompose.from_yaml(yaml.dump(compose, Dumper=_NoAliases, sort_keys=False))
    except ValueError as error:
        pytest.fail(f"docker-compose.yml is not a valid Compose file: {error}")
    assert sorted(parsed.service_names()) == sorted(compose["services"])


def test_compose_has_the_documented_topology(compose, quiver_services):
    counts = {role: len(services) for role, services in quiver_services.items()}
    assert counts == {"meta": 3, "indexer": 1, "searcher": 2, "gateway": 1}
    assert {"minio", "create-bucket", "prometheus", "grafana"} <= set(compose["services"])
    for name, service in compose["services"].items():
        if name != "create-bucket":
            assert "healthcheck" in service, f"{name} has no healthcheck"
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if not source.startswith("."):
                assert source in compose["volumes"], f"{name}: undeclared volume {source}"
            else:
                assert (DEPLOY_DIR / source).exists(), f"{name}: {source} does not exist"


def test_compose_commands_use_the_contract_flags(compose, quiver_services):
    meta_flags = {
        name: check_role_command("meta", command) for name, command in quiver_services["meta"].items()
    }
    advertised = {name: flags["--advertise-address"] for name, flags in meta_flags.items()}
    for name, flags in meta_flags.items():
        assert flags["--init"] is True, f"{name}: every meta node starts with --init"
        assert flags["--listen"] == f"0.0.0.0:{GRPC_PORTS['meta']}"
        assert flags["--http-listen"] == f"0.0.0.0:{HTTP_PORTS['meta']}"
        assert advertised[name] == f"{name}:{GRPC_PORTS['meta']}"
        peers = dict(peer.split("=", 1) for peer in flags["--peers"].split(","))
        assert peers[flags["--node-id"]] == advertised[name]
        assert sorted(peers.values()) == sorted(advertised.values())
        assert any(volume.endswith(":" + flags["--data-dir"]) for volume in compose["services"][name]["volumes"])
    assert sorted(flags["--node-id"] for flags in meta_flags.values()) == ["1", "2", "3"]
    meta_list = sorted(advertised.values())

    bucket_command = compose["services"]["create-bucket"]["entrypoint"]
    bucket = bucket_command[-1].split("/", 1)[1]
    for role in ("indexer", "searcher"):
        for name, command in quiver_services[role].items():
            flags = check_role_command(role, command)
            assert sorted(flags["--meta"].split(",")) == meta_list
            assert flags["--object-store"].startswith(f"s3://{bucket}/")
            assert flags["--node-id"] == name
            # They register the --listen address with meta: it must be their own
            # fixed address on the compose network, reachable from the gateway.
            address = compose["services"][name]["networks"]["quiver"]["ipv4_address"]
            assert flags["--listen"] == f"{address}:{GRPC_PORTS[role]}"
            assert flags["--http-listen"] == f"0.0.0.0:{HTTP_PORTS[role]}"
            environment = compose["services"][name]["environment"]
            assert environment["AWS_ENDPOINT_URL"] == "http://minio:9000"
            assert {"AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(environment)
            depends = compose["services"][name]["depends_on"]
            assert depends["create-bucket"]["condition"] == "service_completed_successfully"
            if role == "searcher":
                assert any(volume.endswith(":" + flags["--cache-dir"]) for volume in compose["services"][name]["volumes"])
                assert re.fullmatch(r"[1-9][0-9]*(MiB|GiB|TiB)", flags["--cache-size"])
    for name, command in quiver_services["gateway"].items():
        flags = check_role_command("gateway", command)
        assert sorted(flags["--meta"].split(",")) == meta_list
        assert flags["--http-listen"] == "0.0.0.0:7700"
        assert flags["--grpc-listen"] == "0.0.0.0:7701"

    subnet = compose["networks"]["quiver"]["ipam"]["config"][0]["subnet"]
    assert subnet.endswith(".0/24")
    for role in ("indexer", "searcher"):
        for name in quiver_services[role]:
            assert compose["services"][name]["networks"]["quiver"]["ipv4_address"].startswith(subnet[: -len("0/24")])


def test_prometheus_scrapes_every_role_with_role_labels(compose, quiver_services):
    config = yaml.safe_load(PROMETHEUS_FILE.read_text())
    targets: dict[str, dict[str, str]] = {}
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            for target in static["targets"]:
                targets[target] = static.get("labels", {})
    for role, services in quiver_services.items():
        for name in services:
            labels = targets.get(f"{name}:{HTTP_PORTS[role]}")
            assert labels is not None, f"{name}'s /metrics is not scraped"
            assert labels == {"role": role, "quiver_cluster": "quiver"}
    mounts = compose["services"]["prometheus"]["volumes"]
    assert f"./prometheus/alerts.yml:{config['rule_files'][0]}:ro" in mounts


def documented_metrics() -> dict[str, str]:
    """Metric name → type from the metrics tables of docs/operations.md."""
    text = OPERATIONS_DOC.read_text()
    rows = re.findall(r"^\|\s*`(quiver_[a-z0-9_]+)`\s*\|\s*(counter|gauge|histogram)\s*\|", text, re.M)
    assert rows, "docs/operations.md has no metrics table"
    return dict(rows)


def metric_names(expression: str) -> set[str]:
    names: set[str] = set()

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expression), visit)
    return names


def base_metric(name: str, documented: dict[str, str]) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        stem = name.removesuffix(suffix)
        if stem != name and documented.get(stem) == "histogram":
            return stem
    return name


def github_anchors(markdown: str) -> set[str]:
    anchors = set()
    for heading in re.findall(r"^#+\s+(.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_operations_doc_links_resolve():
    text = OPERATIONS_DOC.read_text()
    anchors = github_anchors(text)
    broken = [link for link in re.findall(r"\]\(#([^)]+)\)", text) if link not in anchors]
    assert not broken, f"docs/operations.md links to missing sections: {broken}"
    for path in re.findall(r"`((?:deploy|helm)/[^`*]+)`", text):
        assert (REPO_ROOT / path.split()[0]).exists(), f"docs/operations.md names a missing file {path}"


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS_FILE.read_text())["groups"] for rule in group["rules"]]


def test_alerts_file_is_the_charts_copy():
    assert ALERTS_FILE.resolve() == (REPO_ROOT / "helm" / "quiver" / "files" / "alerts.yml").resolve()


def test_alert_rules_parse_and_have_runbooks():
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    required = {
        "QuiverMetaNoLeader", "QuiverShardWithoutReadySearcher", "QuiverIndexerLeaseChurn",
        "QuiverGcStalled", "QuiverCacheThrash", "QuiverIndexerBackpressure", "QuiverQueryLatencyHigh",
    }
    assert required <= set(names)
    anchors = github_anchors(OPERATIONS_DOC.read_text())
    documented = documented_metrics()
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}
        assert rule["annotations"]["summary"]
        if "for" in rule:
            assert re.fullmatch(r"[0-9]+[smh]", rule["for"])
        try:
            used = metric_names(rule["expr"])
        except ValueError as error:
            pytest.fail(f"{rule['alert']}: {error}")
        undocumented = {base_metric(name, documented) for name in used} - set(documented) - {"up"}
        assert not undocumented, f"{rule['alert']} uses undocumented metrics {undocumented}"
        runbook = rule["annotations"]["runbook"]
        assert runbook == f"docs/operations.md#{rule['alert'].lower()}"
        assert rule["alert"].lower() in anchors, f"no runbook section for {rule['alert']}"


def dashboard_queries(dashboard) -> list[tuple[str, str]]:
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            queries.append((panel["title"], target["expr"]))
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation:
            queries.append((annotation["name"], annotation["expr"]))
    return queries


def test_dashboard_queries_parse_and_use_documented_metrics():
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert {"datasource", "cluster", "namespace"} <= variables
    documented = documented_metrics()
    used_everywhere: set[str] = set()
    for title, query in dashboard_queries(dashboard):
        concrete = (
            query.replace("$__rate_interval", "5m").replace("$cluster", "quiver").replace("$namespace", "default")
        )
        assert "$" not in concrete, f"{title}: unknown variable in {query}"
        try:
            used = {base_metric(name, documented) for name in metric_names(concrete)}
        except ValueError as error:
            pytest.fail(f"panel {title!r}: {error}: {query}")
        undocumented = used - set(documented) - {"up"}
        assert not undocumented, f"panel {title!r} uses undocumented metrics {undocumented}"
        used_everywhere |= used
    titles = {panel["title"] for panel in dashboard["panels"]}
    for wanted in ("Search latency", "Cache hit ratio", "Bytes from object store", "WAL latency",
                   "Unflushed rows by shard", "Flushes and merges", "Leader and term", "Commit lag",
                   "Per-node health"):
        assert wanted in titles
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"


def test_grafana_provisioning_matches_compose(compose):
    grafana = compose["services"]["grafana"]
    provider = yaml.safe_load((DEPLOY_DIR / "grafana" / "provisioning" / "dashboards" / "quiver.yml").read_text())
    dashboard_dir = provider["providers"][0]["options"]["path"]
    assert f"./grafana/quiver.json:{dashboard_dir}/quiver.json:ro" in grafana["volumes"]
    datasource = yaml.safe_load((DEPLOY_DIR / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def rust_metric_names() -> set[str]:
    """Metric names registered by the Rust code in this checkout."""
    names = set()
    for path in list(REPO_ROOT.glob("crates/*/src/metrics.rs")) + list(REPO_ROOT.glob("services/*/src/metrics.rs")):
        names |= set(re.findall(r'"(quiver_[a-z0-9_]*[a-z0-9])"', path.read_text()))
    return names


def test_every_metric_in_the_code_is_documented():
    documented = documented_metrics()
    missing = rust_metric_names() - set(documented)
    assert not missing, f"metrics missing from docs/operations.md: {sorted(missing)}"


def test_dockerfile_builds_a_non_root_runtime_image():
    text = (DEPLOY_DIR / "Dockerfile").read_text()
    # The base images are build arguments: public Debian/Rust images by default,
    # deploy/build-image.sh passes bases made locally from Debian packages.
    assert re.search(r"^ARG RUST_VERSION=1\.95$", text, re.M)
    assert re.search(r"^ARG BUILDER_IMAGE=docker\.io/library/rust:\$\{RUST_VERSION\}-\$\{DEBIAN_RELEASE\}$", text, re.M)
    assert re.search(r"^ARG DEBIAN_IMAGE=docker\.io/library/debian:\$\{DEBIAN_RELEASE\}-slim$", text, re.M)
    assert re.search(r"^FROM \$\{BUILDER_IMAGE\} AS builder$", text, re.M)
    assert re.search(r"^FROM \$\{RUNTIME_IMAGE\} AS runtime$", text, re.M)
    assert "--mount=type=cache" in text and "--locked" in text
    assert re.search(r"^ARG CARGO_PROFILE=release$", text, re.M)
    assert re.search(r"^USER 10001:10001$", text, re.M)
    assert re.search(r'^ENTRYPOINT \["quiver"\]$', text, re.M)
    assert re.search(r"^HEALTHCHECK ", text, re.M)
    assert "org.opencontainers.image.revision" in text
    assert "for binary in quiver quiverctl quiver-bench" in text
    ignore = (DEPLOY_DIR / "Dockerfile.dockerignore").read_text().split()
    assert "**/target" in ignore and ".git" in ignore


def shared_interfaces() -> Path | None:
    candidates = [REPO_ROOT.parent / "shared" / "INTERFACES.md", Path("/work/shared/INTERFACES.md")]
    if os.environ.get("QUIVER_SHARED_DIR"):
        candidates.insert(0, Path(os.environ["QUIVER_SHARED_DIR"]) / "INTERFACES.md")
    return next((path for path in candidates if path.is_file()), None)


def test_contract_lines_are_still_the_shared_contract():
    path = shared_interfaces()
    if path is None:
        pytest.skip("INTERFACES.md is not beside the repository")
    text = path.read_text()
    for role, line in CONTRACT_LINES.items():
        assert line in text, f"INTERFACES.md changed the `quiver {role}` line; update the chart, compose and tests"
