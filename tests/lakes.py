"""Test helpers for the lake (``pipeline.store.lake``): memories made with the
hash embedder, a writer process, a byte scan of every file, and a PostgreSQL
server to put catalogs in (found, or started, or the test is skipped).

``python -m tests.lakes poll SETTINGS_JSON STOP`` reads the lake without pause
until the file ``STOP`` exists. ``python -m tests.lakes write SETTINGS_JSON PREFIX N SHARED BARRIER`` is one
writer process: it opens the lake, waits for the barrier file, then commits
``N`` writes of its own (write id = memory id = ``PREFIX-j``) and ``SHARED``
writes every writer also sends (``shared-j``: one message delivered to each
process), and prints what it committed as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest

from pipeline.embedders import HashEmbedder, make_embedder
from pipeline.settings import Settings
from pipeline.store.database import utcnow
from pipeline.store.ingest import MemoryRecord
from pipeline.store.lake import Lake, LakeMemory, LakeWrite
from pipeline.store.lake.catalog import postgres_extension
from pipeline.store.reader import Snapshot, View

DIM = 16
EMBEDDER = HashEmbedder(DIM)


def memory(mid: str, content: str, **fields) -> LakeMemory:
    record = MemoryRecord(id=mid, namespace=fields.pop("namespace", "code"), content=content, **fields)
    return LakeMemory.from_record(record, EMBEDDER.embed([content])[0], utcnow())


def open_lake(settings: Settings) -> Lake:
    return Lake.open(settings, embedding_model=EMBEDDER.name, embedding_dim=DIM)


def age_forgets(settings: Settings, by: timedelta = timedelta(hours=1)) -> None:
    """Make the forgets (and purges) not yet erased ``by`` older, as if made
    then: due for the next compaction's erase once ``by`` reaches
    ``store.erase_within`` (an hour by default). One commit, retried as every
    lake commit is (another process's commit, an audit row's, may come first)."""
    from pipeline.store.lake import erase as erasing
    from pipeline.store.lake.commit import retrying

    with Lake.open(settings) as lake:
        def once() -> None:
            lake.con.execute("UPDATE forgets SET forgotten_at = forgotten_at - ?::INTERVAL",
                             [erasing.timedelta_text(by)])

        retrying(lake.con, once, deadline_s=settings.write_wait_s, what="ageing the forgets")


def pass_the_wait(settings: Settings) -> bool:
    """Let pass the wait of an erase that found files a compaction that died
    left (``erase.cut``: they are deleted once ``erase.LONGEST_TRANSACTION``
    old): the held rows of ``dead_compactions`` and every file under the data
    path made that much (and ``CLOCK_SLACK``) older, as if the hour had gone
    by. False, changing nothing, when no erase waits. DuckLake's maintenance
    calls crash now and then (``pipeline.store.maintenance`` runs the
    compaction again): a test that erases calls this after its compaction."""
    from pipeline.store.lake import erase as erasing
    from pipeline.store.lake.commit import retrying

    by = erasing.LONGEST_TRANSACTION + erasing.CLOCK_SLACK
    with Lake.open(settings) as lake:
        if not (lake.con.execute("SELECT count(*) FROM dead_compactions WHERE held").fetchone() or (0,))[0]:
            return False

        def once() -> None:
            lake.con.execute("UPDATE dead_compactions SET found_at = found_at - ?::INTERVAL WHERE held",
                             [erasing.timedelta_text(by)])

        retrying(lake.con, once, deadline_s=settings.write_wait_s, what="ageing the dead compactions")
    age_files(settings, by)
    return True


def age_files(settings: Settings, by: timedelta) -> None:
    """Make every file under the lake's data path ``by`` older (its times), as if written then."""
    for path in settings.lake_data_path.rglob("*"):
        if path.is_file():
            st = path.stat()
            os.utime(path, (st.st_atime - by.total_seconds(), st.st_mtime - by.total_seconds()))


def compact_erasing(settings: Settings):
    """``maintenance.compact`` with an erase due: its report. When a DuckLake
    crash killed one of its tries and the files it left made the erase wait,
    the report says so; the wait is passed (``pass_the_wait``) and it runs again."""
    from pipeline.store.maintenance import compact

    report = compact(settings, wait=True)
    if pass_the_wait(settings):
        assert report.erase_held_until and not report.forgotten, report
        report = compact(settings, wait=True)
    return report


def files_holding(needle: bytes, *folders: Path) -> list[Path]:
    """Every file under ``folders`` whose bytes contain ``needle``."""
    return sorted(p for folder in folders for p in Path(folder).rglob("*")
                  if p.is_file() and needle in p.read_bytes())


# -- a writer process ------------------------------------------------------------------
def _write(settings_json: str, prefix: str, n: int, shared: int, barrier: str) -> None:
    settings = Settings.model_validate_json(settings_json)
    with open_lake(settings) as lake:
        Path(f"{barrier}.{prefix}").touch()  # ready
        while not Path(barrier).exists():
            time.sleep(0.005)
        own, common = [f"{prefix}-{j}" for j in range(n)], [f"shared-{j}" for j in range(shared)]
        out = []
        for j in range(max(n, shared)):  # the shared writes land while the others write theirs
            for mid in own[j : j + 1] + common[j : j + 1]:
                done = lake.commit(LakeWrite([memory(mid, f"memory {mid} written by {prefix}")], write_id=mid))
                out.append({"id": mid, "snapshot": done.snapshot, "replayed": done.replayed,
                            "attempts": done.attempts})
    print(json.dumps(out))


def writers(settings: Settings, prefixes: list[str], n: int, shared: int, tmp: Path) -> list[list[dict]]:
    """Run one writer process per prefix, all at once (each opens its lake,
    then all start writing together); what each committed."""
    barrier = tmp / f"go-{uuid.uuid4().hex}"
    procs = [subprocess.Popen([sys.executable, "-m", "tests.lakes", "write", settings.model_dump_json(), prefix,
                               str(n), str(shared), str(barrier)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": _pythonpath()})
             for prefix in prefixes]
    deadline = time.monotonic() + 120
    while not all(Path(f"{barrier}.{p}").exists() for p in prefixes) and time.monotonic() < deadline \
            and all(p.poll() is None for p in procs):
        time.sleep(0.01)
    barrier.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _poll(settings_json: str, stop: str) -> None:
    """Read the latest snapshot and its memories over and over until ``stop``
    exists; ``fell``: the reads that returned fewer memories than the one
    before (where nothing is forgotten, a short read)."""
    settings = Settings.model_validate_json(settings_json)
    reads, snapshots, fell, last = 0, set(), 0, 0
    parent = os.getppid()
    with open_lake(settings) as lake:
        Path(f"{stop}.ready").touch()
        while not Path(stop).exists() and os.getppid() == parent:  # nor past a test process that died
            snapshots.add(lake.latest_snapshot())
            got = len(lake.read())
            fell += got < last
            reads, last = reads + 1, got
        snapshots.add(lake.latest_snapshot())  # and once after: it still reads
    print(json.dumps({"reads": reads, "snapshots": sorted(snapshots), "fell": fell}))


def polling(settings: Settings, tmp: Path):
    """A process reading the lake without pause; ``stop()`` ends it and returns what it read."""
    stop = tmp / f"stop-{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-m", "tests.lakes", "poll", settings.model_dump_json(), str(stop)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": _pythonpath()})
    deadline = time.monotonic() + 120
    while not Path(f"{stop}.ready").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)

    def finish() -> dict:
        stop.touch()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        return json.loads(out.strip().splitlines()[-1])
    return finish


def _pythonpath() -> str:
    root = str(Path(__file__).resolve().parents[1])
    return os.pathsep.join([root, *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])])


# -- PostgreSQL ------------------------------------------------------------------------
def _postgres_ready(conninfo: str) -> bool:
    con = duckdb.connect()
    try:
        con.execute(f"LOAD '{_postgres_extension()}'")
        con.execute(f"ATTACH '{conninfo}' AS probe (TYPE postgres, READ_ONLY)")
        return True
    except duckdb.Error:
        return False
    finally:
        con.close()


def _postgres_extension() -> Path:
    return postgres_extension(Path(os.environ.get("TMPDIR", "/tmp")) / f"dimple-test-ext-{os.getuid()}")


class Postgres:
    """A reachable PostgreSQL server: ``admin`` is a conninfo for its maintenance database."""

    def __init__(self, admin: str, base: str, proc: subprocess.Popen | None = None):
        self.admin, self.base, self.proc = admin, base, proc

    def execute(self, sql: str) -> None:
        con = duckdb.connect()
        try:
            con.execute(f"LOAD '{_postgres_extension()}'")
            con.execute(f"ATTACH '{self.admin}' AS admin (TYPE postgres)")
            con.execute("CALL postgres_execute('admin', ?, use_transaction => false)", [sql])
        finally:
            con.close()

    def create_database(self) -> str:
        """A new, empty database; its conninfo."""
        name = f"dimple_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self.execute(f"CREATE DATABASE {name}")
        return f"dbname={name} {self.base}"

    def drop_database(self, conninfo: str) -> None:
        name = conninfo.split()[0].removeprefix("dbname=")
        self.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def dump(self, conninfo: str) -> str:
        """Every row of every table of the database, as text (what pg_dump's data would show)."""
        con = duckdb.connect()
        try:
            con.execute(f"LOAD '{_postgres_extension()}'")
            con.execute(f"ATTACH '{conninfo}' AS dumped (TYPE postgres, READ_ONLY)")
            tables = con.execute("SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = 'dumped' "
                                 "AND schema_name NOT IN ('information_schema', 'pg_catalog')").fetchall()
            assert tables, "the catalog database holds tables"
            return "\n".join(repr(row) for schema, t in tables
                             for row in con.execute(f'SELECT * FROM dumped."{schema}"."{t}"').fetchall())
        finally:
            con.close()


def find_postgres(tmp: Path) -> Postgres:
    """``DIMPLE_TEST_POSTGRES`` (a conninfo without dbname), or one on 127.0.0.1:5432,
    or one started from ``initdb``/``postgres`` on PATH in ``tmp``; else skip, naming what to install."""
    base = os.environ.get("DIMPLE_TEST_POSTGRES", "host=127.0.0.1 port=5432 user=postgres")
    if _postgres_ready(f"dbname=postgres {base}"):
        return Postgres(f"dbname=postgres {base}", base)
    initdb, server = shutil.which("initdb"), shutil.which("postgres")
    if not (initdb and server) or os.getuid() == 0:
        pytest.skip("no PostgreSQL server reachable (set DIMPLE_TEST_POSTGRES='host=... user=...'), and none can be "
                    "started here: install PostgreSQL ('apt-get install postgresql' on Debian/Ubuntu) and run the "
                    "tests as a user other than root, or start a server")
    data = tmp / "pgdata"
    subprocess.run([initdb, "-D", str(data), "-A", "trust", "-U", "postgres"], check=True, capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "-D", str(data), "-p", str(port), "-k", str(tmp), "-c", "listen_addresses=127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"host=127.0.0.1 port={port} user=postgres"
    for _ in range(200):
        if _postgres_ready(f"dbname=postgres {base}"):
            return Postgres(f"dbname=postgres {base}", base, proc)
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the PostgreSQL server started in {data} did not answer on port {port}")


def _erase(settings_json: str, ids_json: str) -> None:
    with open_lake(Settings.model_validate_json(settings_json)) as lake:
        lake.erase(json.loads(ids_json))


def erase_in_child(settings: Settings, ids: list[str], tries: int = 3) -> None:
    """``Lake.erase(ids)`` in a process of its own, run again when it dies by a
    signal, as compaction's child is (``maintenance.compact``): DuckLake's
    maintenance calls die now and then beside a reading process (docs/LAKE.md,
    "Compaction in a process of its own"), which would take a test's pytest
    worker down with it. A forget committed before a death is found done."""
    for _ in range(tries):
        done = subprocess.run([sys.executable, "-m", "tests.lakes", "erase", settings.model_dump_json(),
                               json.dumps(ids)], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": _pythonpath()})
        if done.returncode >= 0:
            assert done.returncode == 0, done.stderr[-3000:]
            return
    raise AssertionError(f"the erase died by a signal {tries} times: {done.stderr[-3000:]}")


if __name__ == "__main__" and sys.argv[1:2] == ["erase"]:
    _erase(sys.argv[2], sys.argv[3])
if __name__ == "__main__" and sys.argv[1:2] == ["write"]:
    _write(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
if __name__ == "__main__" and sys.argv[1:2] == ["poll"]:
    _poll(sys.argv[2], sys.argv[3])


# -- searching a pinned snapshot --------------------------------------------------------
class Pinned:
    """A process's ``Resources`` reading one ``Snapshot`` (``pipeline.stages.stage.Resources``)."""

    def __init__(self, settings, snap: Snapshot):
        self._settings, self.snap = settings, snap

    def settings(self):
        return self._settings

    def embedder(self):
        return make_embedder(self._settings)

    @contextmanager
    def view(self) -> Iterator[View]:
        with self.snap.view() as v:
            yield v
