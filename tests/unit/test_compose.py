"""compose/docker-compose.yml: the stack an operator gets from Docker.

No Docker engine here: the file is validated against the Compose
specification's JSON schema (the copy vendored by check-jsonschema) and
checked for what dimple relies on.
"""

from __future__ import annotations

import copy
import importlib.resources
import json
from pathlib import Path

import jsonschema
import yaml

from workers.app import QUEUES
from workers.settings import WorkerSettings

COMPOSE = Path(__file__).resolve().parents[2] / "compose" / "docker-compose.yml"


def _doc():
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def _compose_validator():
    text = (importlib.resources.files("check_jsonschema") / "builtin_schemas" / "vendor"
            / "compose-spec.json").read_text(encoding="utf-8")
    schema = json.loads(text)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def test_compose_file_is_valid_against_the_compose_specification():
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in _compose_validator().iter_errors(_doc())]
    assert errors == []


def test_the_schema_check_rejects_what_compose_would_reject():
    # the validator is live: a misspelt key and a wrongly typed field fail it
    doc = copy.deepcopy(_doc())
    doc["services"]["redis"]["restart_policy"] = "always"
    doc["services"]["flower"]["ports"] = "5555"
    paths = {"/".join(map(str, e.absolute_path)) for e in _compose_validator().iter_errors(doc)}
    assert "services/redis" in paths and "services/flower/ports" in paths


def test_one_worker_per_queue_sharing_one_data_volume():
    services = _doc()["services"]
    queues = {}
    for name, svc in services.items():
        cmd = svc.get("command", [])
        if cmd[:2] == ["dimple", "worker"]:
            queues[cmd[cmd.index("--queues") + 1]] = name
            assert "dimple-data:/data" in svc["volumes"]
            assert svc["environment"]["DIMPLE_DATA_DIR"] == "/data"
            assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
    assert sorted(queues) == sorted(QUEUES)
    # the audit writer stays single; the ingest worker has two processes: writes
    # (serialised by WRITE.lock) and a background compaction side by side
    for queue, processes in (("audit", "1"), ("ingest", "2")):
        cmd = services[queues[queue]]["command"]
        assert cmd[cmd.index("--concurrency") + 1] == processes


def test_every_service_has_a_health_check():
    for name, svc in _doc()["services"].items():
        if name == "cli":  # run once per command (`docker compose run --rm cli ...`), never up
            assert svc["healthcheck"] == {"disable": True} and svc["profiles"] == ["cli"]
            continue
        assert "healthcheck" in svc and svc["healthcheck"]["test"], name


def test_the_cli_service_reaches_the_stack_and_reads_input_files():
    """The README's way in: `docker compose run --rm cli dimple ingest FILE --via-broker`."""
    doc = _doc()
    cli, worker = doc["services"]["cli"], doc["services"]["worker-ingest"]
    assert cli["environment"]["DIMPLE_BROKER_URL"] == worker["environment"]["DIMPLE_BROKER_URL"]
    assert cli["environment"]["DIMPLE_DATA_DIR"] == "/data" and "dimple-data:/data" in cli["volumes"]
    inputs = [v for v in cli["volumes"] if v.endswith(":/input:ro")]
    assert inputs and cli["working_dir"] == "/input"
    assert cli["command"][0] == "dimple"


def test_redis_is_a_broker_without_persistence_or_eviction_and_with_a_password():
    cmd = " ".join(_doc()["services"]["redis"]["command"])
    assert "--maxmemory-policy noeviction" in cmd
    assert '--save ' in cmd and "--appendonly no" in cmd
    assert "--requirepass" in cmd


def test_flower_has_auth_and_stays_on_loopback():
    flower = _doc()["services"]["flower"]
    env = flower["environment"]
    assert env["DIMPLE_FLOWER_PASSWORD"].startswith("${DIMPLE_FLOWER_PASSWORD:?")  # required, no default
    assert all(p.startswith("127.0.0.1:") for p in flower["ports"])


def test_environment_names_are_real_settings():
    fields = {f"DIMPLE_{name.upper()}" for name in WorkerSettings.model_fields}
    for name, svc in _doc()["services"].items():
        for key in svc.get("environment", {}):
            if key.startswith("DIMPLE_"):
                assert key.split("__")[0] in fields, (name, key)


def test_the_redis_password_reaches_dimple_apart_from_the_url():
    """A password with `@ / : #` cannot be pasted into a URL: compose passes it as
    DIMPLE_BROKER_PASSWORD, and the settings encode it into the URL they use."""
    doc = _doc()
    env = doc["services"]["worker-ingest"]["environment"]
    assert env["DIMPLE_BROKER_URL"] == "redis://redis:6379/0"
    assert env["DIMPLE_BROKER_PASSWORD"].startswith("${DIMPLE_REDIS_PASSWORD:?")
    assert "DIMPLE_REDIS_PASSWORD" in " ".join(doc["services"]["redis"]["command"])
    settings = WorkerSettings(_env_file=None, broker_url=env["DIMPLE_BROKER_URL"], broker_password="p@ss/w:rd#?%")
    assert settings.broker_url.get_secret_value() == "redis://:p%40ss%2Fw%3Ard%23%3F%25@redis:6379/0"
    assert "p@ss" not in json.dumps(settings.masked())
