"""What ``search.augment`` keeps of a base between queries
(``pipeline.store.graph.BaseGraph``, ``View.graph``): the answer is the one a
fresh read gives, whatever was kept, evicted, written in deltas since, or
compacted; and a query whose memories were read before runs no SQL."""

from __future__ import annotations

import tempfile
from pathlib import Path

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


# 12 examples: each writes a lake afresh and reads it (~1.5 s; 30 took 108-136 s of the default tier)
@hsettings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=stores(max_size=10), drawn=cases, rewrite=st.data())
def test_a_kept_graph_gives_the_answer_of_a_fresh_read_across_deltas(records, drawn, rewrite):
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
