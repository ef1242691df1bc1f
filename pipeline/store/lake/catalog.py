"""Opening a lake: its extensions (from their PyPI packages' files, offline),
its catalog (SQLite or PostgreSQL, ``store.catalog``), its data path
(``store.data_path``) and its record tables (``schema/lake``).

DuckLake keeps every table's metadata, and small writes' rows (inlined, up to
``INLINE_ROWS`` rows a table per commit), in the catalog's SQL database, and
the rest in Parquet files under the data path; a transaction commits in the
catalog, which serialises writers across processes and hosts.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb

from pipeline.errors import StoreError
from pipeline.settings import Settings, mask_url
from pipeline.store.database import extension_path, migrations, utcnow

# The name the lake is attached as: its tables are lake.memories, ...
LAKE = "lake"
# the catalog database of the attached lake, where DuckLake keeps its own tables
META = f"__ducklake_metadata_{LAKE}"
# Rows a commit may add to one table and still keep in the catalog, not in a
# Parquet file of its own: a one-memory write then costs one catalog
# transaction (no file), and compaction (``ducklake_flush_inlined_data``)
# moves them to Parquet. DuckLake's default, stated here.
INLINE_ROWS = 10
# The lake's record tables: schema/lake, applied in order, the version in lake_meta.
SCHEMA_PACKAGE = "schema.lake"


@dataclass(frozen=True)
class Catalog:
    """A parsed ``store.catalog``: ``kind`` 'sqlite' or 'postgres', ``target`` a path or a libpq conninfo."""

    kind: str
    target: str

    @classmethod
    def parse(cls, text: str) -> Catalog:
        kind, _, target = text.partition(":")
        if kind not in ("sqlite", "postgres") or not target.strip():
            raise StoreError(f"store.catalog: must be 'sqlite:PATH' or 'postgres:CONNINFO', not {mask_url(text)!r}")
        if kind == "sqlite":
            target = str(Path(target).expanduser())
        return cls(kind, target)

    def __str__(self) -> str:
        return mask_url(f"{self.kind}:{self.target}")


def _quote(text: str) -> str:
    # ATTACH takes no parameters: the text is the operator's setting, quoted
    return "'" + text.replace("'", "''") + "'"


def one(result: duckdb.DuckDBPyConnection) -> tuple | None:
    """The first row of an executed catalog read (None: no row), its result
    read to the end. A result left open (``fetchone``) keeps a read
    transaction open on a SQLite catalog (DuckDB's sqlite extension holds its
    statement), and a reader pinned like that keeps every process's
    ``wal_checkpoint`` from emptying the WAL: the erase then fails after its
    bound (``erase._vacuum_sqlite``) and the WAL only grows."""
    rows = result.fetchall()
    return rows[0] if rows else None


def ask(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[int] = ()) -> list[tuple]:
    """``sql`` over DuckLake's own tables (``ducklake_snapshot``, ...), with
    ``?`` parameters, answered by the catalog database itself
    (``sqlite_query``, ``postgres_query``) on a cursor of ``con`` that never
    touches the lake (``_asker``). Asked of the lake, DuckLake would first read
    its latest snapshot, and on SQLite that is a read of the whole snapshot
    table through DuckDB's SQLite scanner, which pushes neither a filter nor
    an aggregate down: 90-128 ms a statement with the 600,000 snapshots a busy
    week keeps, against ~1 ms asked here (``ops.bench.catalog_cost``). On
    PostgreSQL DuckDB's scanner reads by pages, ~30 ms a question at that
    size, against ~1 ms by ``postgres_query``. Values come as the catalog
    gives them (text on SQLite: callers convert)."""
    asker, kind = _asker(con)
    if kind == "sqlite":
        function, text = "sqlite_query", sql
    else:  # PostgreSQL numbers its parameters
        function, parts = "postgres_query", sql.split("?")
        text = "".join(part + (f"${i + 1}" if i + 1 < len(parts) else "") for i, part in enumerate(parts))
    fields = ", ".join(f"'p{i}': ?::BIGINT" for i in range(len(params)))
    named = f", params := {{{fields}}}" if params else ""
    return asker.execute(f"SELECT * FROM {function}('{META}', ?{named})", [text, *(int(p) for p in params)]).fetchall()


def _asker(con: duckdb.DuckDBPyConnection) -> tuple[duckdb.DuckDBPyConnection, str]:
    """The cursor of ``con`` that ``ask`` asks on (made once, closed with
    ``con``): its database is DuckDB's own, not the lake, so no statement on
    it starts a DuckLake transaction. On PostgreSQL it reads results as text:
    ``postgres_query`` binds parameters only so (its binary copy cannot)."""
    held = _ASKERS.get(con)
    if held is None:
        kind = catalog_kind(con)
        asker = con.cursor()
        asker.execute("USE memory")
        if kind == "postgres":
            asker.execute("SET SESSION pg_use_text_protocol = true")
        held = _ASKERS[con] = (asker, kind)
    return held


def catalog_kind(con: duckdb.DuckDBPyConnection) -> str:
    """'sqlite' or 'postgres': the catalog database of the lake ``con`` attached
    (kept by ``attach``; asked once of another connection). Never asked per
    question: on a SQLite catalog any statement outside a transaction costs
    DuckLake a read of the snapshot table (115 ms at 600,000 snapshots)."""
    kind = _KINDS.get(con)
    if kind is None:
        row = one(con.execute(f"SELECT * FROM ducklake_settings('{LAKE}')"))
        kind = _KINDS[con] = str(row[0]) if row is not None else ""
    return kind


# The catalog kind of each connection that attached a lake (``catalog_kind``).
_KINDS: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, str] = weakref.WeakKeyDictionary()
# The cursor ``ask`` asks on, and the catalog kind, of each connection that asked.
_ASKERS: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection,
                                   tuple[duckdb.DuckDBPyConnection, str]] = weakref.WeakKeyDictionary()


def connect() -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB to load the lake's extensions into.

    DuckDB checks an extension file's signature at every ``LOAD``: a SHA-256
    of the whole file (34 MB for the SQLite scanner, 36 MB for DuckLake),
    0.25-0.7 s of a process's start. The files are read from the PyPI packages
    installed beside ``duckdb`` itself (``extension_path``), never from the
    network: whoever could change them could change ``duckdb`` and this code
    as well, so the check proves nothing here and is skipped
    (``allow_unsigned_extensions``; the file's DuckDB version and platform are
    still checked). Nothing but ``load_extensions`` loads an extension."""
    return duckdb.connect(config={"allow_unsigned_extensions": "true"})


def load_extensions(con: duckdb.DuckDBPyConnection, catalog: Catalog, scratch: Path, *, ducklake: bool = True) -> None:
    """Load DuckLake and the catalog's scanner from their packages' files.

    The PostgreSQL extension's file is ``postgres.duckdb_extension`` but its entry
    point is ``postgres_scanner_init``, and DuckDB names the entry point after
    the file: it is loaded through a link named ``postgres_scanner`` in ``scratch``."""
    if catalog.kind == "sqlite":
        con.execute(f"LOAD {_quote(str(extension_path('duckdb-extension-sqlite-scanner', 'sqlite_scanner')))}")
    else:
        con.execute(f"LOAD {_quote(str(postgres_extension(scratch)))}")
    if ducklake:
        con.execute(f"LOAD {_quote(str(extension_path('duckdb-extension-ducklake', 'ducklake')))}")


def extensions_dir(settings: Settings) -> Path:
    """Where the links that name extension files as DuckDB wants them live (host-local)."""
    return settings.data_dir / "duckdb-extensions"


def postgres_extension(scratch: Path) -> Path:
    """A link in ``scratch`` named ``postgres_scanner.duckdb_extension`` to the
    file of ``duckdb-extension-postgres`` (made once; atomic where processes race)."""
    target = extension_path("duckdb-extension-postgres", "postgres")
    link = scratch / f"v{duckdb.__version__}" / "postgres_scanner.duckdb_extension"
    if not (link.is_symlink() and Path(os.readlink(link)) == target):
        link.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fresh = link.with_name(f"{link.name}.{os.getpid()}")
        fresh.unlink(missing_ok=True)
        fresh.symlink_to(target)
        os.replace(fresh, link)  # another process sees the old link or the new one, never none
    return link


def _new_sqlite_catalog(path: Path) -> None:
    """Create the SQLite catalog file in WAL mode (kept by the file): a reader
    never blocks a writer's commit, and two writers at once make one fail and
    retry instead of both waiting on each other's locks."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    con = sqlite3.connect(path, timeout=30)
    try:
        con.execute("PRAGMA journal_mode=WAL")
    finally:
        con.close()


def attach(settings: Settings, *, attempts: int = 5,
           override: bool = False) -> tuple[duckdb.DuckDBPyConnection, Catalog, Path]:
    """A DuckDB connection with the lake attached as ``LAKE`` (and in use).

    Raises ``StoreError`` naming ``store.catalog`` or ``store.data_path`` when
    the catalog cannot be reached or holds another data path. A new lake's
    metadata is created by the first process that attaches; one that loses
    that race tries again. ``override``: read the files under the settings'
    data path whatever the catalog records (``repoint`` only)."""
    catalog = Catalog.parse(settings.lake_catalog)
    data_path = settings.lake_data_path
    if catalog.kind == "sqlite" and not Path(catalog.target).exists():
        _new_sqlite_catalog(Path(catalog.target))
    data_path.mkdir(parents=True, exist_ok=True, mode=0o700)
    for attempt in range(attempts):
        con = connect()
        try:
            con.execute("SET enable_progress_bar = false")
            load_extensions(con, catalog, extensions_dir(settings))
            con.execute(f"ATTACH {_quote(f'ducklake:{catalog.kind}:{catalog.target}')} AS {LAKE} "
                        f"(DATA_PATH {_quote(str(data_path) + os.sep)}, DATA_INLINING_ROW_LIMIT {INLINE_ROWS}"
                        f"{', OVERRIDE_DATA_PATH true' if override else ''})")
            con.execute(f"USE {LAKE}")
            _KINDS[con] = catalog.kind
            return con, catalog, data_path
        except duckdb.Error as exc:
            con.close()
            text = str(exc)
            if "DATA_PATH" in text and "does not match" in text:
                raise StoreError(f"store.data_path: {data_path} is not the lake's data path: "
                                 f"{text.splitlines()[0]}; if the lake's files were moved there (a restored "
                                 "backup, another mount point), `dimple repoint` records the new path") from None
            if attempt + 1 < attempts and _is_conflict(exc):
                time.sleep(0.05 * (attempt + 1))
                continue
            raise StoreError(f"store.catalog: cannot open the lake catalog {catalog}: {mask_url(text)}") from None
        except BaseException:
            con.close()
            raise
    raise AssertionError("unreachable")


# "transaction is aborted": a statement of this transaction failed on a conflict before this one ran; a
# streamed result (a maintenance function's) reports it when fetched, as an InvalidInputException
_CONFLICT = re.compile(r"conflict|database is locked|could not serialize|already exists|duplicate key|"
                       r"unique constraint|transaction is aborted", re.IGNORECASE)


def _is_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is another process's commit getting there first (try
    again on the newer snapshot), not a fault of this one."""
    return isinstance(exc, duckdb.TransactionException) or (
        isinstance(exc, duckdb.Error) and bool(_CONFLICT.search(str(exc))))


class NoLake(StoreError):
    """The lake has no record tables yet (nothing was written), and whoever
    opened it cannot create them: it does not know the embedding dimension."""


def meta_rows(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]] | None:
    """The (key, value) rows of ``lake_meta`` at the latest snapshot, in one
    read; None when the lake has no record tables yet."""
    try:
        return [(str(k), str(v)) for k, v in con.execute("SELECT key, value FROM lake_meta").fetchall()]
    except duckdb.CatalogException:
        return None


def schema_version(rows: list[tuple[str, str]] | None) -> int:
    """The ``schema/lake`` version ``lake_meta``'s ``rows`` record (one row per migration applied; 0: none)."""
    return max((int(v) for k, v in rows or [] if k == "schema_version"), default=0)


def apply_schema(con: duckdb.DuckDBPyConnection, embedding_model: str | None, embedding_dim: int | None,
                 current: int | None = None) -> None:
    """Bring the record tables to the latest ``schema/lake`` version, in one
    transaction (a process that loses a race to do it finds it done).
    ``current``: the version just read (``schema_version``), else read here."""
    if current is None:
        current = schema_version(meta_rows(con))
    pending = [(v, sql) for v, _, sql in migrations(SCHEMA_PACKAGE) if v > current]
    if not pending:
        return
    if current == 0 and embedding_dim is None:
        raise NoLake("a new lake needs the embedding dimension: nothing was written to it yet")
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', 'schema')")
        for version, sql in pending:
            con.execute(sql)
            con.execute("INSERT INTO lake_meta VALUES ('schema_version', ?)", [str(version)])
        if current == 0:
            con.execute("INSERT INTO lake_meta VALUES ('embedding_model', ?), ('embedding_dim', ?), "
                        "('created_at', ?)", [embedding_model or "unknown", str(embedding_dim),
                                              utcnow().isoformat()])
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # the failed commit already ended the transaction
        raise
