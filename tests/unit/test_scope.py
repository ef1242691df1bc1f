"""Scoping: no result and no graph link outside the query's scope, ever.

Hand-built states for ``in_scope`` / ``scope_batch``, then a property over
random stores run through the real in-process pipeline."""

from __future__ import annotations

import json
import tempfile
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck
from hypothesis import strategies as st

from pipeline.contracts import Batch, GraphLink, Query, QueryOptions, QueryState, Result, Scope, make_query
from pipeline.settings import Settings, TreeSettings
from pipeline.stages.scope import in_scope, scope_batch
from pipeline.store import ingest
from pipeline.store.database import Store
from pipeline.store.lake.follow import bases
from pipeline.store.vector import load_tree
from pipeline.store.writes import write
from workers.settings import WorkerSettings


def _link(mid, ns="a", ctype="code", topics=(), concepts=()):
    return GraphLink(id=mid, preview=mid, namespace=ns, content_type=ctype, topics=list(topics), concepts=list(concepts))


def _result(rank, mid, ns="a", ctype="code", topics=("t1",), concepts=("c1",), **links):
    return Result(
        rank=rank, id=mid, score=1.0, rrf=1.0, namespace=ns, content_type=ctype,
        created_at=datetime(2025, 1, 1), content=mid, preview=mid,
        topics=list(topics), concepts=list(concepts), **links,
    )


def _state(options: dict, results: list[Result]) -> QueryState:
    return QueryState(query=Query(id="q", text="t", options=QueryOptions(**options)), results=results)


# -- in_scope ------------------------------------------------------------------------
def test_empty_scope_lets_everything_through():
    assert Scope().empty
    assert in_scope(_result(1, "m", ns="zz", ctype="x", topics=(), concepts=()), Scope())


@pytest.mark.parametrize(
    "scope,inside",
    [
        (Scope(namespace="a"), True),
        (Scope(namespace="b"), False),
        (Scope(content_types=("code",)), True),
        (Scope(content_types=("text", "code")), True),
        (Scope(content_types=("text",)), False),
        (Scope(topics=("t1",)), True),
        (Scope(topics=("t9", "t1")), True),  # any one topic is enough
        (Scope(topics=("t9",)), False),
        (Scope(concepts=("c1",)), True),
        (Scope(concepts=("c2",)), False),
        (Scope(namespace="a", content_types=("code",), topics=("t1",), concepts=("c1",)), True),
        (Scope(namespace="a", content_types=("code",), topics=("t1",), concepts=("c2",)), False),  # all must hold
    ],
)
def test_in_scope_each_filter(scope, inside):
    item = _result(1, "m", ns="a", ctype="code", topics=("t1", "t2"), concepts=("c1",))
    assert in_scope(item, scope) is inside
    link = _link("m", ns="a", ctype="code", topics=("t1", "t2"), concepts=("c1",))
    assert in_scope(link, scope) is inside


def test_memory_without_topics_is_outside_a_topic_scope():
    assert not in_scope(_result(1, "m", topics=()), Scope(topics=("t1",)))
    assert not in_scope(_link("m", concepts=()), Scope(concepts=("c1",)))


def test_the_scope_is_resolved_once_from_the_options_and_carried(settings):
    q = make_query("t", {"namespace": "a", "topics": ["y", "x"], "content_type": "code", "concepts": ["c"]}, settings)
    assert q.scope == Scope(namespace="a", topics=("x", "y"), content_types=("code",), concepts=("c",))
    # it travels with the query as JSON and comes back equal, not re-derived
    again = Query.model_validate_json(q.model_dump_json())
    assert again.scope == q.scope and "scope" in again.model_fields_set
    assert Query(text="t", options=q.options, scope=Scope()).scope.empty  # a given scope is kept as given


# -- scope_batch ---------------------------------------------------------------------
def test_scope_batch_drops_results_and_links_and_renumbers():
    good = dict(ns="a", ctype="code", topics=("t1",), concepts=("c1",))
    links_in = _link("in", ns="a", ctype="code", topics=("t1",), concepts=("c1",))
    results = [
        _result(1, "other-ns", ns="b"),
        _result(2, "keep1",
                superseded_by=[links_in, _link("sup-other-ns", ns="b", topics=("t1",), concepts=("c1",))],
                conflicts=[_link("con-text", ctype="text", topics=("t1",), concepts=("c1",)), links_in],
                supported_by=[_link("sup-no-topic", concepts=("c1",)), _link("sup-no-concept", topics=("t1",))]),
        _result(3, "wrong-type", ctype="text"),
        _result(4, "wrong-topic", topics=("t2",)),
        _result(5, "wrong-concept", concepts=("c2",)),
        _result(6, "keep2", **{k: v for k, v in good.items() if k != "ns"}),
    ]
    state = _state({"namespace": "a", "content_type": "code", "topics": ["t1"], "concepts": ["c1"]}, results)
    out = scope_batch(Batch(states=[state])).states[0]
    assert [(r.rank, r.id) for r in out.results] == [(1, "keep1"), (2, "keep2")]
    keep1 = out.results[0]
    assert [l.id for l in keep1.superseded_by] == ["in"]
    assert [l.id for l in keep1.conflicts] == ["in"]
    assert keep1.supported_by == []
    assert out.scope_dropped == 4
    assert "scope" in out.timings


def test_scope_batch_without_filters_changes_nothing():
    results = [_result(1, "x", ns="b", conflicts=[_link("l", ns="c")]), _result(2, "y", ns="a")]
    state = _state({}, [r.model_copy(deep=True) for r in results])
    out = scope_batch(Batch(states=[state])).states[0]
    assert out.results == results and out.scope_dropped == 0


def test_scope_batch_scopes_each_query_by_its_own_options():
    res = [_result(1, "in-a", ns="a"), _result(2, "in-b", ns="b")]
    batch = Batch(states=[
        _state({"namespace": "a"}, [r.model_copy(deep=True) for r in res]),
        _state({"namespace": "b"}, [r.model_copy(deep=True) for r in res]),
    ])
    out = scope_batch(batch)
    assert [[(r.rank, r.id) for r in s.results] for s in out.states] == [[(1, "in-a")], [(1, "in-b")]]


# -- property through the real pipeline -----------------------------------------------
NAMESPACES = ["a", "b", "c"]
TYPES = ["text", "code", "note"]
TOPICS = ["t1", "t2", "t3"]
CONCEPTS = ["c1", "c2"]
WORDS = ["deploy", "window", "tuesday", "redis", "cache", "error", "timeout", "budget", "release", "owner"]
# Query topics may also name tree keys every memory of a namespace has: "ns:<namespace>".
QUERY_TOPICS = TOPICS + ["ns:a", "ns:b", "t-unknown"]


@st.composite
def stores(draw, max_size=12):
    n = draw(st.integers(1, max_size))
    records = []
    for i in range(n):
        earlier = [f"m{j}" for j in range(i)]
        edge = st.lists(st.sampled_from(earlier), unique=True, max_size=2) if earlier else st.just([])
        records.append({
            "id": f"m{i}",
            "namespace": draw(st.sampled_from(NAMESPACES)),
            "content_type": draw(st.sampled_from(TYPES)),
            "content": " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=5))) + f" item{i}",
            "topics": draw(st.lists(st.sampled_from(TOPICS), unique=True, max_size=2)),
            "concepts": draw(st.lists(st.sampled_from(CONCEPTS), unique=True, max_size=2)),
            "supersedes": draw(edge),
            "conflicts": draw(edge),
            "supported_by": draw(edge),
        })
    return records


queries = st.fixed_dictionaries({
    "text": st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join),
    "namespace": st.none() | st.sampled_from(NAMESPACES + ["nowhere"]),
    "topics": st.lists(st.sampled_from(QUERY_TOPICS), unique=True, max_size=2),
    # an index into the store's own tree topic keys (leaf or ancestor), added to "topics"
    "tree_topic": st.none() | st.integers(0, 10**6),
    "content_type": st.lists(st.sampled_from(TYPES), unique=True, max_size=2),
    "concepts": st.lists(st.sampled_from(CONCEPTS), unique=True, max_size=1),
    "mode": st.sampled_from(["hybrid", "keyword", "semantic"]),
})

# Beam 4 over at most 3 namespaces, and leaves of 64 (every store here has fewer
# memories per namespace): the vector leg scores every in-scope memory, so a
# semantic or hybrid query must return all of them.
TREE = TreeSettings(beam_width=4, max_leaf_items=64)


def _expected_in_scope(record: dict, tree_topics: set[str], q: dict) -> bool:
    """The scope rule worked out from the records as written (and the tree's membership),
    not from what the pipeline reports."""
    if q["namespace"] is not None and record["namespace"] != q["namespace"]:
        return False
    if q["content_type"] and record["content_type"] not in q["content_type"]:
        return False
    if q["topics"] and not (set(record["topics"]) | tree_topics) & set(q["topics"]):
        return False
    if q["concepts"] and not set(record["concepts"]) & set(q["concepts"]):
        return False
    return True


def _ingest(data_dir: Path, records: list[dict]) -> tuple[Settings, dict[str, set[str]]]:
    """Write ``records`` into a fresh store (a lake) under ``data_dir`` in one write, as
    ingest does. Returns the settings and each memory's tree topics (leaf and ancestors),
    read from the base that first write built."""
    # audit rows are not what is tested here; without them nothing writes into
    # data_dir in the background while the temporary directory is removed
    settings = WorkerSettings(data_dir=data_dir, embedding_model="hash-64", _env_file=None, tree=TREE, audit_enabled=False)
    write(settings, ingest.parse_lines([json.dumps(r) for r in records], settings.limits))
    built = bases(settings)
    assert built, "a first write builds a base"
    with Store.open(built[max(built)], read_only=True) as store:
        tree = load_tree(store.con, settings.tree)
        membership = {r["id"]: {k for k, _ in tree.membership(r["id"])} for r in records}
    return settings, membership


def _resolve(q: dict, tree_keys: list[str]) -> dict:
    """The query with its ``tree_topic`` index turned into one of the store's tree keys."""
    q = dict(q)
    extra = q.pop("tree_topic")
    if extra is not None:
        q["topics"] = sorted(set(q["topics"]) | {tree_keys[extra % len(tree_keys)]})
    return q


def _options(q: dict) -> dict:
    return {k: v for k, v in q.items() if k != "text" and v not in (None, [])}


def _check_answer(out, q: dict, by_id: dict[str, dict], membership: dict[str, set[str]]) -> int:
    """Every result and link inside the scope, nothing inside lost (semantic, hybrid);
    returns the number of results."""
    got = [r.id for r in out.results]
    assert [r.rank for r in out.results] == list(range(1, len(got) + 1))
    assert len(set(got)) == len(got)
    for r in out.results:
        assert _expected_in_scope(by_id[r.id], membership[r.id], q), (r.id, q)
        for link in (*r.superseded_by, *r.conflicts, *r.supported_by):
            assert _expected_in_scope(by_id[link.id], membership[link.id], q), (r.id, link.id, q)
    if q["mode"] != "keyword":  # nothing in scope is lost either
        assert set(got) == {m for m in by_id if _expected_in_scope(by_id[m], membership[m], q)}, q
    return len(got)


def _check_store(records: list[dict], qs: list[dict]) -> int:
    """Ingest ``records`` into a fresh store and run ``qs``; returns how many results came back."""
    from workers import api, resources

    seen = 0
    before = resources.current().settings()
    with tempfile.TemporaryDirectory() as tmp:
        settings, membership = _ingest(Path(tmp), records)
        tree_keys = sorted(set().union(*membership.values()))
        resources.current().configure(settings)
        try:
            by_id = {r["id"]: r for r in records}
            for q in qs:
                q = _resolve(q, tree_keys)
                out = api.search(q["text"], max_units=100, **_options(q))
                seen += _check_answer(out, q, by_id, membership)
        finally:
            resources.current().configure(before)  # closes the store; points back where it was
    return seen


HAND_PICKED = [
    {"id": "m0", "namespace": "a", "content_type": "code", "content": "deploy window tuesday",
     "topics": ["t1"], "concepts": ["c1"]},
    {"id": "m1", "namespace": "a", "content_type": "text", "content": "deploy window friday",
     "topics": ["t1"], "concepts": ["c1"], "supersedes": ["m0"]},
    {"id": "m2", "namespace": "b", "content_type": "code", "content": "deploy window monday",
     "topics": ["t1"], "concepts": ["c1"], "supersedes": ["m0"], "conflicts": ["m0"]},
    {"id": "m3", "namespace": "a", "content_type": "code", "content": "deploy window sunday",
     "topics": ["t2"], "concepts": ["c1"], "conflicts": ["m0"], "supported_by": ["m0"]},
]




_PROPERTY = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])






# -- many scoped queries per store, in search_many batches (issue 8) -------------------
def _check_store_batched(records: list[dict], qs: list[dict], *, audit: bool = False) -> int:
    """``_check_store`` for a whole list of queries at once through ``search_many``.

    With ``audit``, the retrieval_log row of every query must record the scope
    it ran under (and serve only ids that came back). Returns the number of
    results checked."""
    from tests.figures import case, count
    from workers import api, resources
    from workers import audit as worker_audit

    checked = 0
    before = resources.current().settings()
    with tempfile.TemporaryDirectory() as tmp:
        settings, membership = _ingest(Path(tmp), records)
        if audit:
            settings = settings.replace(audit_enabled=True)
        tree_keys = sorted(set().union(*membership.values()))
        resources.current().configure(settings)
        try:
            by_id = {r["id"]: r for r in records}
            asks = [_resolve(q, tree_keys) for q in qs]
            outs = api.search_many([{"query": q["text"], "max_units": 100, **_options(q)} for q in asks])
            for q, out in zip(asks, outs):
                with case("scope.isolation"):
                    n = _check_answer(out, q, by_id, membership)
                    checked += n
                    count("scope.isolation", "results checked (each with its graph links)", n)
            if audit:
                from pipeline import audit as audit_rows

                assert worker_audit.flush(30)
                for q, out in zip(asks, outs):
                    with case("scope.audit_rows"):
                        row = audit_rows.get(audit_rows.log_of(settings), out.query_id)
                        assert row is not None, out.query_id
                        o = row.options
                        assert o["scope"]["namespace"] == q["namespace"]
                        assert o["scope"]["topics"] == sorted(set(q["topics"]))
                        assert o["scope"]["content_types"] == sorted(set(q["content_type"]))
                        assert o["scope"]["concepts"] == sorted(set(q["concepts"]))
                        assert [s["id"] for s in row.sources] == [r.id for r in out.results]
        finally:
            resources.current().configure(before)
    return checked




