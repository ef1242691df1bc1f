"""The DuckDB store: opening, migrations, and the few reads every stage shares.

One process writes a store file; many may read it (see DESIGN.md on DuckDB's
cross-process lock). The FTS extension is loaded from the installed
``duckdb-extension-fts`` package, never installed over the network.
"""

from __future__ import annotations

import importlib
import importlib.resources
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from pipeline.embedders import check_model
from pipeline.errors import ModelMismatchError, SchemaTooNewError, StoreError

_MIGRATION_NAME = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")

_T = TypeVar("_T")


def one(con: duckdb.DuckDBPyConnection, sql: str, params: object = None) -> tuple[Any, ...]:
    """The single row ``sql`` must return (an aggregate, a count).

    ``fetchone()`` gives None when there is no row; for these queries that is
    a broken store, reported as a ``StoreError`` naming the query.
    """
    row = con.execute(sql, params).fetchone()
    if row is None:
        raise StoreError(f"query returned no row: {sql}")
    return row


def extension_path(package: str, name: str) -> Path:
    """Path of the DuckDB extension file ``name.duckdb_extension`` shipped by the
    PyPI package ``package`` (``duckdb-extension-fts``, ``-ducklake``, ...) for
    this DuckDB: extensions load from these files, never from the network."""
    module = package.replace("-", "_")
    try:
        # only where that extension is loaded: a store opened without it needs no such package
        root = Path(importlib.import_module(module).__file__ or "").parent
    except ImportError:
        raise StoreError(f"DuckDB extension package missing; install {package}=={duckdb.__version__}") from None
    path = root / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if not path.is_file():
        raise StoreError(f"DuckDB extension not found at {path}; install {package}=={duckdb.__version__}")
    return path


def fts_extension_path() -> Path:
    """Path of the FTS extension file shipped by ``duckdb-extension-fts``."""
    return extension_path("duckdb-extension-fts", "fts")


def migrations(package: str = "schema") -> list[tuple[int, str, str]]:
    """(version, file name, SQL text) of every schema file of ``package``, in order."""
    found = []
    for entry in importlib.resources.files(package).iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    versions = [v for v, _, _ in found]
    if len(set(versions)) != len(versions):
        raise StoreError(f"duplicate schema versions in {[n for _, n, _ in found]}")
    return found


def latest_schema_version(package: str = "schema") -> int:
    return migrations(package)[-1][0]


def utcnow() -> datetime:
    """Naive UTC now; the store keeps naive UTC timestamps."""
    return datetime.now(UTC).replace(tzinfo=None)


@dataclass
class StoreInfo:
    schema_version: int
    embedding_model: str
    embedding_dim: int


class Store:
    """One open DuckDB store file.

    ``read_only`` stores never migrate; a read-write open applies pending
    migrations. Use ``cursor()`` per thread (DuckDB's rule for threads).
    """

    def __init__(self, path: Path, con: duckdb.DuckDBPyConnection, read_only: bool, info: StoreInfo):
        self.path = path
        self.con = con
        self.read_only = read_only
        self.info = info

    # -- lifecycle -------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: Path,
        *,
        read_only: bool,
        embedding_model: str | None = None,
        embedding_dim: int | None = None,
    ) -> Store:
        """Open (and for writers create and migrate) the store at ``path``.

        A new store records ``embedding_model`` and ``embedding_dim``; an
        existing one must match them when given (``check_model``), so a store
        is never mixed across models.
        """
        path = Path(path)
        if read_only and not path.exists():
            raise StoreError(f"no store at {path}; run 'dimple ingest FILE' first")
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            con = duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as exc:
            raise StoreError(f"cannot open store {path}: {exc}") from exc
        try:
            con.execute("SET enable_progress_bar = false")  # no bars in workers' logs from a long load
            con.execute(f"LOAD '{_sql_quote(str(fts_extension_path()))}'")
            version, latest = _versions(con, path)
            if version < latest:
                if read_only:
                    raise StoreError(
                        f"store {path} has schema version {version}; open it read-write once "
                        f"(e.g. 'dimple reindex') to migrate it to {latest}"
                    )
                if version == 0:
                    if embedding_dim is None:
                        raise StoreError("a new store needs the embedding dimension")
                    dim = embedding_dim
                else:
                    dim = _meta(con, "embedding_dim", int)
                _migrate(con, version, int(dim))
                if version == 0:
                    _set_meta(con, "embedding_model", embedding_model or "unknown")
                    _set_meta(con, "embedding_dim", str(dim))
                    _set_meta(con, "generation", "0")
            info = StoreInfo(
                schema_version=_current_version(con),
                embedding_model=_meta(con, "embedding_model", str),
                embedding_dim=_meta(con, "embedding_dim", int),
            )
        except BaseException:
            con.close()
            raise
        store = cls(path, con, read_only, info)
        try:
            check_model(info.embedding_model, info.embedding_dim, embedding_model, embedding_dim, f"store {path}")
        except ModelMismatchError:
            store.close()
            raise
        return store

    @classmethod
    def copy_in_memory(cls, path: Path, *, temp_directory: Path | None = None) -> Store:
        """A read-write copy of the store at ``path`` held in memory (DuckDB
        spills to ``temp_directory`` beyond its memory limit): a compaction
        that deletes rows writes its result afresh from it, so it needs no
        second file beside the one it writes. Pending migrations are applied
        to the copy (``dimple reindex`` upgrades a store this way)."""
        con = duckdb.connect(":memory:")
        try:
            con.execute("SET enable_progress_bar = false")
            con.execute(f"LOAD '{_sql_quote(str(fts_extension_path()))}'")
            if temp_directory is not None:
                con.execute("SET temp_directory = ?", [str(temp_directory)])
            # ATTACH takes no parameters: the path is the caller's (a data dir's segment), quoted
            con.execute(f"ATTACH '{_sql_quote(str(path))}' AS src (READ_ONLY)")
            con.execute("COPY FROM DATABASE src TO memory")
            con.execute("DETACH src")
            version, latest = _versions(con, path)
            if version < latest:  # a read-write copy is migrated, as ``open`` migrates a file
                _migrate(con, version, _meta(con, "embedding_dim", int))
            info = StoreInfo(
                schema_version=_current_version(con),
                embedding_model=_meta(con, "embedding_model", str),
                embedding_dim=_meta(con, "embedding_dim", int),
            )
        except duckdb.IOException as exc:
            con.close()
            raise StoreError(f"cannot open store {path}: {exc}") from exc
        except BaseException:
            con.close()
            raise
        return cls(path, con, False, info)

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        return self.con.cursor()

    # -- metadata --------------------------------------------------------
    def meta(self, key: str, default: str | None = None) -> str | None:
        row = self.con.execute("SELECT value FROM store_meta WHERE key = ?", [key]).fetchone()
        return row[0] if row else default

    def set_meta(self, key: str, value: str) -> None:
        _set_meta(self.con, key, value)

    @property
    def generation(self) -> int:
        """Bumped by every committed write; readers use it to refresh caches."""
        return int(self.meta("generation", "0") or 0)

    # -- shared reads ----------------------------------------------------
    def count(self) -> int:
        return int(one(self.con, "SELECT count(*) FROM memories")[0])

    def namespaces(self) -> list[str]:
        """Every namespace that holds a memory, sorted."""
        return label_lists(self.con)[0]

    def existing_ids(self, ids: Iterable[str]) -> set[str]:
        ids = list(ids)
        if not ids:
            return set()
        rows = self.con.execute(
            "SELECT id FROM memories WHERE id IN (SELECT unnest(?))", [ids]
        ).fetchall()
        return {r[0] for r in rows}


def _sql_quote(text: str) -> str:
    return text.replace("'", "''")


def _versions(con: duckdb.DuckDBPyConnection, path: Path) -> tuple[int, int]:
    """(the store's schema version, this dimple's latest); a store newer than
    this dimple understands is refused."""
    version, latest = _current_version(con), latest_schema_version()
    if version > latest:
        raise SchemaTooNewError(
            f"store {path} has schema version {version}, newer than this dimple "
            f"understands ({latest}); upgrade dimple to open it"
        )
    return version, latest


def _current_version(con: duckdb.DuckDBPyConnection) -> int:
    exists = one(con, "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'")[0]
    if not exists:
        return 0
    return int(one(con, "SELECT max(version) FROM schema_version")[0] or 0)


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """``BEGIN`` ... ``COMMIT``; on any exception (a failed commit included)
    ``ROLLBACK`` and re-raise, so nothing is half-written."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # the transaction is already gone (the connection failed)
        raise


def _migrate(con: duckdb.DuckDBPyConnection, current: int, dim: int, package: str = "schema") -> None:
    """Apply every migration of ``package`` above ``current`` in one transaction."""
    if not (1 <= dim <= 8192):
        raise StoreError(f"embedding dimension {dim} out of range")
    with transaction(con):
        con.execute(
            "CREATE TABLE IF NOT EXISTS schema_version ("
            "version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL)"
        )
        for version, name, sql in migrations(package):
            if version <= current:
                continue
            # {dim} is the only template slot: an int checked above, never user text.
            con.execute(sql.replace("{dim}", str(dim)))
            con.execute("INSERT INTO schema_version VALUES (?, ?, ?)", [version, name, utcnow()])


def _meta(con: duckdb.DuckDBPyConnection, key: str, cast: Callable[[Any], _T]) -> _T:
    row = con.execute("SELECT value FROM store_meta WHERE key = ?", [key]).fetchone()
    if row is None:
        raise StoreError(f"store metadata '{key}' is missing")
    return cast(row[0])


def _set_meta(con: duckdb.DuckDBPyConnection, key: str, value: str) -> None:
    con.execute(
        "INSERT INTO store_meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        [key, value],
    )


# A base's namespace and content-type codes, computed in SQL (no per-row Python
# strings): ``ns`` and ``ct``, each label with its rank among the sorted distinct
# labels (column ``c``), as CTEs to join ``memories`` with; ``label_lists`` gives
# the labels those codes index.
LABEL_CODES = (
    "ns AS (SELECT namespace, (dense_rank() OVER (ORDER BY namespace) - 1)::INTEGER AS c "
    "FROM (SELECT DISTINCT namespace FROM memories)), "
    "ct AS (SELECT content_type, (dense_rank() OVER (ORDER BY content_type) - 1)::INTEGER AS c "
    "FROM (SELECT DISTINCT content_type FROM memories))")


def label_lists(con) -> tuple[list[str], list[str]]:
    """(namespaces, content types) of the memories, sorted: the labels of ``LABEL_CODES``'s codes."""
    return ([r[0] for r in con.execute("SELECT DISTINCT namespace FROM memories ORDER BY 1").fetchall()],
            [r[0] for r in con.execute("SELECT DISTINCT content_type FROM memories ORDER BY 1").fetchall()])


IN_LIST_MAX = 256


def placeholders(prefix: str, values: list) -> tuple[str, dict]:
    """``$p0, $p1, ...`` and their bound values, for ``col IN (...)``.
    Only generated names enter the SQL; values stay bound."""
    names = [f"{prefix}{i}" for i in range(len(values))]
    return ", ".join(f"${n}" for n in names), dict(zip(names, values))


def ids_filter(column: str, ids: list[str]) -> tuple[str, dict]:
    """A SQL condition "``column`` is one of ``ids``" and its parameters.

    Up to ``IN_LIST_MAX`` ids (one query's candidates): an IN list of
    parameters, which DuckDB answers from the column's index. More (a batch
    replay's candidates): a semi-join against the ids as one list parameter,
    one hash-join scan shared by the whole batch, cheaper there than parsing
    thousands of parameters. Not ``list_contains(ids, column)``: that compares
    every row with every id (BENCHMARKS.md, "Scale": a batch's augment at 1M
    went from seconds to under one). ``column`` is a fixed name from the
    caller, never user text.
    """
    if len(ids) <= IN_LIST_MAX:
        slots, params = placeholders("i", ids)
        return f"{column} IN ({slots})", params
    return f"{column} IN (SELECT unnest($ids))", {"ids": list(ids)}


def rows_by_ids(con, sql: str, ids: list[str], *, lookups: bool = False) -> list[tuple]:
    """Rows of ``sql`` whose placeholders ``{id}``, ``{memory_id}``, ``{src}``,
    ``{dst}``, ``{origin}`` each become "that column is one of ``ids``"
    (``ids_filter``: index lookups for a few ids, one semi-join for many).

    ``lookups``: index lookups however many ids, ``IN_LIST_MAX`` at a time: a
    write's reads, whose cost must follow the write's size, not the store's
    (a semi-join reads the whole column)."""
    if lookups and len(ids) > IN_LIST_MAX:
        return [row for start in range(0, len(ids), IN_LIST_MAX)
                for row in rows_by_ids(con, sql, ids[start : start + IN_LIST_MAX])]
    params: dict = {}
    for column in ("id", "memory_id", "src", "dst", "origin"):
        if "{" + column + "}" in sql:
            where, params = ids_filter(column, ids)
            sql = sql.replace("{" + column + "}", where)
    return con.execute(sql, params).fetchall()


def created_at_of(con, ids: list[str]) -> dict[str, datetime]:
    """``created_at`` of the given memories."""
    if not ids:
        return {}
    where, params = ids_filter("id", list(ids))
    return dict(con.execute(f"SELECT id, created_at FROM memories WHERE {where}", params).fetchall())
