"""The settings of a dimple process: the pipeline's (``pipeline.settings``,
retrieval and store) and, here, the broker, worker, task, Flower and audit
worker knobs, and the MCP server's (``dimple mcp``).

One ``WorkerSettings`` object is read once per process from the environment
(prefix ``DIMPLE_``, nested delimiter ``__``, an optional ``.env``: the same
names for both parts) and passed down; the pipeline sees it as its
``Settings``. ``python -m workers.settings_doc`` writes the reference,
docs/SETTINGS.md, from both models.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from pipeline.settings import Settings, mask_url  # mask_url: workers.app and the tests import it from here

LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


class McpSettings(BaseModel):
    """``dimple mcp``, the MCP server, over streamable HTTP (``--http``)."""

    model_config = ConfigDict(extra="forbid")

    address: str = Field("127.0.0.1", description="interface `dimple mcp --http` listens on (`--host`); another "
                                                   "than 127.0.0.1, localhost or ::1 needs `DIMPLE_MCP__TOKEN`")
    port: int = Field(8765, ge=1, le=65535, description="port `dimple mcp --http` listens on (`--port`)")
    token: SecretStr = Field(
        SecretStr(""),
        description="bearer token `dimple mcp --http` requires of every request (`Authorization: Bearer TOKEN`); "
                    "empty: none, allowed on 127.0.0.1, localhost or ::1 only",
    )


class WorkerSettings(Settings):
    """Effective configuration of one dimple process: the pipeline's settings
    and the broker, workers, tasks, Flower and the audit worker."""

    broker_url: SecretStr = Field(
        SecretStr(""), description="Celery broker, e.g. `redis://:password@host:6379/0`; empty: embedded (in-process)"
    )
    result_backend: SecretStr = Field(SecretStr(""), description="Celery result backend; empty: the broker URL")
    broker_password: SecretStr = Field(
        SecretStr(""),
        description="the broker's password, given apart from `DIMPLE_BROKER_URL` (which then holds none): dimple "
                    "puts it into the broker URL, and that of a result backend on the same Redis server, URL-encoded, "
                    "so any character works "
                    "(the compose file passes DIMPLE_REDIS_PASSWORD here)",
    )
    task_timeout_s: float = Field(120.0, gt=0, description="how long `search` (a caller) waits for a query's result")
    # Not task_timeout_s: a batch's cost follows the store, not the batch (BENCHMARKS.md,
    # "Ingest freshness": ~47 s at 100k memories, ~450 s at 1M), far past a query's wait.
    ingest_batch_timeout_s: float | None = Field(
        None, gt=0,
        description="how long `dimple ingest --via-broker` waits for each batch; "
                    "unset: task_time_limit_s + 60 (by then its worker has stopped a batch that was running)",
    )

    flower_user: str = Field("", description="Flower basic-auth user (required, with the password, unless `--insecure`)")
    flower_password: SecretStr = Field(SecretStr(""), description="Flower basic-auth password")
    flower_address: str = Field("127.0.0.1", description="interface Flower listens on")
    flower_port: int = Field(5555, ge=1, le=65535, description="port Flower listens on")
    worker_concurrency: int = Field(0, ge=0, description="processes per `dimple worker`; 0: one per core")
    # Celery spreads a host's cores over processes (--concurrency); a pool process
    # that also spread its matrix products over every core would wait on its
    # own threads while the host's other processes hold the cores (pipeline/minilm.py).
    worker_blas_threads: int = Field(
        1, ge=0, le=256,
        description="BLAS threads of each worker process for its matrix products (embedding); 0: one per core",
    )
    worker_prefetch_multiplier: int = Field(
        1, ge=1, le=64, description="messages each worker process reserves ahead (1: a long batch never holds a query back)"
    )
    # The ready line waits for it; 1M memories' index loads in ~20-30 s on a busy 2-core machine.
    worker_warmup_timeout_s: float = Field(
        300.0, gt=0,
        description="how long a worker process may take to load what its queues need (model, store index) "
                    "before the worker starts without it; a replacement process slower than this is killed",
    )
    task_soft_time_limit_s: int = Field(300, ge=1, description="a task is interrupted with an error after this long")
    task_time_limit_s: int = Field(360, ge=1, description="a task's worker process is replaced after this long")
    visibility_timeout_s: int = Field(
        6, ge=1,
        description="a message held by a worker that stopped renewing its lease (killed, lost) goes back "
                    "on its queue after this long",
    )
    log_level: str = Field(
        "INFO",
        description="log level of `dimple worker` and `dimple flower` (the `hybrid.search` line is INFO); "
                    "other commands show warnings (`-v`: INFO)",
    )

    audit_max_retries: int = Field(8, ge=0, le=100, description="`audit.write` retries before dead-lettering")
    audit_backoff_base_s: float = Field(
        1.0, gt=0, description="first `audit.write` retry delay: base x 2^retry, jittered, capped at audit_backoff_max_s"
    )
    audit_backoff_max_s: float = Field(60.0, gt=0, description="cap of the exponential `audit.write` retry backoff")
    # Live workers renew the lease on what they hold (workers/leases.py), so this bounds how
    # long a lost worker's messages stay away, not how long a task may run.
    audit_outbox_after_s: float = Field(
        5.0, gt=0,
        description="the audit worker writes from the outbox (disk) any row whose `audit.write` message has not "
                    "done so after this long (the message was lost with Redis, or with a killed worker)",
    )

    mcp: McpSettings = McpSettings()

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        name = value.strip().upper()
        if name not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return name

    @model_validator(mode="after")
    def _soft_limit_first(self) -> WorkerSettings:
        if self.task_soft_time_limit_s >= self.task_time_limit_s:
            raise ValueError("task_soft_time_limit_s must be below task_time_limit_s")
        return self

    @model_validator(mode="after")
    def _password_into_urls(self) -> WorkerSettings:
        password = self.broker_password.get_secret_value()
        if not password:
            return self
        if not self.broker_url.get_secret_value():
            raise ValueError("broker_password is set but broker_url is empty (embedded): set both, or neither")
        self.broker_url = SecretStr(with_password(self.broker_url.get_secret_value(), password, "broker_url"))
        backend = self.result_backend.get_secret_value()
        if backend.startswith(("redis://", "rediss://")) and _server(backend) == _server(self.broker_url.get_secret_value()):
            # the broker's own Redis (another database of it): the same password
            self.result_backend = SecretStr(with_password(backend, password, "result_backend"))
        return self

    @property
    def ingest_batch_wait_s(self) -> float:
        """Seconds ``dimple ingest --via-broker`` waits for each batch (``ingest_batch_timeout_s``)."""
        if self.ingest_batch_timeout_s is not None:
            return self.ingest_batch_timeout_s
        return self.task_time_limit_s + 60.0

    @property
    def embedded(self) -> bool:
        return not self.broker_url.get_secret_value()

    @property
    def effective_result_backend(self) -> str:
        """The result backend Celery uses: ``result_backend``, else the broker URL (empty when embedded)."""
        return self.result_backend.get_secret_value() or self.broker_url.get_secret_value()

    def masked(self) -> dict[str, Any]:
        """Settings as JSON-able data with every secret and URL password masked
        (``result_backend`` is the effective one)."""
        data = self.model_dump(mode="json")
        data["broker_url"] = mask_url(self.broker_url.get_secret_value())
        data["result_backend"] = mask_url(self.effective_result_backend)  # as used, not as set
        data["flower_password"] = "****" if self.flower_password.get_secret_value() else ""
        data["broker_password"] = "****" if self.broker_password.get_secret_value() else ""
        if self.store.catalog:
            data["store"]["catalog"] = mask_url(self.store.catalog)
        data["mcp"]["token"] = "****" if self.mcp.token.get_secret_value() else ""
        return data


def _server(url: str) -> tuple[str | None, int | None]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def with_password(url: str, password: str, name: str) -> str:
    """``url`` with ``password`` in its user part, percent-encoded (kombu and
    redis-py decode it); a URL that already holds that password is kept, one
    that holds another is an error naming ``name``."""
    parts = urlsplit(url)
    if parts.password is not None:
        if unquote(parts.password) == password:
            return url
        raise ValueError(f"{name} holds a password other than broker_password: give it in one place")
    user = quote(unquote(parts.username), safe="") if parts.username else ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{host}"))


@lru_cache(maxsize=1)
def get_settings() -> WorkerSettings:
    """The process-wide settings, built once."""
    return WorkerSettings()
