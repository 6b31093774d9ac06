"""deploy/docker-compose.tls.yml: the override that turns on mutual TLS between the
roles of deploy/docker-compose.yml, merged as `docker compose -f … -f …` merges it
(environment maps key by key, volumes by target), checked without Docker."""

from __future__ import annotations

import re

import yaml
from compose_spec import PyCompose

from support import DEPLOY_DIR, OPERATIONS_DOC

BASE_FILE = DEPLOY_DIR / "docker-compose.yml"
OVERRIDE_FILE = DEPLOY_DIR / "docker-compose.tls.yml"
ROLES = ("meta", "indexer", "searcher", "gateway")
TLS_DIRECTORY = "/etc/quiver/cluster-tls"
VARIABLES = {
    "QUIVER_CLUSTER_TLS_CA": f"{TLS_DIRECTORY}/ca.crt",
    "QUIVER_CLUSTER_TLS_CERT": f"{TLS_DIRECTORY}/tls.crt",
    "QUIVER_CLUSTER_TLS_KEY": f"{TLS_DIRECTORY}/tls.key",
}


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data):
        return True


def load(path):
    """The file after compose's `${VAR:-default}` interpolation with the defaults."""
    text = path.read_text()
    uncommented = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"\$\{[A-Z0-9_]+\}", uncommented), f"{path.name}: every variable needs a default"
    return yaml.safe_load(re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", text))


def environment_map(environment) -> dict[str, str]:
    if isinstance(environment, list):
        return dict(item.split("=", 1) for item in environment)
    return dict(environment or {})


def merged() -> dict:
    """The base file with the override applied as compose applies it."""
    base = load(BASE_FILE)
    override = load(OVERRIDE_FILE)
    for name, changes in override["services"].items():
        service = base["services"][name]
        for key, value in changes.items():
            if key == "environment":
                service["environment"] = {**environment_map(service.get("environment")), **environment_map(value)}
            elif key == "volumes":
                targets = {volume.split(":")[1]: volume for volume in service.get("volumes", [])}
                targets.update({volume.split(":")[1]: volume for volume in value})
                service["volumes"] = list(targets.values())
            else:
                service[key] = value
    return base


def quiver_services(compose: dict) -> dict[str, str]:
    """Quiver services of a compose file: {service name: role}."""
    return {
        name: service["command"][0]
        for name, service in compose["services"].items()
        if service.get("build", {}).get("dockerfile") == "deploy/Dockerfile"
    }


def test_the_override_covers_every_quiver_service_and_nothing_else():
    override = load(OVERRIDE_FILE)
    base_services = quiver_services(load(BASE_FILE))
    assert set(override["services"]) == set(base_services)
    assert set(base_services.values()) == set(ROLES)
    for name, changes in override["services"].items():
        assert set(changes) == {"environment", "volumes"}, name


def test_merged_file_gives_every_role_the_tls_files_and_keeps_the_rest():
    compose = merged()
    PyCompose.from_yaml(yaml.dump(compose, Dumper=_NoAliases, sort_keys=False))
    base = load(BASE_FILE)
    for name in quiver_services(compose):
        service = compose["services"][name]
        environment = environment_map(service["environment"])
        assert {key: environment[key] for key in VARIABLES} == VARIABLES, name
        # What the base file set is still there (S3 settings, log level).
        assert environment_map(base["services"][name].get("environment")).items() <= environment.items(), name
        mounts = [volume for volume in service["volumes"] if volume.split(":")[1] == TLS_DIRECTORY]
        assert len(mounts) == 1, name
        source, _, mode = mounts[0].split(":")
        assert source == "./cluster-tls" and mode == "ro", mounts
        for volume in base["services"][name].get("volumes", []):
            assert volume in service["volumes"], f"{name} lost {volume}"
        # The healthchecks stay on the plain HTTP port.
        assert "http://127.0.0.1:" in " ".join(service["healthcheck"]["test"]), name


def test_operations_doc_explains_the_override():
    text = OPERATIONS_DOC.read_text()
    assert "docker-compose.tls.yml" in text
    assert "QUIVER_CLUSTER_TLS_DIR" in text
