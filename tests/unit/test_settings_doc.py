"""docs/SETTINGS.md is generated from the settings models and fails here when
they drift; every setting says what it means; the settings come in two parts
under the environment names they always had."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from pipeline.settings import Settings
from workers import settings_doc
from workers.settings import WorkerSettings

WORKER_FIELDS = {
    "broker_url", "broker_password", "result_backend", "task_timeout_s", "ingest_batch_timeout_s", "flower_user", "flower_password",
    "flower_address", "flower_port", "worker_concurrency", "worker_blas_threads", "worker_prefetch_multiplier", "worker_warmup_timeout_s",
    "task_soft_time_limit_s", "task_time_limit_s", "visibility_timeout_s", "log_level", "audit_max_retries",
    "audit_backoff_base_s", "audit_backoff_max_s", "audit_outbox_after_s",
    "mcp",
}


def test_the_settings_reference_is_the_models_own():
    assert settings_doc.PATH.read_text(encoding="utf-8") == settings_doc.render(), (
        f"docs/SETTINGS.md differs from the settings models: run {settings_doc.COMMAND}")
    assert settings_doc.main(["--check"]) == 0


def _described(model: type[BaseModel], prefix: str = "") -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name, field in model.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            out |= _described(type(default), f"{prefix}{name}.")
        else:
            out[prefix + name] = field.description
    return out


def test_every_setting_says_what_it_means():
    fields = _described(WorkerSettings)
    assert len(fields) >= 60  # nested models walked (66 since issue 31 removed five fusion settings)
    assert [name for name, text in fields.items() if not text] == []
    table = settings_doc.render()
    for name in fields:
        assert f"`DIMPLE_{name.upper().replace('.', '__')}`" in table, name


def test_the_pipeline_part_holds_no_broker_worker_or_flower_setting():
    assert set(Settings.model_fields) & WORKER_FIELDS == set()
    assert set(WorkerSettings.model_fields) == set(Settings.model_fields) | WORKER_FIELDS


def test_both_parts_read_their_old_environment_names(monkeypatch):
    monkeypatch.setenv("DIMPLE_BROKER_URL", "redis://:pw@h:6379/0")
    monkeypatch.setenv("DIMPLE_FLOWER_PORT", "5600")
    monkeypatch.setenv("DIMPLE_TREE__BEAM_WIDTH", "3")
    monkeypatch.setenv("DIMPLE_AUDIT_MAX_RETRIES", "7")
    s = WorkerSettings(_env_file=None)
    assert (s.broker_url.get_secret_value(), s.flower_port, s.tree.beam_width, s.audit_max_retries) == (
        "redis://:pw@h:6379/0", 5600, 3, 7)
    assert Settings(_env_file=None).tree.beam_width == 3
    shown = s.masked()  # what `dimple config` prints: every setting of both parts
    assert set(shown) == set(WorkerSettings.model_fields) and shown["broker_url"] == "redis://:****@h:6379/0"


def test_a_copy_keeps_its_part(settings):
    assert type(settings.replace(rrf_k=5)) is WorkerSettings
    assert type(Settings(_env_file=None).replace(rrf_k=5)) is Settings


def test_the_broker_password_goes_into_the_urls_of_the_broker_s_own_redis_only():
    s = WorkerSettings(_env_file=None, broker_url="redis://h:6379/0", broker_password="p@ss/#",
                       result_backend="redis://h:6379/1")
    assert s.broker_url.get_secret_value() == "redis://:p%40ss%2F%23@h:6379/0"
    assert s.result_backend.get_secret_value() == "redis://:p%40ss%2F%23@h:6379/1"
    other = s.replace(result_backend="redis://elsewhere:6379/1")
    assert other.result_backend.get_secret_value() == "redis://elsewhere:6379/1"  # not its password to send
    assert s.replace(task_timeout_s=3).broker_url == s.broker_url  # applied once, whatever is re-read
    with pytest.raises(ValueError, match="a password other than broker_password"):
        WorkerSettings(_env_file=None, broker_url="redis://:else@h:6379/0", broker_password="p")
    with pytest.raises(ValueError, match="broker_url is empty"):
        WorkerSettings(_env_file=None, broker_password="p")
