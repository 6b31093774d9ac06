"""The `helm test` hook (templates/tests/test-search.yaml): rendered as a test Pod
that targets the release's gateway Service with the admin key, and its script run
against a stand-in `curl` that plays the gateway."""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from support import CHART_DIR, NAMESPACE, VALUE_SETS, find, load_values, objects_of, rendered_objects

HOOK_SUFFIX = "-test-search"


def hook_pod(objects) -> dict[str, Any]:
    return find(objects, "Pod", HOOK_SUFFIX)


def environment_of(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (container,) = pod["spec"]["containers"]
    return {variable["name"]: variable for variable in container.get("env", [])}


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_test_pod_is_a_hook_against_the_release_gateway(value_set):
    values = load_values(value_set) or {}
    gateway_values = values.get("gateway", {})
    objects = rendered_objects(value_set)
    pod = hook_pod(objects)
    annotations = pod["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "test"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert pod["spec"]["restartPolicy"] == "Never"

    # It talks to the release's gateway Service, on the Service's REST port.
    service = find(objects, "Service", "-gateway")
    (http_port,) = [port["port"] for port in service["spec"]["ports"] if port["name"] == "http"]
    assert http_port == gateway_values.get("service", {}).get("httpPort", 7700)
    scheme = "https" if gateway_values.get("tls", {}).get("enabled") else "http"
    environment = environment_of(pod)
    host = f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    assert environment["QUIVER_URL"]["value"] == f"{scheme}://{host}:{http_port}"
    assert environment["QUIVER_COLLECTION"]["value"].startswith("helm-test-")

    # With API keys on, it sends the admin key from the Secret the gateway reads.
    auth = gateway_values.get("auth", {})
    if auth.get("enabled", True):
        secret_name = auth.get("existingSecret") or "quiver-api-keys"
        reference = environment["QUIVER_API_KEY"]["valueFrom"]["secretKeyRef"]
        assert reference["name"] == secret_name
        assert reference["key"] == "QUIVER_API_KEYS_ADMIN"
        assert environment["QUIVER_AUTH"]["value"] == "true"
        if not auth.get("existingSecret"):
            find(objects, "Secret", "-api-keys")  # the chart creates that Secret
    else:
        assert "QUIVER_API_KEY" not in environment
        assert environment["QUIVER_AUTH"]["value"] == "false"

    if scheme == "https":
        mounts = {mount["name"]: mount["mountPath"] for mount in pod["spec"]["containers"][0]["volumeMounts"]}
        volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
        assert environment["QUIVER_TLS_DIR"]["value"] == mounts["tls"]
        assert volumes["tls"]["secret"]["secretName"] == "quiver-gateway-tls"


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_test_pod_is_locked_down_and_bounded(value_set):
    pod = hook_pod(rendered_objects(value_set))
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec  # not the chart's (workload identity)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]
    assert "/tmp" in {mount["mountPath"] for mount in container["volumeMounts"]}
    assert spec["activeDeadlineSeconds"] > 0
    repository, _, tag = container["image"].rpartition(":")
    assert repository == "curlimages/curl" and tag and tag != "latest"
    assert container["command"] == ["/bin/sh", "-ec"]


def test_test_pod_follows_names_ports_keys_and_image_values():
    values = {
        "fullnameOverride": "vectors-prod",
        "clusterDomain": "k8s.example",
        "gateway": {
            "service": {"httpPort": 8080},
            "auth": {"existingSecret": "external-keys"},
            "tls": {"enabled": True, "secretName": "gateway-cert"},
        },
        "tests": {
            "image": {"repository": "mirror.example/curl", "digest": "sha256:" + "a" * 64},
            "insecureSkipTLSVerify": True,
        },
    }
    pod = hook_pod(objects_of(values))
    assert pod["metadata"]["name"] == "vectors-prod-test-search"
    environment = environment_of(pod)
    assert environment["QUIVER_URL"]["value"] == "https://vectors-prod-gateway.vectors.svc.k8s.example:8080"
    assert environment["QUIVER_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "external-keys"
    assert environment["QUIVER_INSECURE"]["value"] == "true"
    assert "QUIVER_TLS_DIR" not in environment
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "mirror.example/curl@sha256:" + "a" * 64


def test_test_pod_is_not_rendered_when_disabled():
    objects = objects_of({"tests": {"enabled": False}})
    assert not [item for item in objects if item["kind"] == "Pod"]
    assert not [item for item in objects if "helm.sh/hook" in item["metadata"].get("annotations", {})]


# A stand-in `curl` that plays the gateway's REST API: it keeps collections in a JSON
# file, logs every request, and misbehaves as FAKE_MODE says.
FAKE_CURL = r'''
import json, math, os, sys
from urllib.parse import urlsplit

arguments = sys.argv[1:]
options, headers, url = {}, [], None
index = 0
while index < len(arguments):
    word = arguments[index]
    if word in ("--silent", "--show-error", "--insecure"):
        options[word] = True
        index += 1
    elif word in ("--max-time", "--request", "--output", "--write-out", "--data", "--cacert"):
        options[word] = arguments[index + 1]
        index += 2
    elif word == "--header":
        value = arguments[index + 1]
        if value.startswith("@"):
            with open(value[1:]) as lines:
                headers += [line.rstrip("\n") for line in lines if line.strip()]
        else:
            headers.append(value)
        index += 2
    elif word.startswith("-"):
        sys.exit(f"fake curl: unexpected option {word}")
    else:
        assert url is None, arguments
        url = word
        index += 1

state_file = os.environ["FAKE_STATE"]
state = json.load(open(state_file)) if os.path.exists(state_file) else {"collections": {}, "calls": 0}
state["calls"] += 1
mode = os.environ.get("FAKE_MODE", "ok")
method = options.get("--request", "GET")
path = urlsplit(url).path
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({"method": method, "url": url, "headers": headers,
                          "data": options.get("--data"), "cacert": options.get("--cacert"),
                          "insecure": "--insecure" in options}) + "\n")

def answer(status, body):
    json.dump(state, open(state_file, "w"))
    with open(options["--output"], "w") as out:
        out.write(json.dumps(body, separators=(",", ":")))
    assert options["--write-out"] == "%{http_code}"
    sys.stdout.write(str(status))
    sys.exit(0)

if mode == "down":
    json.dump(state, open(state_file, "w"))
    sys.stdout.write("000")
    sys.stderr.write("curl: (7) Failed to connect\n")
    sys.exit(7)
if mode == "unavailable-twice" and state["calls"] <= 2:
    answer(503, {"error": {"code": "UNAVAILABLE", "message": "no leader"}})
expected_key = os.environ.get("FAKE_KEY")
if expected_key and f"Authorization: Bearer {expected_key}" not in headers:
    answer(401, {"error": {"code": "UNAUTHENTICATED", "message": "bad key"}})
if options.get("--data") is not None:
    assert "Content-Type: application/json" in headers
    body = json.loads(options["--data"])
parts = path.strip("/").split("/")
assert parts[:2] == ["v1", "collections"], path
name = parts[2]
collections = state["collections"]
if method == "PUT" and len(parts) == 3:
    assert body == {"dimension": 4, "metric": "cosine"}, body
    collections.setdefault(name, {"points": {}})
    answer(200, {"name": name, "collection_id": 7, "dimension": 4, "metric": "cosine"})
if name not in collections:
    answer(404, {"error": {"code": "NOT_FOUND", "message": f"collection {name}"}})
if method == "DELETE" and len(parts) == 3:
    del collections[name]
    answer(200, {"name": name, "dropped": True})
if method == "POST" and parts[3:] == ["points"]:
    for point in body["points"]:
        assert len(point["vector"]) == 4
        collections[name]["points"][str(point["id"])] = point["vector"]
    answer(200, {"sequence": 1})
if method == "POST" and parts[3:] == ["search"]:
    assert body["k"] == 1 and body["consistency"] == "strong", body
    def cosine(a, b):
        return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    scored = sorted(((cosine(body["vector"], vector), int(key)) for key, vector in collections[name]["points"].items()), reverse=True)
    if mode == "wrong-top":
        scored.reverse()
    hits = [{"id": key, "score": score} for score, key in scored[: body["k"]]]
    answer(200, {"hits": hits, "took_ms": 0.4, "cost": {"segments": 1, "search_ms": 0.1}})
answer(405, {"error": {"code": "INVALID_ARGUMENT", "message": "method"}})
'''


def run_hook_script(
    pod: dict[str, Any],
    tmp_path: Path,
    *,
    mode: str = "ok",
    api_key: str | None = None,
    gateway_key: str | None = None,
) -> tuple[subprocess.CompletedProcess, list[dict[str, Any]], dict[str, Any]]:
    """Runs the test Pod's script as the container would, with its rendered environment,
    against the stand-in curl; returns the process, the request log and the final state."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "curl"
    fake.write_text(f"#!{sys.executable}\n{FAKE_CURL}")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    (container,) = pod["spec"]["containers"]
    environment = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "TMPDIR": str(scratch),
        "QUIVER_RETRY_DELAY": "0",
        "QUIVER_ATTEMPTS": "3",
        "FAKE_STATE": str(tmp_path / "state.json"),
        "FAKE_LOG": str(tmp_path / "requests.log"),
        "FAKE_MODE": mode,
    }
    if gateway_key:
        environment["FAKE_KEY"] = gateway_key
    for name, variable in environment_of(pod).items():
        if "value" in variable:
            environment[name] = variable["value"]
        elif name == "QUIVER_API_KEY" and api_key is not None:
            environment[name] = api_key  # what the kubelet takes from the Secret
    process = subprocess.run(
        container["command"] + container["args"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    log_file = tmp_path / "requests.log"
    requests = [json.loads(line) for line in log_file.read_text().splitlines()] if log_file.exists() else []
    state_file = tmp_path / "state.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {"collections": {}}
    return process, requests, state


def test_script_creates_upserts_searches_and_drops_with_the_admin_key(tmp_path):
    admin = "a" * 24
    values = {"gateway": {"auth": {"adminKeys": [admin, "b" * 24], "readKeys": ["r" * 20]}}}
    pod = hook_pod(objects_of(values))
    process, requests, state = run_hook_script(
        pod, tmp_path, api_key=f"{admin},{'b' * 24}", gateway_key=admin
    )
    assert process.returncode == 0, process.stdout + process.stderr
    assert "PASS" in process.stdout
    base = f"http://quiver-gateway.{NAMESPACE}.svc.cluster.local:7700/v1/collections/helm-test-1"
    assert [(request["method"], request["url"]) for request in requests] == [
        ("PUT", base),
        ("POST", f"{base}/points"),
        ("POST", f"{base}/search"),
        ("DELETE", base),
    ]
    assert all(f"Authorization: Bearer {admin}" in request["headers"] for request in requests)
    search = json.loads(requests[2]["data"])
    assert search["vector"] == [0, 0, 1, 0]
    assert state["collections"] == {}  # dropped


def test_script_without_auth_sends_no_key_and_retries_while_unavailable(tmp_path):
    pod = hook_pod(rendered_objects("minimal"))  # gateway.auth.enabled=false
    process, requests, state = run_hook_script(pod, tmp_path, mode="unavailable-twice")
    assert process.returncode == 0, process.stdout + process.stderr
    assert "HTTP 503, retrying" in process.stderr
    assert [request["method"] for request in requests] == ["PUT", "PUT", "PUT", "POST", "POST", "DELETE"]
    assert not any(header.startswith("Authorization") for request in requests for header in request["headers"])
    assert state["collections"] == {}


def test_script_fails_and_drops_the_collection_when_the_top_hit_is_wrong(tmp_path):
    pod = hook_pod(rendered_objects("minimal"))
    process, requests, state = run_hook_script(pod, tmp_path, mode="wrong-top")
    assert process.returncode != 0
    assert "FAIL: a strong search for the vector of point 3 answered top hit" in process.stderr
    assert "PASS" not in process.stdout
    assert requests[-1]["method"] == "DELETE"
    assert state["collections"] == {}


def test_script_fails_on_a_rejected_key_and_without_an_admin_key(tmp_path):
    pod = hook_pod(rendered_objects("default"))
    process, requests, _ = run_hook_script(pod, tmp_path / "wrong", api_key="x" * 40, gateway_key="y" * 40)
    assert process.returncode != 0
    assert "FAIL: create collection: HTTP 401" in process.stderr
    assert len(requests) == 1  # 401 is not retried, and nothing was created to drop

    process, requests, _ = run_hook_script(pod, tmp_path / "none", api_key="")
    assert process.returncode != 0
    assert "no admin API key in QUIVER_API_KEYS_ADMIN of Secret quiver-api-keys" in process.stderr
    assert requests == []


def test_script_fails_when_the_gateway_stays_unreachable(tmp_path):
    pod = hook_pod(rendered_objects("minimal"))
    process, requests, _ = run_hook_script(pod, tmp_path, mode="down")
    assert process.returncode != 0
    assert "FAIL: create collection: HTTP 000" in process.stderr
    assert len(requests) == 3  # QUIVER_ATTEMPTS


def test_script_verifies_tls_against_the_secret(tmp_path):
    pod = copy.deepcopy(hook_pod(rendered_objects("tls")))  # the rendering is cached
    environment = environment_of(pod)
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    (tls_dir / "tls.crt").write_text("certificate")
    pod["spec"]["containers"][0]["env"] = [
        {"name": "QUIVER_TLS_DIR", "value": str(tls_dir)} if variable["name"] == "QUIVER_TLS_DIR" else variable
        for variable in pod["spec"]["containers"][0]["env"]
    ]
    assert environment["QUIVER_URL"]["value"].startswith("https://")
    process, requests, _ = run_hook_script(pod, tmp_path / "self-signed", api_key="k" * 20)
    assert process.returncode == 0, process.stderr
    assert {request["cacert"] for request in requests} == {str(tls_dir / "tls.crt")}
    assert not any(request["insecure"] for request in requests)
    (tls_dir / "ca.crt").write_text("ca")
    process, requests, _ = run_hook_script(pod, tmp_path / "with-ca", api_key="k" * 20)
    assert process.returncode == 0, process.stderr
    assert {request["cacert"] for request in requests} == {str(tls_dir / "ca.crt")}


@pytest.mark.parametrize(
    "values, where",
    [
        pytest.param({"tests": {"enabled": "yes"}}, "/tests/enabled", id="string-bool"),
        pytest.param({"tests": {"image": {"tag": "8.12.1", "registry": "x"}}}, "registry", id="unknown-image-key"),
        pytest.param({"tests": {"timeout": 30}}, "timeout", id="unknown-key"),
        pytest.param({"tests": {"resources": {"limits": {"memory": "lots"}}}}, "/tests/resources", id="bad-quantity"),
    ],
)
def test_bad_test_values_fail_the_schema(values, where):
    with helm.Chart.load(CHART_DIR) as loaded:
        with pytest.raises(helm.HelmValuesError) as raised:
            loaded.validate_schema(values)
        assert where in str(raised.value)
