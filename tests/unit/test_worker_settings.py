"""Worker settings reach Celery; a soft time limit must come before the hard one."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workers.app import conf_for


def test_prefetch_and_time_limits_come_from_settings(settings):
    conf = conf_for(settings.replace(worker_prefetch_multiplier=4, task_soft_time_limit_s=20,
                                     task_time_limit_s=30))
    assert conf["worker_prefetch_multiplier"] == 4
    assert (conf["task_soft_time_limit"], conf["task_time_limit"]) == (20, 30)
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"]
    assert conf["accept_content"] == ["json"] and conf["task_serializer"] == "json"


def test_defaults_are_one_message_ahead_and_a_lost_lease_comes_back_within_seconds(settings):
    """Workers renew the lease on what they hold (workers/leases.py), so the
    visibility timeout bounds how long a lost worker's messages stay away, not
    how long a task may run: it is short, renewed several times within it,
    and swept for every second."""
    from workers.leases import renew_interval_s

    conf = conf_for(settings)
    assert conf["worker_prefetch_multiplier"] == 1
    transport = conf["broker_transport_options"]
    assert transport["visibility_timeout"] == settings.visibility_timeout_s <= 10
    assert renew_interval_s(settings.visibility_timeout_s) * 4 <= settings.visibility_timeout_s
    assert transport["unacked_restore_interval"] == 1 and transport["unacked_restore_throttle"] == 1


def test_a_soft_limit_at_or_over_the_hard_limit_is_refused(settings):
    with pytest.raises(ValidationError) as info:
        settings.replace(task_soft_time_limit_s=60, task_time_limit_s=60)
    assert "task_soft_time_limit_s" in str(info.value)


def test_a_pool_process_may_take_the_warm_up_timeout_to_report_up(settings):
    """Celery kills a pool process that is not up within worker_proc_alive_timeout
    (4 s by default); loading the ingest model alone takes longer."""
    conf = conf_for(settings.replace(worker_warmup_timeout_s=42))
    assert conf["worker_proc_alive_timeout"] == 42
    assert conf_for(settings)["worker_proc_alive_timeout"] == settings.worker_warmup_timeout_s >= 60


def test_an_ingest_batch_is_waited_for_until_its_worker_would_have_stopped_it(settings):
    assert settings.ingest_batch_wait_s == settings.task_time_limit_s + 60 > settings.task_timeout_s
    assert settings.replace(task_soft_time_limit_s=800, task_time_limit_s=900).ingest_batch_wait_s == 960
    assert settings.replace(ingest_batch_timeout_s=30).ingest_batch_wait_s == 30
    with pytest.raises(ValidationError, match="ingest_batch_timeout_s"):
        settings.replace(ingest_batch_timeout_s=0)
