"""What ``search.augment`` keeps of a base between queries
(``pipeline.store.graph.BaseGraph``, ``View.graph``): the answer is the one a
fresh read gives, whatever was kept, evicted, written in deltas since, or
compacted; and a query whose memories were read before runs no SQL."""

from __future__ import annotations

import tempfile
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from pipeline.contracts import Batch, Budget, Fused, LegRun, Query, QueryOptions, QueryState
from pipeline.stages.augment import augment_batch
from pipeline.stages.budget import budget_batch
from pipeline.stages.scope import scope_batch
from pipeline.store.graph import BaseGraph
from pipeline.store.lake.follow import reader_for
from pipeline.store.reader import Reader
from pipeline.store.writes import parse_records, write
from tests.stores import compacted
from tests.unit.test_scope import CONCEPTS, NAMESPACES, TOPICS, TYPES, stores
from workers.settings import WorkerSettings

cases = st.lists(st.tuples(
    st.fixed_dictionaries({
        "namespace": st.none() | st.sampled_from(NAMESPACES),
        "topics": st.lists(st.sampled_from(TOPICS), unique=True, max_size=1),
        "content_type": st.lists(st.sampled_from(TYPES), unique=True, max_size=1),
        "concepts": st.lists(st.sampled_from(CONCEPTS), unique=True, max_size=1),
        "supersession": st.sampled_from(["annotate", "promote", "hide"]),
        "max_units": st.none() | st.integers(1, 6),
    }),
    st.randoms(),
), min_size=1, max_size=5)


def _state(opts: dict, order: list[str]) -> QueryState:
    options = {k: v for k, v in opts.items() if k != "max_units" and v not in (None, [])}
    q = Query(id="q", text="t", started_at=1.7e9, options=QueryOptions(**options), weights={"vector": 1.0, "fts": 1.0},
              budget=Budget(max_units=opts["max_units"]))
    fused = [Fused(id=m, rrf=1.0 / (60 + i), score=1.0 / (60 + i), ranks={"fts": i}) for i, m in enumerate(order, 1)]
    return QueryState(query=q, legs={"fts": LegRun(leg="fts", ran=True)}, fused=fused)


def _serve(v, state: QueryState, base: BaseGraph | None) -> dict:
    out = augment_batch(Batch(states=[state]), v.cursor, 40, v.overlay, base)
    return budget_batch(scope_batch(out)).model_dump(mode="json", exclude={"states": {0: {"timings"}}})


def _write(settings, records=(), forget=()):
    write(settings, parse_records(list(records), settings) if records else None, list(forget) or None)


def _settings(tmp: str) -> WorkerSettings:
    """A fresh store (a lake) for one of hypothesis' examples."""
    return WorkerSettings(data_dir=Path(tmp) / "data", embedding_model="hash-64", _env_file=None, audit_enabled=False)


def _answers_agree(reader: Reader, kept: BaseGraph, ids: list[str], drawn) -> None:
    for opts, rnd in drawn:
        order = list(ids)
        rnd.shuffle(order)
        with reader.snapshot().view() as v:
            assert _serve(v, _state(opts, order), kept) == _serve(v, _state(opts, order), None)


# 4 examples here (each writes a lake afresh and reads it, ~1.7 s), 24 more in the slow tier
# (tests/slow/test_base_graph_slow.py)
@hsettings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=stores(max_size=10), drawn=cases, rewrite=st.data())
def test_a_kept_graph_gives_the_answer_of_a_fresh_read_across_deltas(records, drawn, rewrite):
    check_kept_graph(records, drawn, rewrite)


def check_kept_graph(records, drawn, rewrite) -> None:
    """A graph kept across reads (smaller than the store) answers as a fresh read does, before and
    after a delta that rewrites one memory and forgets another."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = _settings(tmp)
        _write(settings, records)
        reader = reader_for(settings)
        try:
            ids = [r["id"] for r in records] + ["never-written"]
            kept = BaseGraph(capacity=3)  # smaller than the store: memories are dropped and read again
            _answers_agree(reader, kept, ids, drawn)
            # a delta over the same base rewrites one memory (new namespace, edges) and forgets another
            picked = rewrite.draw(st.sampled_from(records))
            first = records[0]["id"]
            changed = dict(picked, namespace=NAMESPACES[0], content="rewritten text",
                           supersedes=[first] if picked["id"] != first else [])
            _write(settings, [changed])
            gone = rewrite.draw(st.sampled_from(ids[:-1]))
            _write(settings, forget=[gone])
            _answers_agree(reader, kept, ids, drawn)
        finally:
            reader.close()


def test_after_a_compaction_a_rewritten_memory_is_served_as_rewritten(settings):
    _write(settings, [{"id": "m", "namespace": "code", "content": "the old text"},
                      {"id": "n", "namespace": "code", "content": "the other text", "supersedes": ["m"]}])
    reader = reader_for(settings)
    try:
        order = ["m", "n"]
        with reader.snapshot().view() as v:
            first = _serve(v, _state({"max_units": None, "supersession": "annotate"}, order), v.graph)
        assert first["states"][0]["results"][0]["content"] == "the old text"
        _write(settings, [{"id": "m", "namespace": "code", "content": "the new text"}])
        compacted(settings)
        reader.snapshot()  # sees the new base: loads it in the background
        reader.wait_ready()
        with reader.snapshot().view() as v:
            assert v.overlay.empty  # the rewrite is in the new base, not in a delta over the old one
            served = _serve(v, _state({"max_units": None, "supersession": "annotate"}, order), v.graph)
        by_id = {r["id"]: r for r in served["states"][0]["results"]}
        assert by_id["m"]["content"] == "the new text"
        # m declared nothing in its rewrite: n still supersedes it (n's own edge)
        assert [link["id"] for link in by_id["m"]["superseded_by"]] == ["n"]
    finally:
        reader.close()


class _Counting:
    """A cursor that counts the statements it runs."""

    def __init__(self, cursor):
        self.cursor, self.statements = cursor, 0

    def execute(self, *args, **kwargs):
        self.statements += 1
        return self.cursor.execute(*args, **kwargs)


def test_a_query_whose_memories_were_read_before_runs_no_sql(settings):
    _write(settings, [{"id": f"m{i}", "namespace": "code", "content": f"note {i}", "topics": ["deploy"],
                       "supersedes": [f"m{i - 1}"] if i else []} for i in range(6)])
    reader = reader_for(settings)
    try:
        kept = BaseGraph()
        with reader.snapshot().view() as v:
            counting = _Counting(v.cursor)
            state = _state({"max_units": None, "supersession": "promote"}, ["m0", "m3"])
            first = augment_batch(Batch(states=[state]), counting, 40, v.overlay, kept)
            assert counting.statements > 0
            read = counting.statements
            state = _state({"max_units": None, "supersession": "promote"}, ["m0", "m3"])
            again = augment_batch(Batch(states=[state]), counting, 40, v.overlay, kept)
            assert counting.statements == read
            assert again.states[0].results == first.states[0].results
            assert [r.id for r in again.states[0].results][:2] == ["m5", "m0"]  # the chain's newest, promoted
    finally:
        reader.close()


# A base with every kind of graph context: topics, concepts, the three edge kinds (a conflict both
# ways, one declared by a memory of its own), ids and contents beyond ASCII, a memory without topics.
GRAPH_RECORDS = [
    {"id": "a", "namespace": "code", "content": "deploy window moved", "topics": ["deploy", "ops"],
     "concepts": ["window"]},
    {"id": "b", "namespace": "notes", "content": "Встреча в Москве перенесена", "topics": ["meetings"],
     "supersedes": ["a"], "concepts": ["moscow", "window"]},
    {"id": "c-東京", "namespace": "notes", "content_type": "decision", "content": "東京の会議は金曜日",
     "conflicts": ["b"], "supported_by": ["a"]},
    {"id": "d", "namespace": "code", "content": "no topics here", "conflicts": ["c-東京"], "supersedes": ["b"]},
    {"id": "e", "namespace": "code", "content": "café in München", "topics": ["deploy"], "supported_by": ["d", "a"]},
]
ASKED = [["a", "b", "c-東京", "d", "e"], ["e"], ["c-東京", "nowhere"], ["b", "d", "x" * 300], []]


def test_the_host_caches_graph_part_answers_as_the_base_does(settings, tmp_path):
    """Every memory's row, topics and concepts, and every edge touching it,
    looked up in the part (written to the host cache, then mapped again by a
    second process's ``HostCache``) are what SQL on the base reads."""
    import duckdb

    from pipeline.store.graph import read_parts
    from pipeline.store.hostcache import HostCache

    _write(settings, GRAPH_RECORDS)
    base = compacted(settings)
    con = duckdb.connect(str(base), read_only=True)
    try:
        written = HostCache(tmp_path / "cache", base).graph(con)
        mapped = HostCache(tmp_path / "cache", base)
        again = mapped.graph(con)
        assert mapped.read == []  # the second one mapped what the first wrote
        arrays, _ = read_parts(con)
        assert len(arrays["edge_dst"]) >= 6 and len(arrays["conflict_src"]) == 2
        for part in (written, again):
            for ids in ASKED:
                by_part, by_sql = BaseGraph(part=lambda p=part: p), BaseGraph()
                assert by_part.memories(con, ids) == by_sql.memories(con, ids)
                assert by_part.edges(con, ids) == by_sql.edges(con, ids)
        assert BaseGraph(part=lambda: again).memories(con, ["c-東京"])["c-東京"][0][4] == "東京の会議は金曜日"
    finally:
        con.close()


def test_a_reader_serves_augment_from_the_graph_part_with_no_sql(settings):
    """A reader with a host cache (the default) reads a query's graph context
    from the part: the same answer as SQL on the base, and no statement on
    the stage's cursor, even for memories no earlier query read."""
    _write(settings, GRAPH_RECORDS)
    compacted(settings)
    reader = reader_for(settings)
    try:
        reader.snapshot()
        reader.wait_ready()
        order = ["e", "c-東京", "a", "d", "b"]
        served = {}
        with reader.snapshot().view() as v:
            assert v.graph is not None and v.graph.part() is not None
            for supersession in ("annotate", "promote", "hide"):
                counting = _Counting(v.cursor)
                state = _state({"max_units": None, "supersession": supersession}, order)
                served[supersession] = augment_batch(Batch(states=[state]), counting, 40, v.overlay,
                                                     BaseGraph(part=v.graph.part))
                assert counting.statements == 0
            assert not v.cursor.opened  # nor was a cursor on the base opened for them
        with reader.snapshot().view() as v:
            for supersession, out in served.items():
                fresh = augment_batch(Batch(states=[_state({"max_units": None, "supersession": supersession}, order)]),
                                      v.cursor, 40, v.overlay, None)
                assert out.states[0].results == fresh.states[0].results
                assert any(r.conflicts for r in out.states[0].results)
    finally:
        reader.close()


def test_a_view_opens_its_cursor_on_first_use_and_closes_it_with_the_view(settings):
    """A stage's view opens a cursor on the base only when the stage asks the
    base something, and it is closed when the stage's view ends."""
    _write(settings, GRAPH_RECORDS)
    compacted(settings)
    reader = reader_for(settings)
    try:
        with reader.snapshot().view() as v:
            lazy = v.cursor
            assert not lazy.opened
            assert lazy.execute("SELECT count(*) FROM memories").fetchone()[0] == len(GRAPH_RECORDS)
            assert lazy.opened
            real = lazy._cur
        assert not lazy.opened
        with pytest.raises(duckdb.ConnectionException):
            real.execute("SELECT 1")
        with pytest.raises(duckdb.ConnectionException):  # nor does the view's own open again
            lazy.execute("SELECT 1")
        with reader.snapshot().view() as v:
            unused = v.cursor
        with pytest.raises(duckdb.ConnectionException):  # one never opened is as closed
            unused.execute("SELECT 1")
    finally:
        reader.close()
