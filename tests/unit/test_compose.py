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


# -- compose/docker-compose.hosts.yml: several hosts on the lake engine (ops/RUNBOOK.md "Several hosts")
HOSTS_COMPOSE = COMPOSE.with_name("docker-compose.hosts.yml")


def _hosts_doc():
    return yaml.safe_load(HOSTS_COMPOSE.read_text(encoding="utf-8"))


def _interpolated(value: str, env: dict[str, str]) -> str:
    """``${NAME:?msg}`` / ``${NAME:-default}`` / ``${NAME}`` as compose fills them from ``env``."""
    import re

    def one(m: re.Match) -> str:
        name, op, rest = m.group(1), m.group(2) or "", m.group(3) or ""
        if name in env:
            return env[name]
        assert op != ":?", f"{name} is required and not set"
        return rest if op == ":-" else ""
    return re.sub(r"\$\{(\w+)(:\?|:-)?([^}]*)\}", one, value)


def test_hosts_compose_file_is_valid_against_the_compose_specification():
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in _compose_validator().iter_errors(_hosts_doc())]
    assert errors == []


def test_hosts_shared_services_are_redis_and_postgres_with_passwords_on_a_chosen_address():
    services = _hosts_doc()["services"]
    shared = {name for name, svc in services.items() if svc.get("profiles") == ["shared"]}
    assert shared == {"redis", "postgres"}
    assert "--requirepass" in services["redis"]["command"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${DIMPLE_POSTGRES_PASSWORD:?")
    for name in shared:  # published on the address the operator names (a private network), never on all
        assert all(p.startswith("${DIMPLE_SHARED_BIND:?") for p in services[name]["ports"]), name
        assert services[name]["healthcheck"]["test"], name


def test_every_host_runs_each_queue_on_the_lake_with_a_local_cache_and_the_shared_data_path():
    services = _hosts_doc()["services"]
    queues = {}
    env = {"DIMPLE_SHARED_HOST": "10.0.0.5", "DIMPLE_REDIS_PASSWORD": "r", "DIMPLE_POSTGRES_PASSWORD": "p"}
    for name, svc in services.items():
        cmd = svc.get("command", [])
        if cmd[:2] != ["dimple", "worker"]:
            continue
        queues[cmd[cmd.index("--queues") + 1]] = svc["profiles"]
        assert "dimple-cache:/data" in svc["volumes"] and "dimple-lake:/lake" in svc["volumes"], name
        values = {k: _interpolated(v, env) for k, v in svc["environment"].items() if k.startswith("DIMPLE_")}
        settings = WorkerSettings(_env_file=None, data_dir=values["DIMPLE_DATA_DIR"], broker_url=values["DIMPLE_BROKER_URL"],
                                  store={"catalog": values["DIMPLE_STORE__CATALOG"],
                                         "data_path": values["DIMPLE_STORE__DATA_PATH"]})
        assert "DIMPLE_STORE__ENGINE" not in values  # the lake is the only store
        assert settings.store.catalog.startswith("postgres:dbname=dimple host=10.0.0.5 ")
        assert str(settings.store.data_path) == "/lake" and str(settings.data_dir) == "/data"
        assert "depends_on" not in svc, f"{name}: the shared services run on another machine"
    assert queues == {"embed": ["host"], "search": ["host"], "ingest": ["host"], "audit": ["audit"]}
    lake = _hosts_doc()["volumes"]["dimple-lake"]
    assert lake["driver_opts"]["type"] == "nfs", "every host mounts the one data path"


def test_hosts_environment_names_are_real_settings():
    from pipeline.settings import StoreSettings

    fields = {f"DIMPLE_{name.upper()}" for name in WorkerSettings.model_fields}
    store = {f"DIMPLE_STORE__{name.upper()}" for name in StoreSettings.model_fields}
    for name, svc in _hosts_doc()["services"].items():
        for key in svc.get("environment", {}):
            if key.startswith("DIMPLE_"):
                assert key in store if "__" in key else key in fields, (name, key)
