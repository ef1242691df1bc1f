"""Augment carries only the candidates the budget can keep: after scope and
budget the answer is exactly what carrying every candidate gives.

The reference run is the same stages with augment told there is no
``max_units`` (so it carries every candidate, as before the trim) and the
budget given the real one back."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from pipeline.contracts import Batch, Budget, Fused, LegRun, Query, QueryOptions, QueryState
from pipeline.embedders import HashEmbedder
from pipeline.stages.augment import augment_batch
from pipeline.stages.budget import budget_batch
from pipeline.stages.scope import scope_batch
from pipeline.store import ingest
from pipeline.store.database import Store
from tests.unit.test_scope import CONCEPTS, NAMESPACES, TOPICS, TREE, TYPES, stores
from workers.settings import WorkerSettings

options = st.fixed_dictionaries({
    "namespace": st.none() | st.sampled_from(NAMESPACES),
    "topics": st.lists(st.sampled_from(TOPICS + ["ns:a"]), unique=True, max_size=2),
    "content_type": st.lists(st.sampled_from(TYPES), unique=True, max_size=2),
    "concepts": st.lists(st.sampled_from(CONCEPTS), unique=True, max_size=1),
})
budgets = st.fixed_dictionaries({
    "max_units": st.none() | st.integers(1, 14),
    "max_chars": st.none() | st.integers(1, 400),
    "timed_out": st.booleans(),
})


def _state(opts: dict, budget: dict, order: list[str]) -> QueryState:
    q = Query(id="q", text="t", started_at=1.7e9, options=QueryOptions(**{k: v for k, v in opts.items() if v not in (None, [])}),
              weights={"vector": 1.0, "fts": 1.0},
              budget=Budget(max_units=budget["max_units"], max_chars=budget["max_chars"],
                            max_ms=50 if budget["timed_out"] else None))
    legs = {"fts": LegRun(leg="fts", ran=True, profile={"timed_out": True} if budget["timed_out"] else {})}
    # every memory is a candidate, those outside the scope included, so scope has something to drop
    fused = [Fused(id=m, rrf=1.0 / (60 + i), score=1.0 / (60 + i), ranks={"fts": i}) for i, m in enumerate(order, 1)]
    return QueryState(query=q, legs=legs, fused=fused)


def _base(path: Path, records: list[dict]) -> Store:
    """A base file holding ``records`` (built straight into ``path``, as a
    compaction builds one; no lake: only augment reads it), opened read-only."""
    settings = WorkerSettings(data_dir=path.parent, embedding_model="hash-64", _env_file=None, tree=TREE,
                              audit_enabled=False)
    with Store.open(path, read_only=False, embedding_model="hash-64", embedding_dim=64) as store:
        parsed = ingest.parse_lines([json.dumps(r) for r in records], settings.limits)
        ingest.validate(parsed, store, skip_invalid=False)
        ingest.ingest_records(store, parsed.records, HashEmbedder(64), settings)
    return Store.open(path, read_only=True)


def _answer(state: QueryState) -> dict:
    return state.model_dump(mode="json", exclude={"timings", "beyond_budget"})


def _run(con, state: QueryState, trim: bool) -> tuple[QueryState, int]:
    cap = state.query.budget
    if not trim:
        state.query.budget = Budget()
    augmented = augment_batch(Batch(states=[state]), con, 40)
    carried = len(augmented.states[0].results)
    augmented.states[0].query.budget = cap
    return budget_batch(scope_batch(augmented)).states[0], carried


augment_cases = st.lists(st.tuples(options, budgets, st.randoms()), min_size=1, max_size=6)


# 12 examples here (~0.3 s each), 60 more in the slow tier (tests/slow/test_augment_slow.py)
@hsettings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=stores(max_size=14), cases=augment_cases)
def test_trimmed_augment_gives_the_answer_of_carrying_everything(records, cases):
    check_trimmed_augment(records, cases)


def check_trimmed_augment(records, cases) -> None:
    """Augment trimmed to what the budget can keep gives the answer of carrying every candidate."""
    with tempfile.TemporaryDirectory() as tmp:
        store = _base(Path(tmp) / "base.duckdb", records)
        try:
            con = store.cursor()
            for opts, budget, rnd in cases:
                order = [r["id"] for r in records]
                rnd.shuffle(order)
                trimmed, carried = _run(con, _state(opts, budget, order), trim=True)
                reference, carried_all = _run(con, _state(opts, budget, order), trim=False)
                assert _answer(trimmed) == _answer(reference)
                assert carried <= carried_all
                if budget["max_units"] is not None:
                    # at most max_units in-scope results, plus the out-of-scope ones scope drops
                    assert carried <= budget["max_units"] + trimmed.scope_dropped
        finally:
            store.close()


