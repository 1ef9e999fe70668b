"""compose.yaml as a deployment, checked without a Docker engine (none runs here): against the
Compose Specification's JSON schema (tests/fixtures/compose_spec.json, the compose_spec.json that
docker-compose 1.29.2 ships, Apache-2.0), and against the engine itself: every engine service runs
a real `context-engine` command, is given only settings the engine has, and waits for what it
needs."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from context_engine.config import ENV_PREFIX, Settings
from tests.fixtures.compose import _compose, _substituted

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = pathlib.Path(__file__).parents[1] / "fixtures" / "compose_spec.json"
SECRETS = {"KAFKA_PASSWORD": "k", "POSTGRES_PASSWORD": "p", "DETECTOR_TOKEN": "t"}
ENGINE = ("migrate", "worker", "api", "detector")


@pytest.fixture(scope="module")
def compose() -> dict:
    return _compose(SECRETS)


def test_compose_yaml_is_valid_compose(compose):
    validator = jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose)]
    assert errors == []


def test_each_part_of_the_engine_is_its_own_service_and_command(compose):
    services = compose["services"]
    commands = {name: services[name]["command"] for name in ENGINE}
    assert commands == {"migrate": ["context-engine", "migrate"], "worker": ["context-engine", "worker"],
                        "api": ["context-engine", "serve", "api"], "detector": ["context-engine", "serve", "detector"]}
    for name, command in commands.items():  # each is a command the installed engine has
        ran = subprocess.run([sys.executable, "-m", "context_engine", *command[1:], "--help"],
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, (name, ran.stderr)
    assert services["worker"]["deploy"]["replicas"] >= 2 and services["api"]["deploy"]["replicas"] >= 2
    assert "ports" not in services["api"]  # replicas are reached through the gateway's one port
    assert services["api-gateway"]["ports"] == ["50051:50051"]


def test_the_schema_is_migrated_once_before_anything_uses_it(compose):
    services = compose["services"]
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in ("worker", "api"):
        assert services[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
        assert services[name]["depends_on"]["redpanda"] == {"condition": "service_healthy"}
    assert services["api-gateway"]["depends_on"] == {"api": {"condition": "service_healthy"}}


def test_engine_services_are_given_only_settings_the_engine_has(compose):
    known = {f"{ENV_PREFIX}{name}".upper() for name in Settings.model_fields}
    for name in ENGINE:
        given = set(compose["services"][name]["environment"])
        assert given <= known, (name, given - known)


def test_the_detector_gets_no_credential_of_the_database_or_the_broker(compose):
    detector, api = compose["services"]["detector"]["environment"], compose["services"]["api"]["environment"]
    assert not [k for k in detector if "DATABASE" in k or "KAFKA" in k]
    assert detector["CONTEXT_ENGINE_DETECTOR_SERVICE_TOKEN"] == api["CONTEXT_ENGINE_DETECTOR_SERVICE_TOKEN"] == "t"
    assert api["CONTEXT_ENGINE_DETECTOR_HOST"] == "detector" and detector["CONTEXT_ENGINE_DETECTOR_HOST"] == "0.0.0.0"
    # every API and worker replica signs and verifies the log with the same keyring, in one volume
    assert all("engine-keys:/data/keys" in compose["services"][n]["volumes"] for n in ("migrate", "worker", "api"))
    assert "volumes" not in compose["services"]["detector"] or \
        "engine-keys:/data/keys" not in compose["services"]["detector"]["volumes"]


def test_the_gateway_config_balances_grpc_to_the_api_service():
    conf = (pathlib.Path(__file__).parents[2] / "deploy" / "nginx-grpc.conf").read_text()
    assert "server api:50051 resolve;" in conf and "grpc_pass grpc://context_engine_api;" in conf
    assert "http2 on;" in conf
    # `resolve` (the replicas' addresses looked up again, not once at start) needs a resolver, a
    # shared-memory zone and nginx 1.27.3 or later
    assert "resolver 127.0.0.11 " in conf and "zone context_engine_api " in conf


def test_the_gateway_image_can_re_resolve_the_replicas(compose):
    image = compose["services"]["api-gateway"]["image"]
    name, _, tag = image.partition(":")
    assert name == "nginx" and tuple(int(n) for n in tag.split(".")) >= (1, 27, 3), image


def merged(base: dict, override: dict) -> dict:
    """`docker compose -f base -f override`: mappings merge key by key, other values are replaced."""
    out = dict(base)
    for key, value in override.items():
        out[key] = merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def test_the_three_broker_cluster_file(compose):
    import yaml

    override = _substituted(yaml.safe_load((pathlib.Path(__file__).parents[2] / "compose.kafka-cluster.yaml")
                                           .read_text()), SECRETS)
    validator = jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))
    cluster = merged(compose, override)
    assert [e.message for e in validator.iter_errors(override)] == []
    assert [e.message for e in validator.iter_errors(cluster)] == []
    brokers = [n for n in cluster["services"] if n.startswith("redpanda")]
    assert len(brokers) == 3
    for name in brokers:
        command = cluster["services"][name]["command"]
        assert f"--advertise-kafka-addr SASL://{name}:9092" in command and "enable_sasl=true" in command
        assert cluster["services"][name]["environment"]["RP_BOOTSTRAP_USER"] == \
            compose["services"]["redpanda"]["environment"]["RP_BOOTSTRAP_USER"]
    for name in ("migrate", "worker", "api"):
        env = cluster["services"][name]["environment"]
        assert env["CONTEXT_ENGINE_KAFKA_BOOTSTRAP"].split(",") == [f"{b}:9092" for b in brokers]
        assert env["CONTEXT_ENGINE_KAFKA_SASL_PASSWORD"] == "k"  # compose.yaml's settings kept
        assert Settings(**{"topic_replication_factor": int(env["CONTEXT_ENGINE_TOPIC_REPLICATION_FACTOR"])}) \
            .topic_replication_factor == 3
