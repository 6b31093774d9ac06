"""The Helm chart, rendered by the real Helm engine and checked against the Kubernetes
schemas and the `quiver` CLI contract, with no cluster."""

from __future__ import annotations

import base64
import json
import os
import re
import stat
import subprocess
import tomllib
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from support import (
    CHART_DIR,
    CLUSTER_TLS_FLAGS,
    REPO_ROOT,
    KUBERNETES_VERSIONS,
    NAMESPACE,
    VALUE_SETS,
    check_role_command,
    container,
    find,
    load_values,
    meta_exec_line,
    objects_of,
    parse_flags,
    render,
    rendered_objects,
)

CUSTOM_RESOURCE_GROUPS = ("monitoring.coreos.com/",)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_lint_is_clean(value_set):
    report = helm.lint(
        CHART_DIR, load_values(value_set), strict=True, namespace=NAMESPACE, kube_version="v1.27.0"
    )
    problems = [message for message in report["messages"] if message["severity"] >= 2]
    assert not problems and not report["errors"], json.dumps(report, indent=2)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_manifest_matches_the_kubernetes_schemas(value_set):
    objects = rendered_objects(value_set)
    assert objects
    for item in objects:
        if item["apiVersion"].startswith(CUSTOM_RESOURCE_GROUPS):
            continue  # no schema ships for CRDs; test_service_monitors checks them
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(item, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(
                    f"{item['kind']}/{item['metadata']['name']} invalid for Kubernetes "
                    f"{version} at {list(error.path)}: {error.message}"
                )


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_names_labels_and_selectors_are_consistent(value_set):
    objects = rendered_objects(value_set)
    names = [(item["kind"], item["metadata"]["name"]) for item in objects]
    assert len(names) == len(set(names)), f"duplicate objects: {names}"
    for item in objects:
        assert item["metadata"]["namespace"] == NAMESPACE, item["metadata"]["name"]
        assert len(item["metadata"]["name"]) <= 63
        spec = item.get("spec", {})
        if "template" in spec:
            selector = spec["selector"]["matchLabels"]
            labels = spec["template"]["metadata"]["labels"]
            assert selector.items() <= labels.items(), item["metadata"]["name"]
    services = {item["metadata"]["name"]: item for item in objects if item["kind"] == "Service"}
    for workload in (item for item in objects if item["kind"] in ("StatefulSet", "Deployment")):
        template = workload["spec"]["template"]
        if workload["kind"] == "StatefulSet":
            governing = services[workload["spec"]["serviceName"]]
            assert governing["spec"]["clusterIP"] == "None"
        port_names = {port["name"] for port in container(workload)["ports"]}
        for probe in ("livenessProbe", "readinessProbe"):
            assert container(workload)[probe]["httpGet"]["port"] in port_names
        # Every Service that selects this workload points at ports it has.
        for service in services.values():
            if service["spec"]["selector"].items() <= template["metadata"]["labels"].items():
                for port in service["spec"]["ports"]:
                    assert port["targetPort"] in port_names, (service["metadata"]["name"], port)
    for budget in (item for item in objects if item["kind"] == "PodDisruptionBudget"):
        selected = [
            workload
            for workload in objects
            if workload["kind"] in ("StatefulSet", "Deployment")
            and budget["spec"]["selector"]["matchLabels"].items()
            <= workload["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(selected) == 1, budget["metadata"]["name"]


def meta_addresses(replicas: int) -> list[str]:
    return [
        f"quiver-meta-{ordinal}.quiver-meta.{NAMESPACE}.svc.cluster.local:7100"
        for ordinal in range(replicas)
    ]


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_meta_gets_node_id_peers_and_init(value_set):
    values = load_values(value_set) or {}
    replicas = values.get("meta", {}).get("replicas", 3)
    meta = find(rendered_objects(value_set), "StatefulSet", "-meta")
    assert meta["spec"]["replicas"] == replicas
    assert meta["spec"]["podManagementPolicy"] == "Parallel"
    assert meta["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert container(meta)["command"] == ["/bin/sh", "-ec"]
    words = meta_exec_line(meta)
    assert words[:2] == ["exec", "quiver"]
    assert words[-1] == "$init_flag"
    flags = check_role_command("meta", words[2:-1])
    assert flags["--node-id"] == "$node_id"
    assert flags["--data-dir"] == "/data"
    assert flags["--listen"] == "0.0.0.0:7100"
    assert flags["--http-listen"] == "0.0.0.0:7101"
    peers = dict(peer.split("=", 1) for peer in flags["--peers"].split(","))
    assert peers == {str(index + 1): address for index, address in enumerate(meta_addresses(replicas))}
    mounts = {mount["name"]: mount["mountPath"] for mount in container(meta)["volumeMounts"]}
    assert mounts["data"] == "/data"
    claim = meta["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "data"
    service = find(rendered_objects(value_set), "Service", "-meta")
    assert service["spec"]["publishNotReadyAddresses"] is True


def run_meta_script(meta, pod_name: str, tmp_path: Path) -> list[str]:
    """Runs the meta container's shell script with a stand-in `quiver` that records
    its arguments, as the container would run it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / f"{pod_name}.args"
    fake = bin_dir / "quiver"
    fake.write_text(f'#!/bin/sh\nfor word in "$@"; do printf "%s\\n" "$word"; done > {record}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    script = container(meta)["args"][0]
    environment = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "POD_NAME": pod_name}
    subprocess.run(["/bin/sh", "-ec", script], env=environment, check=True, timeout=10)
    return record.read_text().splitlines()


def test_meta_script_derives_node_id_and_bootstraps_only_the_initial_voters(tmp_path):
    values = {"meta": {"replicas": 5, "bootstrapVoters": 3}}
    meta = find(objects_of(values), "StatefulSet", "-meta")
    for ordinal in range(5):
        arguments = run_meta_script(meta, f"quiver-meta-{ordinal}", tmp_path)
        flags = check_role_command("meta", arguments)
        assert flags["--node-id"] == str(ordinal + 1)
        assert flags.get("--init", False) is (ordinal < 3), ordinal
        peers = dict(peer.split("=", 1) for peer in flags["--peers"].split(","))
        # The initial voters only; later nodes join through the admin API.
        assert sorted(peers) == ["1", "2", "3"]
        assert flags["--advertise-address"] == meta_addresses(5)[ordinal]
        if ordinal < 3:
            assert peers[str(ordinal + 1)] == flags["--advertise-address"]


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_indexers_get_meta_object_store_listen_and_node_id(value_set):
    values = load_values(value_set) or {}
    indexer = find(rendered_objects(value_set), "StatefulSet", "-indexer")
    flags = check_role_command("indexer", container(indexer)["args"])
    replicas = values.get("meta", {}).get("replicas", 3)
    assert flags["--meta"].split(",") == meta_addresses(replicas)
    store = values.get("objectStore", {})
    expected_url = f"s3://{store.get('bucket', 'quiver')}/{store.get('prefix', 'quiver')}"
    assert flags["--object-store"] == expected_url
    assert flags["--listen"] == "$(POD_IP):7200"
    assert flags["--node-id"] == "$(POD_NAME)"
    assert flags["--http-listen"] == "0.0.0.0:7201"
    environment = {variable["name"]: variable for variable in container(indexer)["env"]}
    assert environment["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert environment["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert environment["AWS_REGION"]["value"] == store.get("region", "us-east-1")
    credentials = store.get("credentials", {}).get("existingSecret")
    if credentials:
        for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert environment[variable]["valueFrom"]["secretKeyRef"]["name"] == credentials
        assert environment["AWS_ENDPOINT_URL"]["value"] == store["endpoint"]
    else:
        assert "AWS_ACCESS_KEY_ID" not in environment


def quantity_bytes(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix, scale in units.items():
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * scale
    return int(text)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_searchers_get_cache_dir_and_size_on_a_volume_that_fits(value_set):
    values = load_values(value_set) or {}
    cache_values = {"size": "8GiB", "volumeType": "emptyDir", **values.get("searcher", {}).get("cache", {})}
    searcher = find(rendered_objects(value_set), "Deployment", "-searcher")
    flags = check_role_command("searcher", container(searcher)["args"])
    assert flags["--cache-size"] == cache_values["size"]
    assert flags["--listen"] == "$(POD_IP):7300"
    assert flags["--node-id"] == "$(POD_NAME)"
    mounts = {mount["name"]: mount["mountPath"] for mount in container(searcher)["volumeMounts"]}
    assert flags["--cache-dir"] == mounts["cache"]
    volume = next(v for v in searcher["spec"]["template"]["spec"]["volumes"] if v["name"] == "cache")
    cache_bytes = quantity_bytes(cache_values["size"].removesuffix("B"))
    if cache_values["volumeType"] == "ephemeral":
        request = volume["ephemeral"]["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"]
        assert quantity_bytes(request) > cache_bytes
    else:
        assert quantity_bytes(volume["emptyDir"]["sizeLimit"]) > cache_bytes
        requests = container(searcher)["resources"]["requests"]
        assert quantity_bytes(requests["ephemeral-storage"]) >= quantity_bytes(volume["emptyDir"]["sizeLimit"])
    readiness = container(searcher)["readinessProbe"]["httpGet"]
    assert readiness["path"] == "/readyz"  # 200 only once the assigned shards are warm
    assert searcher["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_searcher_autoscaling_replaces_the_fixed_replica_count():
    objects = rendered_objects("autoscaling")
    searcher = find(objects, "Deployment", "-searcher")
    assert "replicas" not in searcher["spec"]
    autoscaler = find(objects, "HorizontalPodAutoscaler", "-searcher")
    assert autoscaler["spec"]["scaleTargetRef"]["name"] == searcher["metadata"]["name"]
    assert autoscaler["spec"]["minReplicas"] == 3 and autoscaler["spec"]["maxReplicas"] == 20
    resources = {metric["resource"]["name"] for metric in autoscaler["spec"]["metrics"]}
    assert resources == {"cpu", "memory"}
    assert not [item for item in rendered_objects("default") if item["kind"] == "HorizontalPodAutoscaler"]


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_gateway_gets_meta_and_listen_flags(value_set):
    values = load_values(value_set) or {}
    gateway_values = values.get("gateway", {})
    objects = rendered_objects(value_set)
    gateway = find(objects, "Deployment", "-gateway")
    flags = check_role_command("gateway", container(gateway)["args"])
    assert flags["--http-listen"] == "0.0.0.0:7700"
    assert flags["--grpc-listen"] == "0.0.0.0:7701"
    replicas = values.get("meta", {}).get("replicas", 3)
    assert flags["--meta"].split(",") == meta_addresses(replicas)
    environment = {variable["name"]: variable for variable in container(gateway)["env"]}
    key_variables = {"QUIVER_API_KEYS_READ", "QUIVER_API_KEYS_WRITE", "QUIVER_API_KEYS_ADMIN"}
    if gateway_values.get("auth", {}).get("enabled", True):
        secret_name = gateway_values.get("auth", {}).get("existingSecret") or "quiver-api-keys"
        for variable in key_variables:
            assert environment[variable]["valueFrom"]["secretKeyRef"]["name"] == secret_name
    else:
        assert not key_variables & set(environment)
    scheme = container(gateway)["readinessProbe"]["httpGet"]["scheme"]
    if gateway_values.get("tls", {}).get("enabled"):
        assert scheme == "HTTPS"
        mounts = {mount["name"]: mount["mountPath"] for mount in container(gateway)["volumeMounts"]}
        assert flags["--tls-cert"] == f"{mounts['tls']}/tls.crt"
        assert flags["--tls-key"] == f"{mounts['tls']}/tls.key"
    else:
        assert scheme == "HTTP" and "--tls-cert" not in flags


ROLE_WORKLOADS = {
    "meta": ("StatefulSet", "-meta"),
    "indexer": ("StatefulSet", "-indexer"),
    "searcher": ("Deployment", "-searcher"),
    "gateway": ("Deployment", "-gateway"),
}


def role_command(objects, role: str):
    """A role's workload and the flags of its `quiver <role>` command."""
    kind, suffix = ROLE_WORKLOADS[role]
    workload = find(objects, kind, suffix)
    if role == "meta":
        return workload, check_role_command("meta", meta_exec_line(workload)[2:-1])
    return workload, check_role_command(role, container(workload)["args"])


def test_cluster_tls_mounts_the_secrets_and_passes_the_flags_to_every_role(tmp_path):
    objects = rendered_objects("cluster-tls")
    secrets = {
        "meta": "quiver-meta-cluster-tls",
        "indexer": "quiver-cluster-tls",
        "searcher": "quiver-cluster-tls",
        "gateway": "quiver-cluster-tls",
    }
    for role, secret in secrets.items():
        workload, flags = role_command(objects, role)
        mounts = {mount["name"]: mount for mount in container(workload)["volumeMounts"]}
        directory = mounts["cluster-tls"]["mountPath"]
        assert mounts["cluster-tls"]["readOnly"] is True
        # The file names of a kubernetes.io/tls Secret, as cert-manager writes it.
        assert flags["--cluster-tls-ca"] == f"{directory}/ca.crt", role
        assert flags["--cluster-tls-cert"] == f"{directory}/tls.crt", role
        assert flags["--cluster-tls-key"] == f"{directory}/tls.key", role
        volumes = {volume["name"]: volume for volume in workload["spec"]["template"]["spec"]["volumes"]}
        assert volumes["cluster-tls"]["secret"]["secretName"] == secret, role
        # Probes and metrics stay on the plain HTTP port.
        assert container(workload)["readinessProbe"]["httpGet"]["scheme"] == "HTTP", role
    # The meta script passes them on as it runs.
    meta = find(objects, "StatefulSet", "-meta")
    arguments = run_meta_script(meta, "quiver-meta-1", tmp_path)
    flags = check_role_command("meta", arguments)
    assert CLUSTER_TLS_FLAGS <= set(flags)
    assert flags["--config"] == "/etc/quiver/config.toml"
    # The gateway's client ports keep their own setting.
    _, gateway_flags = role_command(objects, "gateway")
    assert "--tls-cert" not in gateway_flags


@pytest.mark.parametrize("value_set", [name for name in VALUE_SETS if name != "cluster-tls"])
def test_cluster_tls_is_off_unless_enabled(value_set):
    objects = rendered_objects(value_set)
    for role in ROLE_WORKLOADS:
        workload, flags = role_command(objects, role)
        assert not CLUSTER_TLS_FLAGS & set(flags), role
        volumes = {volume["name"] for volume in workload["spec"]["template"]["spec"]["volumes"]}
        assert "cluster-tls" not in volumes, role


def test_generated_api_key_secret_and_explicit_keys():
    secret = find(rendered_objects("default"), "Secret", "-api-keys")
    admin_key = base64.b64decode(secret["data"]["QUIVER_API_KEYS_ADMIN"]).decode()
    assert len(admin_key) == 40 and admin_key.isalnum()
    values = {"gateway": {"auth": {"readKeys": ["r" * 20, "s" * 20], "adminKeys": ["a" * 24]}}}
    secrets = [item for item in objects_of(values) if item["kind"] == "Secret"]
    data = {key: base64.b64decode(value).decode() for key, value in secrets[0]["data"].items()}
    assert data == {
        "QUIVER_API_KEYS_READ": f"{'r' * 20},{'s' * 20}",
        "QUIVER_API_KEYS_WRITE": "",
        "QUIVER_API_KEYS_ADMIN": "a" * 24,
    }


def test_tls_ingress_and_monitoring_objects():
    objects = rendered_objects("tls")
    tls_secret = find(objects, "Secret", "-gateway-tls")
    assert tls_secret["type"] == "kubernetes.io/tls"
    assert base64.b64decode(tls_secret["data"]["tls.crt"]).startswith(b"-----BEGIN CERTIFICATE-----")
    ingress = find(objects, "Ingress", "-gateway")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "quiver-gateway", "port": {"name": "http"}}
    assert ingress["spec"]["tls"][0]["hosts"] == ["vectors.example.org"]
    assert not [item for item in objects if item["kind"] == "Secret" and item["metadata"]["name"].endswith("-api-keys")]


def test_service_monitors_scrape_every_role_on_its_http_port():
    objects = rendered_objects("tls")
    monitors = [item for item in objects if item["kind"] == "ServiceMonitor"]
    assert {item["metadata"]["labels"]["app.kubernetes.io/component"] for item in monitors} == {
        "meta", "indexer", "searcher", "gateway",
    }
    services = [item for item in objects if item["kind"] == "Service"]
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        selected = [
            service
            for service in services
            if monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        ]
        assert len(selected) == 1, monitor["metadata"]["name"]
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics"
        assert endpoint["port"] in {port["name"] for port in selected[0]["spec"]["ports"]}
        role = monitor["metadata"]["labels"]["app.kubernetes.io/component"]
        assert {"targetLabel": "role", "replacement": role} in endpoint["relabelings"]
        assert endpoint.get("scheme", "http") == ("https" if role == "gateway" else "http")
    rule = find(objects, "PrometheusRule", "quiver")
    alerts = {rule["alert"] for group in rule["spec"]["groups"] for rule in group["rules"]}
    assert "QuiverMetaNoLeader" in alerts


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_pods_run_as_non_root_with_a_read_only_root(value_set):
    for workload in rendered_objects(value_set):
        if workload["kind"] not in ("StatefulSet", "Deployment"):
            continue
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        assert pod["automountServiceAccountToken"] is False
        security = container(workload)["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        mounts = {mount["mountPath"] for mount in container(workload)["volumeMounts"]}
        assert "/tmp" in mounts
        # The drain window fits in the grace period Kubernetes gives before SIGKILL.
        arguments = container(workload).get("args", [])
        grace_ms = 10000
        if "--shutdown-grace-ms" in arguments:
            grace_ms = int(arguments[arguments.index("--shutdown-grace-ms") + 1])
        assert pod["terminationGracePeriodSeconds"] * 1000 > grace_ms


def file_section_keys(struct: str) -> set[str]:
    """The keys the binary accepts in a config-file section (fields of `struct`)."""
    source = "\n".join(
        path.read_text() for path in sorted((REPO_ROOT / "services" / "quiver" / "src").glob("*.rs"))
    )
    body = source.split(f"pub struct {struct} {{", 1)[1].split("\n}", 1)[0]
    return set(re.findall(r"pub (\w+): Option<", body))


def gateway_file_keys() -> set[str]:
    """The keys the binary accepts in `[gateway]` (fields of GatewayFileConfig)."""
    return file_section_keys("GatewayFileConfig")


def test_searcher_config_reaches_the_searcher_as_its_section():
    settings = {"heartbeat_interval_ms": 500, "safety_poll_interval_ms": 30000}
    objects = objects_of({"searcher": {"config": settings}})
    config_map = find(objects, "ConfigMap", "-searcher-config")
    parsed = tomllib.loads(config_map["data"]["config.toml"])
    assert parsed == {"searcher": settings}
    assert set(settings) <= file_section_keys("SearcherFileConfig"), "unknown keys fail its start"
    searcher = find(objects, "Deployment", "-searcher")
    flags = check_role_command("searcher", container(searcher)["args"])
    assert flags["--config"] == "/etc/quiver/config.toml"


def test_gateway_config_reaches_the_gateway_as_its_section():
    settings = {"max_k": 500, "max_request_bytes": "64MiB", "request_timeout_ms": 20000}
    objects = objects_of({"gateway": {"config": settings}})
    config_map = find(objects, "ConfigMap", "-gateway-config")
    parsed = tomllib.loads(config_map["data"]["config.toml"])
    assert parsed == {"gateway": settings}
    assert set(settings) <= gateway_file_keys(), "keys the binary does not know fail its start"
    gateway = find(objects, "Deployment", "-gateway")
    flags = check_role_command("gateway", container(gateway)["args"])
    assert flags["--config"] == "/etc/quiver/config.toml"
    mounts = {mount["name"]: mount["mountPath"] for mount in container(gateway)["volumeMounts"]}
    assert mounts["config"] == "/etc/quiver"


def test_ha_spreads_pods_and_passes_config_files():
    objects = rendered_objects("ha")
    meta = find(objects, "StatefulSet", "-meta")
    pod = meta["spec"]["template"]["spec"]
    required = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required[0]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "meta"
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "meta"
    assert pod["priorityClassName"] == "system-cluster-critical"
    flags = parse_flags(meta_exec_line(meta)[3:-1])
    assert flags["--config"] == "/etc/quiver/config.toml"
    config_map = find(objects, "ConfigMap", "-meta-config")
    text = config_map["data"]["config.toml"]
    assert "[meta]" in text and "election_timeout_min_ms = 1500" in text
    mounts = {mount["name"]: mount["mountPath"] for mount in container(meta)["volumeMounts"]}
    assert mounts["config"] == "/etc/quiver"
    budget = find(objects, "PodDisruptionBudget", "-searcher")
    assert budget["spec"]["maxUnavailable"] == "25%"
    searcher = find(objects, "Deployment", "-searcher")
    assert searcher["spec"]["template"]["spec"]["tolerations"][0]["value"] == "quiver"


BAD_VALUES = [
    pytest.param({"meta": {"replicas": "three"}}, "/meta/replicas", id="replicas-as-a-word"),
    pytest.param({"meta": {"replicas": 4}}, "/meta/replicas", id="even-meta-voters"),
    pytest.param({"colour": "blue"}, "colour", id="unknown-top-level-key"),
    pytest.param({"searcher": {"cacheSize": "8GiB"}}, "cacheSize", id="unknown-role-key"),
    pytest.param({"searcher": {"cache": {"size": "8 gigabytes"}}}, "/searcher/cache/size", id="bad-size"),
    pytest.param({"logFormat": "yaml"}, "/logFormat", id="bad-log-format"),
    pytest.param({"gateway": {"service": {"type": "Ingress"}}}, "/gateway/service/type", id="bad-service-type"),
    pytest.param({"objectStore": {"bucket": ""}}, "/objectStore/bucket", id="empty-bucket"),
    pytest.param({"objectStore": {"endpoint": "minio:9000"}}, "/objectStore/endpoint", id="endpoint-without-scheme"),
    pytest.param({"indexer": {"replicas": 0}}, "/indexer/replicas", id="no-indexers"),
    pytest.param({"gateway": {"auth": {"adminKeys": ["short"]}}}, "/gateway/auth/adminKeys", id="short-api-key"),
    pytest.param({"searcher": {"autoscaling": {"enabled": "yes"}}}, "/searcher/autoscaling/enabled", id="string-bool"),
    pytest.param({"meta": {"resources": {"requests": {"cpu": "lots"}}}}, "/meta/resources", id="bad-quantity"),
    pytest.param({"clusterTls": {"enabled": "yes"}}, "/clusterTls/enabled", id="cluster-tls-string-bool"),
    pytest.param(
        {"clusterTls": {"enabled": True, "secretName": "s", "roleSecretNames": {"web": "w"}}},
        "web",
        id="cluster-tls-unknown-role",
    ),
]


@pytest.mark.parametrize("values, where", BAD_VALUES)
def test_bad_values_fail_the_schema(values, where):
    with helm.Chart.load(CHART_DIR) as loaded:
        with pytest.raises(helm.HelmValuesError) as raised:
            loaded.validate_schema(values)
        assert where in str(raised.value)
        with pytest.raises(helm.HelmValuesError):
            loaded.render(values=values, name="quiver", namespace=NAMESPACE)


CROSS_FIELD_ERRORS = [
    pytest.param({"meta": {"replicas": 3, "bootstrapVoters": 5}}, "bootstrapVoters", id="more-bootstrap-voters-than-pods"),
    pytest.param({"gateway": {"tls": {"enabled": True}}}, "gateway.tls", id="tls-without-certificate"),
    pytest.param(
        {"searcher": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}},
        "minReplicas",
        id="autoscaling-min-above-max",
    ),
    pytest.param({"searcher": {"cache": {"volumeType": "ephemeral", "medium": "Memory"}}}, "Memory", id="memory-medium-on-pvc"),
    pytest.param({"clusterTls": {"enabled": True}}, "clusterTls.secretName", id="cluster-tls-without-secret"),
    pytest.param(
        {"clusterTls": {"enabled": True, "roleSecretNames": {"meta": "m", "indexer": "i", "searcher": "s"}}},
        "clusterTls.roleSecretNames.gateway",
        id="cluster-tls-without-a-role-secret",
    ),
]


@pytest.mark.parametrize("values, message", CROSS_FIELD_ERRORS)
def test_inconsistent_values_fail_rendering(values, message):
    with pytest.raises(helm.HelmRenderError) as raised:
        render(values)
    assert message in str(raised.value)


def test_documented_values_match_values_yaml():
    """README.md's tables list every value of values.yaml: leaves, or maps/lists listed
    whole; keys every role shares are listed once as `<role>.key`."""
    readme = (CHART_DIR / "README.md").read_text()
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    roles = ("meta", "indexer", "searcher", "gateway")

    def documented(path: str) -> bool:
        head, _, rest = path.partition(".")
        return f"`{path}`" in readme or (head in roles and f"`<role>.{rest}`" in readme)

    def leaves(tree, prefix=""):
        for key, value in tree.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value and not documented(path):
                yield from leaves(value, f"{path}.")
            else:
                yield path

    missing = [path for path in leaves(defaults) if not documented(path)]
    assert not missing, f"values missing from README.md: {missing}"
