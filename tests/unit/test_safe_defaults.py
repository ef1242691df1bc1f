"""Safe defaults (issue 8): JSON-only messages, Flower behind auth, no secrets
in ``dimple config`` or logs, data folders readable by their owner only.
(An unreachable broker's error and log lines without its password:
tests/unit/test_api.py::test_unreachable_broker_is_a_clear_error.)

The refusal by a real worker is tested with Redis in
tests/integration/test_distributed.py::test_a_pickled_message_is_refused; here
the same configuration is checked without a broker, through kombu's own
decoder (what the worker calls on every message).
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from kombu.exceptions import ContentDisallowed
from kombu.serialization import dumps, loads, prepare_accept_content

from pipeline.errors import InputError
from workers.app import conf_for
from workers.cli import main
from workers.cli.commands import flower_argv
from workers.settings import WorkerSettings

SECRET = "Tr0ub4dor-and-3"


# -- JSON only -------------------------------------------------------------------------
@pytest.mark.parametrize("broker", ["", "redis://127.0.0.1:6379/0"])
def test_only_json_is_accepted_embedded_or_on_a_broker(broker):
    conf = conf_for(WorkerSettings(_env_file=None, broker_url=broker))
    assert conf["task_serializer"] == conf["result_serializer"] == conf["event_serializer"] == "json"
    assert conf["accept_content"] == ["json"] and conf["result_accept_content"] == ["json"]


def test_a_non_json_message_is_refused_by_the_configured_decoder():
    """kombu's decoder, with the accept list dimple's workers and result
    consumers use, refuses a pickle-serialised body and reads a JSON one."""
    conf = conf_for(WorkerSettings(_env_file=None, broker_url="redis://127.0.0.1:6379/0"))
    for accept in (prepare_accept_content(conf["accept_content"]), prepare_accept_content(conf["result_accept_content"])):
        ctype, enc, body = dumps({"states": []}, serializer="pickle")
        assert ctype == "application/x-python-serialize"
        with pytest.raises(ContentDisallowed):
            loads(body, ctype, enc, accept=accept)
        ctype, enc, body = dumps({"states": []}, serializer="json")
        assert loads(body, ctype, enc, accept=accept) == {"states": []}


# -- Flower ---------------------------------------------------------------------------------
def test_flower_refuses_to_start_without_credentials():
    s = WorkerSettings(_env_file=None, broker_url="redis://127.0.0.1:6379/0")
    with pytest.raises(InputError) as info:
        flower_argv(s, insecure=False)
    assert "FLOWER" in info.value.field
    for only_one in ({"flower_user": "ops"}, {"flower_password": "pw"}):
        with pytest.raises(InputError):
            flower_argv(s.replace(**only_one), insecure=False)
    argv = flower_argv(s.replace(flower_user="ops", flower_password=SECRET), insecure=False)
    assert f"--basic_auth=ops:{SECRET}" in argv
    assert "--address=127.0.0.1" in argv  # loopback by default
    assert not any(a.startswith("--basic_auth") for a in flower_argv(s, insecure=True))  # only when asked


# -- secrets ---------------------------------------------------------------------------------
def test_config_output_has_no_secret(monkeypatch, capsys):
    monkeypatch.setenv("DIMPLE_BROKER_URL", f"rediss://default:{SECRET}@redis.internal:6380/0")
    monkeypatch.setenv("DIMPLE_RESULT_BACKEND", f"redis://:{SECRET}@redis.internal:6379/1")
    monkeypatch.setenv("DIMPLE_FLOWER_USER", "ops")
    monkeypatch.setenv("DIMPLE_FLOWER_PASSWORD", SECRET)
    from workers.settings import get_settings

    get_settings.cache_clear()
    try:
        assert main(["config"]) == 0
    finally:
        get_settings.cache_clear()
    out, err = capsys.readouterr()
    assert SECRET not in out and SECRET not in err
    assert '"flower_password": "****"' in out and "redis.internal" in out


def test_config_shows_the_result_backend_celery_uses(monkeypatch, capsys):
    """Unset, the result backend is the broker URL: ``dimple config`` shows that
    (masked), the value ``conf_for`` hands to Celery, not the empty setting."""
    import json

    from workers.settings import get_settings

    broker = f"redis://:{SECRET}@redis.internal:6379/0"
    monkeypatch.setenv("DIMPLE_BROKER_URL", broker)
    monkeypatch.delenv("DIMPLE_RESULT_BACKEND", raising=False)
    get_settings.cache_clear()
    try:
        assert main(["config"]) == 0
        settings = get_settings()
    finally:
        get_settings.cache_clear()
    out = capsys.readouterr().out
    assert SECRET not in out
    assert json.loads(out)["result_backend"] == "redis://:****@redis.internal:6379/0"
    assert settings.effective_result_backend == conf_for(settings)["result_backend"] == broker
    own = WorkerSettings(_env_file=None, broker_url=broker, result_backend="redis://127.0.0.1:6379/5")
    assert own.effective_result_backend == conf_for(own)["result_backend"] == "redis://127.0.0.1:6379/5"
    embedded = WorkerSettings(_env_file=None, broker_url="")
    assert embedded.effective_result_backend == "" and embedded.masked()["result_backend"] == ""






# -- data folders ------------------------------------------------------------------------------
def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


