"""Why not this memory? (issue 32): ``explain_miss`` and ``dimple audit explain
QUERY_ID --why-not MEMORY_ID`` name the stage that dropped a memory and the
numbers behind it.

One test per stage that can drop a memory, each on a small store built so
that this stage, and only it, drops it: the same query with that stage's
knob relaxed (a wider beam, a larger top-k, a larger budget, no filter,
promote instead of hide) returns it. Each checks the reason and its numbers
against the pipeline's own intermediate results: the stages run in-process
(``run_local``, each stage's output kept), the index's leaves, the descent's
trace, exact search. The settings each test depends on are set explicitly
(beam_width, leg_top_k, max_units), not left to defaults.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.audit.whynot import WhyNot
from pipeline.contracts import Batch, QueryState, Scope, make_query
from pipeline.errors import InputError
from pipeline.stages.registry import run_local
from pipeline.store.vector import descend, exact
from tests.conftest import use_store, write_jsonl
from workers.cli.common import ingest_file

NOW = "2026-01-01T00:00:00"


def _configure(settings, **changes):
    import workers

    changed = settings.replace(**changes)
    workers.configure(changed)
    return changed


def _build(settings, tmp_path, records, **changes):
    """A store of ``records`` written with ``settings`` changed by ``changes``, in use from now on."""
    changed = _configure(settings, **changes)
    ingest_file(write_jsonl(tmp_path / "m.jsonl", records), changed, progress=False)
    return changed


def _ask(text, **options):
    """A logged query (its audit row on disk) and its results."""
    from workers import audit
    from workers.api import search

    res = search(text, now=NOW, **options)
    assert audit.flush()
    return res


def _stages(settings, text, **options) -> dict:
    """Each stage's output for ``text`` (``run_local``'s ``keep``): the pipeline's own intermediate results."""
    from workers import resources

    keep: dict = {}
    query = make_query(text, {**options, "now": NOW}, settings)
    run_local(Batch(states=[QueryState(query=query)]), resources.current(), keep)
    return keep


def _why(res, memory_id) -> WhyNot:
    from workers.api import explain_miss

    answer = explain_miss(res.query_id, memory_id)
    assert answer.replay_same and answer.caveat is None
    assert answer.store_version == answer.replayed_version == res.store_version
    return WhyNot.model_validate_json(answer.model_dump_json())  # what the MCP tool sends is the same answer


def _ids(res) -> list[str]:
    return [r.id for r in res.results]


def _path(index, leaf: str) -> set[str]:
    """A leaf's topic key and its ancestors'."""
    path, t = set(), index.key_index[leaf]
    while t >= 0:
        path.add(index.keys[t])
        t = int(index.parent[t])
    return path


# -- search.descend: the beam ---------------------------------------------------------------
FRUIT = [{"id": f"a{i}", "namespace": "n", "content": f"apple banana cherry {w}"}
         for i, w in enumerate(["one", "two", "three", "four"])]
BEASTS = [{"id": f"b{i}", "namespace": "n", "content": f"zebra yak walrus {w}"}
          for i, w in enumerate(["one", "two", "three", "four"])]


def test_the_beam_not_reaching_the_memorys_leaf(embedded, tmp_path):
    from workers import resources

    tree = {"branching": 2, "max_leaf_items": 2, "max_depth": 12}
    s = _build(embedded, tmp_path, FRUIT + BEASTS, leg_top_k=100, tree={**tree, "beam_width": 1})
    text, options = "apple banana cherry one", {"mode": "semantic", "max_units": 20}
    res = _ask(text, **options)
    assert "b2" not in _ids(res)

    why = _why(res, "b2")
    assert (why.reason.value, why.stage) == ("beam", "search.descend")
    assert [d.stage for d in why.drops] == ["search.descend"]
    assert why.fulltext is not None and why.fulltext.status == "not_run"
    v = why.vector
    assert v is not None and v.status == "beam" and v.beam is not None
    index = resources.current().index()
    assert index is not None
    leaf = index.keys[int(index.row_leaf[index.row_of["b2"]])]
    assert v.leaf == v.beam.leaf == leaf
    # the leaves the beam reached, as the leg reported them
    keep = _stages(s, text, **options)
    reached = keep["search.descend"].states[0].legs["vector"].profile["reached"]
    assert v.beam.leaves_reached == reached and leaf not in reached
    # the cut, as the descent ranks its candidates at that depth
    trace: list = []
    query = np.asarray(keep["search.embed"].states[0].query.vector, dtype=np.float32)
    descend(index, query, index.start_topics(Scope()), beam_width=1, max_depth=12, top_k=100, trace=trace)
    ranked = trace[v.beam.depth - 1]
    assert v.beam.rank is not None and v.beam.rank > v.beam.beam_width == 1
    assert ranked[v.beam.rank - 1] == (v.beam.topic, pytest.approx(v.beam.score))
    assert ranked[0][1] == pytest.approx(v.beam.last_kept_score)
    assert v.beam.topic in _path(index, leaf)
    assert str(v.beam.rank) in why.summary and leaf in why.summary

    # only the beam: a wider one returns it
    _configure(s, tree={**tree, "beam_width": 64})
    wide = _ask(text, **options)
    assert "b2" in _ids(wide)
    assert _why(wide, "b2").reason.value == "returned"
    # each row is replayed with the settings its query ran with (the row keeps them), not this process's
    from pipeline import audit

    row = audit.get(audit.log_of(s), res.query_id)
    assert row is not None and row.query_profile["settings"]["tree"]["beam_width"] == 1
    again = _why(res, "b2")
    assert again.reason.value == "beam" and again.replayed_with["tree"]["beam_width"] == 1
    assert again.vector == why.vector


def test_the_descent_stopping_at_max_depth_above_the_leaf(embedded, tmp_path):
    from workers import resources

    tree = {"branching": 2, "max_leaf_items": 2, "beam_width": 64}
    s = _build(embedded, tmp_path, FRUIT + BEASTS, leg_top_k=100, tree={**tree, "max_depth": 1})
    text, options = "apple banana cherry one", {"mode": "semantic", "max_units": 20}
    res = _ask(text, **options)
    profile = _stages(s, text, **options)["search.descend"].states[0].legs["vector"].profile
    assert res.results == [] and profile["leaves_reached"] == 0 and profile["depth"] == 1

    why = _why(res, "a0")
    assert (why.reason.value, why.stage) == ("beam", "search.descend")
    b = why.vector.beam if why.vector is not None else None
    assert b is not None and b.rank is None and b.depth == 1 and b.leaves_reached == []
    index = resources.current().index()
    assert index is not None
    assert b.topic in _path(index, b.leaf) and b.topic != b.leaf  # kept at depth 1, above the leaf
    assert "max_depth" in why.summary

    _configure(s, tree={**tree, "max_depth": 12})
    assert "a0" in _ids(_ask(text, **options))


# -- search.descend: below the vector leg's top-k -------------------------------------------
def test_below_the_vector_legs_top_k(embedded, tmp_path):
    from workers import resources

    recs = [{"id": f"m{i}", "namespace": "n", "content": " ".join(["river", "stone", "cloud", "lamp", "ink"][: 5 - i])
             + f" extra{i}"} for i in range(5)]
    s = _build(embedded, tmp_path, recs, leg_top_k=2, tree={"beam_width": 16, "max_leaf_items": 64})
    text, options = "river stone cloud lamp ink", {"mode": "semantic", "max_units": 10}
    res = _ask(text, **options)
    keep = _stages(s, text, **options)
    hits = keep["search.descend"].states[0].legs["vector"].hits
    assert len(hits) == 2 and _ids(res) == [h.id for h in hits]
    index = resources.current().index()
    assert index is not None
    query = np.asarray(keep["search.embed"].states[0].query.vector, dtype=np.float32)
    every = exact(index, query, Scope(), 100)  # one leaf: the beam reaches every memory
    target, cosine = every[3]
    assert target not in _ids(res)

    why = _why(res, target)
    assert (why.reason.value, why.stage) == ("vector_top_k", "search.descend")
    v = why.vector
    assert v is not None and v.status == "below_top_k" and v.top_k == 2
    assert v.rank == 4 and v.cosine == pytest.approx(cosine)
    assert v.kth_cosine == pytest.approx(hits[-1].score)
    assert v.cosine < v.kth_cosine

    # only the top-k: a larger one returns it
    _configure(s, leg_top_k=100, tree={"beam_width": 16, "max_leaf_items": 64})
    assert target in _ids(_ask(text, **options))


# -- search.fulltext: no term matched -------------------------------------------------------
def test_the_fulltext_leg_matching_nothing(embedded, tmp_path):
    recs = [{"id": "hit", "namespace": "n", "content": "the staging database host db-stg-2"},
            {"id": "miss", "namespace": "n", "content": "Priya is vegetarian and likes the Thai place"}]
    s = _build(embedded, tmp_path, recs, leg_top_k=100)
    text, options = "staging database host", {"mode": "keyword", "max_units": 10}
    res = _ask(text, **options)
    assert _ids(res) == ["hit"]

    why = _why(res, "miss")
    assert (why.reason.value, why.stage) == ("fts_no_match", "search.fulltext")
    assert why.vector is not None and why.vector.status == "not_run"
    f = why.fulltext
    assert f is not None and f.status == "no_match" and f.bm25 is None
    # the leg with every match kept has nothing for it
    everything = _stages(s, text, **options, top_k=1000)["search.fulltext"].states[0].legs["fts"].hits
    assert [h.id for h in everything] == ["hit"] and f.hits == 1


# -- search.fulltext: below its top-k -------------------------------------------------------
def test_below_the_fulltext_legs_top_k(embedded, tmp_path):
    recs = [{"id": f"m{i}", "namespace": "n", "content": " ".join(["deploy", "window", "friday", "noon"][: 4 - i])
             + " notes" * i} for i in range(4)]
    s = _build(embedded, tmp_path, recs, leg_top_k=2)
    text, options = "deploy window friday noon", {"mode": "keyword", "max_units": 10}
    res = _ask(text, **options)
    leg = _stages(s, text, **options)["search.fulltext"].states[0].legs["fts"]
    every = _stages(s, text, **options, top_k=1000)["search.fulltext"].states[0].legs["fts"].hits
    assert len(leg.hits) == 2 and len(every) == 4
    target = every[2]
    assert target.id not in _ids(res)

    why = _why(res, target.id)
    assert (why.reason.value, why.stage) == ("fts_top_k", "search.fulltext")
    f = why.fulltext
    assert f is not None and f.status == "below_top_k" and f.top_k == 2
    assert (f.rank, f.bm25) == (3, pytest.approx(target.score))
    assert f.kth_bm25 == pytest.approx(leg.hits[1].score) and f.bm25 < f.kth_bm25
    assert f"BM25 {target.score:.4f}" in why.summary

    _configure(s, leg_top_k=100)
    assert target.id in _ids(_ask(text, **options))


# -- both legs: neither returned it ---------------------------------------------------------
def test_neither_leg_returning_it_names_both(embedded, tmp_path):
    recs = [{"id": f"m{i}", "namespace": "n", "content": " ".join(["river", "stone", "cloud", "lamp"][: 4 - i])
             + f" extra{i}"} for i in range(4)] + [{"id": "far", "namespace": "n", "content": "walrus yak zebra"}]
    s = _build(embedded, tmp_path, recs, leg_top_k=2, tree={"beam_width": 16, "max_leaf_items": 64})
    text, options = "river stone cloud lamp", {"mode": "hybrid", "max_units": 10}
    res = _ask(text, **options)
    keep = _stages(s, text, **options)
    assert "far" not in {h.id for h in keep["search.descend"].states[0].legs["vector"].hits}

    why = _why(res, "far")
    assert [(d.stage, d.reason.value) for d in why.drops] == [("search.descend", "vector_top_k"),
                                                             ("search.fulltext", "fts_no_match")]
    assert (why.reason.value, why.stage) == ("vector_top_k", "search.descend")
    assert why.summary.startswith("no leg returned it: the vector leg kept its top 2: far ranked 5")


# -- search.budget: fused below the cut -----------------------------------------------------
def test_fused_below_the_budgets_cut(embedded, tmp_path):
    recs = [{"id": f"m{i}", "namespace": "n", "content": f"redis host {'port ' * i}note {i}"} for i in range(5)]
    s = _build(embedded, tmp_path, recs, leg_top_k=100)
    text, options = "redis host", {"mode": "keyword", "max_units": 2}
    res = _ask(text, **options)
    fused = _stages(s, text, **options)["search.fuse"].states[0].fused
    assert len(fused) == 5 and _ids(res) == [f.id for f in fused[:2]]
    target = fused[3]

    why = _why(res, target.id)
    assert (why.reason.value, why.stage) == ("budget", "search.budget")
    p = why.placement
    assert p is not None and (p.rank, p.score, p.rrf) == (4, pytest.approx(target.score), pytest.approx(target.rrf))
    assert (p.kept, p.last_kept_id, p.cut_by, p.limit) == (2, fused[1].id, "maxUnits", 2)
    assert p.last_kept_score == pytest.approx(res.results[-1].score)
    assert why.fulltext is not None and why.fulltext.status == "hit" and why.fulltext.rank == target.ranks["fts"]

    assert target.id in _ids(_ask(text, **{**options, "max_units": 4}))


# -- search.augment: hidden as superseded ---------------------------------------------------
def test_hidden_as_superseded(embedded, tmp_path):
    recs = [{"id": "deploy-1", "namespace": "code", "content": "We deploy on Fridays before noon.",
             "created_at": "2025-01-10T09:00:00Z"},
            {"id": "deploy-2", "namespace": "code", "content": "The release window is Tuesday to Thursday.",
             "supersedes": ["deploy-1"], "created_at": "2025-06-02T09:00:00Z"},
            {"id": "other", "namespace": "code", "content": "Fridays are for tea."}]
    s = _build(embedded, tmp_path, recs, leg_top_k=100)
    text, options = "deploy fridays noon", {"mode": "keyword", "max_units": 10, "supersession": "hide"}
    res = _ask(text, **options)
    assert "deploy-1" not in _ids(res) and res.hidden_superseded == 1
    fused = [f.id for f in _stages(s, text, **options)["search.fuse"].states[0].fused]
    assert "deploy-1" in fused and "deploy-2" not in fused  # a candidate, replaced by a successor no leg found

    why = _why(res, "deploy-1")
    assert (why.reason.value, why.stage) == ("hidden_superseded", "search.augment")
    assert why.hidden_by == ["deploy-2"]
    assert next(r for r in res.results if r.id == "deploy-2").promoted_above == "deploy-1"

    assert "deploy-1" in _ids(_ask(text, **{**options, "supersession": "promote"}))
    # promoted, its successor takes the one slot above it: the budget cuts it, and says who took the slot
    one = _ask(text, **{**options, "supersession": "promote", "max_units": 1})
    assert _ids(one) == ["deploy-2"]
    cut = _why(one, "deploy-1")
    assert cut.reason.value == "budget" and cut.placement is not None
    assert (cut.placement.rank, cut.placement.promoted_above_it) == (2, ["deploy-2"])
    assert "placed its successor deploy-2 above it" in cut.summary


# -- the scope, pushed into both legs -------------------------------------------------------
SCOPES = {
    "namespace": ({"namespace": "other"}, {"namespace": "n"}),
    "topics": ({"topics": ["garden"]}, {"topics": ["kitchen"]}),
    "content_type": ({"content_type": "decision"}, {"content_type": "note"}),
    "concepts": ({"concepts": ["tomato"]}, {"concepts": ["basil"]}),
}


@pytest.mark.parametrize("name", sorted(SCOPES))
def test_outside_the_scope_names_the_filter(embedded, tmp_path, name):
    from workers.api import get

    theirs, asked = SCOPES[name]
    base = {"namespace": "n", "topics": ["kitchen"], "content_type": "note", "concepts": ["basil"]}
    recs = [{"id": "inside", **base, "content": "sow the seeds in spring"},
            {"id": "outside", **base, **theirs, "content": "sow the seeds in spring, in the greenhouse"}]
    _build(embedded, tmp_path, recs, leg_top_k=100)
    text, options = "sow seeds spring greenhouse", {"mode": "hybrid", "max_units": 10, **asked}
    res = _ask(text, **options)
    assert _ids(res) == ["inside"]

    why = _why(res, "outside")
    assert (why.reason.value, why.stage) == ("out_of_scope", "scope")
    assert why.scope is not None and why.scope.filters == [name]
    held = get(["outside"])[0]
    assert (why.scope.namespace, why.scope.content_type) == (held["namespace"], held["content_type"])
    assert set(held["concepts"]) == set(why.scope.concepts) and set(held["topics"]) <= set(why.scope.topics)
    assert name.replace("_", " ") in why.summary

    # only that filter: the same query without it returns the memory
    unfiltered = {k: v for k, v in options.items() if k not in asked}
    assert "outside" in _ids(_ask(text, **unfiltered))


# -- the store: forgotten -------------------------------------------------------------------
def test_a_forgotten_memory_and_a_returned_one(embedded, tmp_path):
    from workers.api import forget

    recs = [{"id": f"m{i}", "namespace": "n", "content": f"billing invoice number {i}"} for i in range(3)]
    _build(embedded, tmp_path, recs, leg_top_k=100)
    forget(["m1"], reason="user asked")
    res = _ask("billing invoice", mode="keyword", max_units=10)
    assert sorted(_ids(res)) == ["m0", "m2"]

    why = _why(res, "m1")
    assert (why.reason.value, why.stage) == ("forgotten", "store")
    returned = _why(res, "m2")
    assert returned.reason.value == "returned" and returned.stage is None and returned.drops == []
    rank = _ids(res).index("m2") + 1
    assert returned.returned_rank == rank and f"returned at rank {rank}" in returned.summary


# -- the Python API -------------------------------------------------------------------------
def test_explain_miss_in_the_api(embedded, tmp_path):
    from workers import api

    recs = [{"id": f"m{i}", "namespace": "n", "content": f"redis host port {i} " + "filler " * i} for i in range(4)]
    _build(embedded, tmp_path, recs, leg_top_k=100)
    res = api.search("redis host", mode="keyword", max_units=1, now=NOW)  # no flush: the API waits for its row
    answer = api.explain_miss(res.query_id[:8], "m3")  # a unique prefix does
    assert isinstance(answer, api.WhyNot) and answer.query_id == res.query_id
    assert answer.reason.value == "budget" and answer.placement is not None and answer.placement.rank == 4
    data = json.loads(answer.model_dump_json())
    assert data["reason"] == "budget" and data["drops"][0]["stage"] == "search.budget"

    for args, field in (((res.query_id, "nope"), "memory_id"), (("f" * 32, "m3"), "query_id"),
                        ((res.query_id, ""), "memory_id"), ((res.query_id, "m\x00"), "memory_id"),
                        (("", "m3"), "query_id")):
        with pytest.raises(InputError) as exc:
            api.explain_miss(*args)
        assert exc.value.field == field, args


# -- the command line -----------------------------------------------------------------------
def test_audit_explain_why_not_on_the_command_line(embedded, tmp_path, capsys, monkeypatch):
    from workers import audit, resources
    from workers.cli import main
    from workers.settings import get_settings

    recs = [{"id": f"m{i}", "namespace": "n", "content": " ".join(["deploy", "window", "friday", "noon"][: 4 - i])
             + " notes" * i} for i in range(4)]
    s = _build(embedded, tmp_path, recs, leg_top_k=2)
    use_store(monkeypatch, s)
    monkeypatch.setenv("DIMPLE_LEG_TOP_K", "2")
    get_settings.cache_clear()
    try:
        assert main(["search", "deploy window friday noon", "--mode", "keyword", "--json"]) == 0
        query_id = json.loads(capsys.readouterr().out)["query_id"]
        audit.flush()
        every = _stages(s, "deploy window friday noon", mode="keyword", top_k=1000)
        target = every["search.fulltext"].states[0].legs["fts"].hits[2]

        assert main(["audit", "explain", query_id, "--why-not", target.id]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == f"query {query_id}: 'deploy window friday noon'"
        assert out[1] == f"why not {target.id}? dropped by search.fulltext (fts_top_k)"
        assert out[2] == (f"  search.fulltext: the full-text leg kept its top 2: {target.id} ranked 3 "
                          f"(BM25 {target.score:.4f}; the last kept, #2: "
                          f"{every['search.fulltext'].states[0].legs['fts'].hits[1].score:.4f})")
        assert f"  replayed here on store version {resources.current().snapshot().version}: the same list as logged" in out

        assert main(["audit", "explain", query_id, "--why-not", target.id, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert (data["reason"], data["fulltext"]["rank"]) == ("fts_top_k", 3)
        assert main(["audit", "explain", query_id, "--why-not", "m1"]) == 0
        assert capsys.readouterr().out.splitlines()[1].startswith("why not m1? m1 was returned at rank 2 (score ")
        assert main(["audit", "explain", query_id, "--why-not", "never-written"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("dimple: error: --why-not: no memory 'never-written' in the store") and "Traceback" not in err
    finally:
        get_settings.cache_clear()
