"""Fuzzing the public surface: ``search``, ``search_async``, ``search_many``,
ingest records and the CLI's arguments (issue 8).

Each generated case must end in an answer that keeps dimple's promises or in
the typed error bad input gets (``InputError`` naming a real field,
``IngestValidationError`` with line and field, exit code 2 with one line);
never an uncaught exception, never a query running past its ``max_ms`` plus a
margin, never a store changed by a failed call. The default tier runs a few
hundred cases; the slow tier (``-m slow``) 5,000. Both print their
figures in the "hardening figures" section of pytest's summary.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from pipeline.contracts import QueryOptions, Results
from pipeline.errors import DimpleError, IngestValidationError, InputError
from pipeline.settings import Settings
from pipeline.store.lake.follow import bases
from tests import hostile
from tests.conftest import write_jsonl
from tests.figures import case, count, refused
from workers.settings import WorkerSettings

# Measured on a shared 2-core machine: a query that honours max_ms returns
# within the deadline plus the stages that always run (fuse, augment, scope,
# budget: a few ms); the margin absorbs scheduling noise.
MAX_MS_MARGIN_S = 1.0
# A query over max_ms + margin is run again this many times before the test
# fails: a query that ignores max_ms is over every time, while a loaded CI
# machine once stalled one query with max_ms=3 for 1.07 s (2026-12-01);
# Hypothesis's rerun of it passed, and here it runs in 5-7 ms.
MAX_MS_RUNS = 3

NAMESPACES = ["a", "b", "x' OR '1'='1", "%", "\u202eevil", "'; DROP TABLE memories; --"]
TYPES = ["text", "code", "*", "\" OR \"\"=\""]
TOPICS = ["t1", "t2", "ns:a", "a%b_c", "deploy OR window"]
CONCEPTS = ["c1", "NEAR(deploy window)", "🙂🚀"]
WORDS = ["deploy", "window", "redis", "ERR_CONN_RESET", "db-17", "OR", "*", "'", "%", "--", ";", "é"]

SEED = [
    {"id": f"m{i}", "namespace": NAMESPACES[i % len(NAMESPACES)], "content_type": TYPES[i % len(TYPES)],
     "content": " ".join(WORDS[(i + j) % len(WORDS)] for j in range(4)) + f" memory {i}",
     "topics": [TOPICS[i % len(TOPICS)]], "concepts": [CONCEPTS[i % len(CONCEPTS)]],
     **({"supersedes": [f"m{i - 1}"]} if i % 4 == 1 else {}),
     **({"conflicts": [f"m{i - 2}"]} if i % 5 == 2 else {})}
    for i in range(40)
]

# Fields an InputError may name: the query, the options object, each option
# (with a path inside it), or an unknown option the caller passed.
FIELDS = {"query", "options", "queries", "batch_size", *QueryOptions.model_fields}

_PROPERTY = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _checksum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory) -> Settings:
    data = tmp_path_factory.mktemp("fuzz")
    # audit rows are tested elsewhere; here they would only add a background writer
    settings = WorkerSettings(data_dir=data / "data", embedding_model="hash-64", _env_file=None, audit_enabled=False)
    from workers.cli.common import ingest_file

    ingest_file(write_jsonl(data / "seed.jsonl", SEED), settings, progress=False)
    built = bases(settings)  # the base the one write built: read for the membership
    MEMBERSHIP.clear()
    MEMBERSHIP.update(_membership(built[max(built)]))
    return settings


# memory id -> every topic key it belongs to in the fuzz store (user topics, its
# leaf, its ancestors: what a topic scope matches), read from the store itself
MEMBERSHIP: dict[str, set[str]] = {}


def _fingerprint(settings: Settings) -> tuple:
    """Everything a search could change: the lake's latest snapshot, its data
    files and the bases built for it, each file's name and bytes."""
    from tests.stores import published

    version, files = published(settings)
    return version, {f: _checksum(Path(f)) for f in files}, {n: (p, _checksum(p)) for n, p in bases(settings).items()}


def _membership(path: Path) -> dict[str, set[str]]:
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        out: dict[str, set[str]] = {}
        for mid, key in con.execute("SELECT memory_id, topic_key FROM memory_topics").fetchall():
            out.setdefault(mid, set()).add(key)
        return out
    finally:
        con.close()


@pytest.fixture
def fz(fuzz_store):
    """The fuzz store, in-process; searching must leave it byte for byte as it was."""
    import workers
    from workers import resources

    workers.configure(fuzz_store)
    before = _fingerprint(fuzz_store)
    yield fuzz_store
    resources.current().close_store()
    assert _fingerprint(fuzz_store) == before


# -- strategies ------------------------------------------------------------------------
_legal = st.one_of(hostile.evil, st.text(st.characters(exclude_characters="\x00"), min_size=1, max_size=20))


def valid_options():
    """Options of the right types and ranges, with hostile but legal strings."""
    label = st.one_of(st.sampled_from(TOPICS + TYPES + CONCEPTS), _legal)
    return st.fixed_dictionaries({}, optional={
        "namespace": st.one_of(st.sampled_from(NAMESPACES), _legal),
        "topics": st.lists(st.one_of(st.sampled_from(TOPICS), label), max_size=3),
        "content_type": st.one_of(st.sampled_from(TYPES), st.lists(st.one_of(st.sampled_from(TYPES), label), max_size=3)),
        "concepts": st.lists(st.one_of(st.sampled_from(CONCEPTS), label), max_size=2),
        "mode": st.sampled_from(["hybrid", "keyword", "semantic"]),
        "weights": st.fixed_dictionaries({"vector": st.floats(0, 10), "fts": st.floats(0.01, 10)}),
        "recency_boost": st.floats(0, 5),
        "now": st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2040, 1, 1),
                            timezones=st.sampled_from([None, UTC, timezone(timedelta(hours=-3))])),
        "max_units": st.integers(1, 30),
        "max_chars": st.integers(1, 2_000),
        "max_ms": st.integers(1, 300),
        "top_k": st.integers(1, 60),
    })


def any_options():
    """Anything: wrong types, out-of-range numbers, refused characters, unknown options."""
    return st.fixed_dictionaries({}, optional={
        "namespace": st.one_of(st.sampled_from(NAMESPACES), hostile.strings(), hostile.junk()),
        "topics": hostile.labels(TOPICS),
        "content_type": hostile.labels(TYPES),
        "concepts": hostile.labels(CONCEPTS),
        "mode": st.one_of(st.sampled_from(["hybrid", "keyword", "semantic"]), hostile.strings(), hostile.junk()),
        "weights": st.one_of(
            st.fixed_dictionaries({"vector": st.floats(-1, 2000) | st.floats(), "fts": st.floats(-1, 2000) | st.floats()}),
            st.dictionaries(hostile.short_text, st.floats(), max_size=2), hostile.junk()),
        "recency_boost": st.one_of(st.floats(0, 5), st.floats(), hostile.junk()),
        "now": hostile.datetimes(),
        "max_units": hostile.numbers(1, 30),
        "max_chars": hostile.numbers(1, 400),
        "max_ms": st.one_of(st.integers(1, 150), hostile.numbers(1, 150)),
        "top_k": hostile.numbers(1, 50),
        "colour": hostile.strings(),  # not an option: must be named as unknown
    })


def mostly(good, bad, share: int = 3):
    """``good`` in ``share`` of ``share + 1`` cases, else ``bad`` (so most cases reach the answer path)."""
    return st.integers(0, share).flatmap(lambda i: bad if i == share else good)


def options():
    return mostly(valid_options(), any_options())


_valid_query = st.one_of(
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join),
    _legal.filter(str.strip),
    hostile.long_text(10_000).filter(str.strip),
)
queries = mostly(_valid_query, st.one_of(hostile.strings(), hostile.long_text(10_500), hostile.junk()))


# -- checks ------------------------------------------------------------------------------
def _check_refusal(exc: InputError, opts: dict) -> None:
    root = exc.field.split(".")[0]
    assert root in FIELDS | set(opts), f"InputError names {exc.field!r}, not a field the caller gave"
    assert exc.reason


def _check_results(res: Results, text: str, opts: dict) -> None:
    """The promises a caller relies on, from the options the caller asked for (when they were valid)."""
    assert isinstance(res, Results) and res.query == text
    assert [r.rank for r in res.results] == list(range(1, len(res.results) + 1))
    assert len({r.id for r in res.results}) == len(res.results)
    o = QueryOptions.model_validate(opts)
    if o.namespace is not None:
        assert all(r.namespace == o.namespace for r in res.results)
    if o.content_type:
        assert all(r.content_type in o.content_type for r in res.results)
    if o.topics:
        with case("api.search.topic_scope"):
            for r in res.results:
                # by the store's own membership (tree topics included), not only by what the result reports
                assert MEMBERSHIP.get(r.id, set()) & set(o.topics), (r.id, o.topics)
                assert set(r.topics) & set(o.topics), (r.id, r.topics, o.topics)
            count("api.search.topic_scope", "results checked", len(res.results))
    if o.concepts:
        assert all(set(r.concepts) & set(o.concepts) for r in res.results)
    if o.max_units is not None:
        assert len(res.results) <= o.max_units
    if o.max_chars is not None:
        assert sum(len(r.content) for r in res.results) <= o.max_chars


def _over_max_ms(res: Results, opts: dict, elapsed: float) -> str | None:
    """Why this run broke its max_ms (with the stage timings), or None."""
    o = QueryOptions.model_validate(opts)
    if o.max_ms is None or elapsed <= o.max_ms / 1000 + MAX_MS_MARGIN_S:
        return None
    return f"{elapsed:.3f} s for max_ms={o.max_ms}, stages (ms): {res.timings}"


def _timed_search(text, opts: dict, use_async: bool) -> tuple[Results, float]:
    from workers.api import search, search_async

    t0 = time.monotonic()
    res = search_async(text, **opts).get(timeout=30) if use_async else search(text, **opts)
    return res, time.monotonic() - t0


def _one_search(text, opts: dict, use_async: bool) -> None:
    with case("api.search"):
        try:
            res, elapsed = _timed_search(text, opts, use_async)
        except InputError as exc:
            _check_refusal(exc, opts)
            refused("api.search")
            return
        _check_results(res, text, opts)
        overruns = []
        while (why := _over_max_ms(res, opts, elapsed)) is not None:
            overruns.append(why)
            assert len(overruns) < MAX_MS_RUNS, "every run over its max_ms:\n" + "\n".join(overruns)
            res, elapsed = _timed_search(text, opts, use_async)
        count("api.search", "results checked", len(res.results))


def _many(items: list, batch_size, return_exceptions: bool) -> None:
    from workers.api import search_many

    with case("api.search_many"):
        try:
            out = search_many(items, batch_size=batch_size, return_exceptions=return_exceptions)
        except InputError as exc:
            # a query's own field, named with its place; a query that is none at all: its place
            field = re.sub(r"^queries\[\d+\]\.", "", exc.field)
            field = "queries" if re.fullmatch(r"queries\[\d+\]", field) else field
            assert field.split(".")[0] in FIELDS | {k for i in items if isinstance(i, dict) for k in i}
            refused("api.search_many")
            return
        assert len(out) == len(items)
        for item, res in zip(items, out):
            text = item if isinstance(item, str) else item.get("query", item.get("text")) if isinstance(item, dict) else item[0]
            if isinstance(res, DimpleError):
                assert return_exceptions
                continue
            assert isinstance(res, Results) and res.query == text
        count("api.search_many", "queries answered", len(out))






# -- search_many -----------------------------------------------------------------------
many_items = st.lists(
    mostly(
        st.one_of(_valid_query, st.builds(lambda q, o: {"query": q, **o}, _valid_query, valid_options()),
                  st.tuples(_valid_query, valid_options())),
        st.one_of(queries, st.builds(lambda q, o: {"query": q, **o}, queries, options()),
                  st.builds(lambda o: dict(o), options())),  # the last: no query at all
        share=8,
    ),
    min_size=1, max_size=4,
)
batch_sizes = mostly(st.one_of(st.none(), st.integers(1, 3)), st.one_of(st.integers(-2, 6), hostile.junk()))






# -- ingest records ----------------------------------------------------------------------
def _valid_record():
    return st.fixed_dictionaries(
        {"namespace": st.one_of(st.sampled_from(NAMESPACES), _legal.filter(str.strip).map(lambda s: s[:200])),
         "content": st.one_of(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join),
                              _legal.filter(str.strip))},
        optional={
            "id": st.one_of(st.sampled_from(["m1", "m2", "new-1"]), _legal.filter(str.strip)),
            "content_type": st.sampled_from(TYPES),
            "created_at": st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2040, 1, 1)).map(datetime.isoformat),
            "topics": st.lists(st.sampled_from(TOPICS + hostile.EVIL[:10]), max_size=3),
            "concepts": st.lists(st.sampled_from(CONCEPTS + hostile.EVIL[10:20]), max_size=3),
            "supersedes": st.lists(st.sampled_from(["m1", "m3"]), max_size=2, unique=True),
            "context": _legal,
            "metadata": st.dictionaries(_legal, st.one_of(_legal, st.integers(), st.booleans()), max_size=3),
        },
    )


def _record():
    return st.fixed_dictionaries(
        {"namespace": st.one_of(st.sampled_from(NAMESPACES), hostile.strings(), hostile.junk()),
         "content": st.one_of(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join),
                              hostile.strings(), hostile.long_text(21_000), hostile.junk())},
        optional={
            "id": st.one_of(st.sampled_from(["m1", "m2", "new-1"]), hostile.strings(), hostile.junk()),
            "content_type": st.one_of(st.sampled_from(TYPES), hostile.strings(), hostile.junk()),
            "created_at": hostile.datetimes(),
            "topics": hostile.labels(TOPICS),
            "concepts": hostile.labels(CONCEPTS),
            "supersedes": hostile.labels(["m1", "m3", "nope"]),
            "conflicts": hostile.labels(["m2", "m4"]),
            "supported_by": hostile.labels(["m5"]),
            "context": st.one_of(hostile.strings(), hostile.junk()),
            "metadata": st.one_of(
                st.dictionaries(hostile.strings(), st.one_of(hostile.strings(), st.floats(), st.integers())), hostile.junk()),
            "colour": hostile.strings(),
        },
    )


def _line(record) -> str:
    return json.dumps(record, default=lambda v: v.isoformat() if hasattr(v, "isoformat") else repr(v))


raw_lines = st.one_of(
    _record().map(_line),
    _record().map(_line).map(lambda s: s[: len(s) // 2]),  # cut short
    hostile.strings().map(lambda s: s.replace("\n", " ").replace("\r", " ")),  # one line stays one line
    st.just("[" * 50_000 + "]" * 50_000),
)
ingest_files = st.lists(
    mostly(_valid_record().map(_line), st.one_of(_record().map(_line), raw_lines), share=5), min_size=1, max_size=4,
)


@pytest.fixture
def ingest_store(tmp_path):
    """A small store of its own: successful fuzz ingests change it."""
    from workers.cli.common import ingest_file

    # a refused ingest is checked to publish nothing (tests.stores.published reads the lake's snapshot and files)
    settings = WorkerSettings(data_dir=tmp_path / "data", embedding_model="hash-64", _env_file=None, audit_enabled=False)
    ingest_file(write_jsonl(tmp_path / "seed.jsonl", SEED[:8]), settings, progress=False)
    return settings


def _ingest_case(settings: Settings, tmp_path: Path, lines: list[str], skip_invalid: bool) -> None:
    from pipeline.store.ingest import derive_id
    from pipeline.store.writes import get
    from tests.stores import published
    from workers.cli.common import ingest_file

    with case("ingest"):
        path = tmp_path / "fuzz.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
        before = published(settings)
        try:
            report = ingest_file(path, settings, skip_invalid=skip_invalid, progress=False)
        except (IngestValidationError, InputError) as exc:
            if isinstance(exc, IngestValidationError):
                assert exc.errors and all(e.line >= 1 and e.field and e.reason for e in exc.errors)
            # nothing written: the same snapshot and data files
            assert published(settings) == before
            refused("ingest")
            return
        written = report.inserted + report.updated
        count("ingest", "memories written", written)
        bad = {e.line for e in report.skipped}
        wanted = set()
        for number, raw in enumerate(lines, start=1):
            if number in bad or not raw.strip():
                continue
            data = json.loads(raw)
            wanted.add(data.get("id") or derive_id(data["namespace"], data["content"]))
        found = {m["id"] for m in get(settings, sorted(wanted))}  # everything accepted is there
        assert found == wanted


@hsettings(max_examples=12, **_PROPERTY)
@given(lines=ingest_files, skip_invalid=st.booleans())
def test_fuzz_ingest(ingest_store, tmp_path, lines, skip_invalid):
    _ingest_case(ingest_store, tmp_path, lines, skip_invalid)




# -- CLI arguments -------------------------------------------------------------------------
_arg = st.one_of(st.sampled_from(WORDS + NAMESPACES), hostile.strings(), st.integers(-5, 10**9).map(str),
                 st.sampled_from(["nan", "inf", "-1", "0", "1e999", "", "--", "-n"]))
_good_flag = st.one_of(
    st.tuples(st.sampled_from(["--namespace", "--topic", "--content-type", "--concept"]),
              st.sampled_from(NAMESPACES + TOPICS + TYPES + CONCEPTS)),
    st.tuples(st.just("--mode"), st.sampled_from(["hybrid", "keyword", "semantic"])),
    st.tuples(st.sampled_from(["--max-units", "--max-chars", "--max-ms"]), st.integers(1, 500).map(str)),
    st.tuples(st.just("--recency-boost"), st.floats(0, 3).map(str)),
    st.tuples(st.just("--now"), st.sampled_from(["2025-01-01T00:00:00Z", "2030-06-01"])),
)
_any_flag = st.tuples(st.sampled_from(["--namespace", "--topic", "--content-type", "--concept", "--mode", "--max-units",
                                       "--max-chars", "--max-ms", "--recency-boost", "--now", "--bogus"]), _arg)
_flags = st.lists(mostly(_good_flag, _any_flag), max_size=4).map(
    lambda pairs: [x for p in pairs for x in p])
_word = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join).filter(lambda w: not w.startswith("-"))
argvs = st.one_of(
    st.builds(lambda q, f, j: ["search", q, *f, *(["--json"] if j else [])], _word, _flags, st.booleans()),
    st.builds(lambda q, f, j: ["search", q, *f, *(["--json"] if j else [])], _word, _flags, st.booleans()),
    st.builds(lambda q, f, j: ["search", q, *f, *(["--json"] if j else [])], _arg, _flags, st.booleans()),
    st.builds(lambda f: ["search", *f], _flags),
    st.builds(lambda a: ["audit", "tail", "-n", a], _arg),
    st.builds(lambda a: ["audit", "show", a], _arg),
    st.builds(lambda a: ["audit", "explain", a, "--no-replay"], _arg),
    st.builds(lambda a: ["ingest", a], _arg.filter(lambda a: not _exists(a))),
    st.lists(_arg, max_size=3),
    st.just(["stats", "--json"]),
)


def _exists(name: str) -> bool:
    try:
        return Path(name).exists()
    except OSError:  # e.g. a name too long for the file system
        return False


def _cli_case(argv: list[str], capsys) -> None:
    from workers.cli import main

    with case("cli"):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        assert code in (0, 2), (argv, code, err)
        if code == 2 and not err and out.startswith("usage:"):
            refused("cli")  # no command (or no audit action): the help, and exit code 2
        elif code == 2:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("dimple: error:"), (argv, err)
            refused("cli")
        else:
            assert out.strip() or argv[:2] == ["audit", "tail"]  # an empty log prints no rows


@pytest.fixture
def cli_env(fz, monkeypatch):
    monkeypatch.setenv("DIMPLE_DATA_DIR", str(fz.data_dir))
    monkeypatch.setenv("DIMPLE_EMBEDDING_MODEL", "hash-64")
    monkeypatch.setenv("DIMPLE_AUDIT_ENABLED", "false")
    from workers.settings import get_settings

    get_settings.cache_clear()
    yield fz
    get_settings.cache_clear()


@hsettings(max_examples=40, **_PROPERTY)
@given(argv=argvs)
def test_fuzz_cli(cli_env, capsys, argv):
    _cli_case(argv, capsys)


