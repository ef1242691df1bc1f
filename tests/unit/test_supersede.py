"""Supersession-aware ranking (``pipeline.stages.augment.supersede`` inside
``search.augment``): each value of ``supersession`` on hand-built stores and
candidate lists, through augment, scope and budget as the canvas chains them,
with successors in the base and in deltas, chains, branches, scopes,
forgotten successors and budgets; then a property over random stores: no
value ever serves or reveals a memory outside the scope, and promote/hide
put every live in-scope successor where they promise."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from pipeline.contracts import Batch, Budget, Fused, LegRun, Query, QueryOptions, QueryState, make_query
from pipeline.errors import InputError
from pipeline.stages.augment import augment_batch
from pipeline.stages.budget import budget_batch
from pipeline.stages.scope import scope_batch
from pipeline.store.lake.follow import reader_for
from pipeline.store.writes import parse_records, write
from tests.unit.test_scope import _expected_in_scope, _ingest, stores


def _rec(mid: str, day: int, ns: str = "code", **kw) -> dict:
    return {"id": mid, "namespace": ns, "content": f"{mid} deploy window note", "created_at": f"2025-01-{day:02d}T09:00:00Z",
            **kw}


# old <- mid <- new: a chain of three; lone: nothing supersedes it
CHAIN = [_rec("old", 1), _rec("mid", 2, supersedes=["old"]), _rec("new", 3, supersedes=["mid"]), _rec("lone", 4)]


def _write(settings, records=(), forget=()):
    return write(settings, parse_records(list(records), settings) if records else None, list(forget) or None)


@pytest.fixture
def store(settings):
    """A reader over ``settings``' store; the test writes what it needs first."""
    readers = []

    def open_(records, forget=()):
        _write(settings, records)
        if forget:
            _write(settings, forget=forget)
        reader = reader_for(settings)
        readers.append(reader)
        return reader

    yield open_
    for r in readers:
        r.close()


def _serve(reader, order: list[str], supersession: str | None, max_units=None, max_chars=None, **scope) -> QueryState:
    """``order`` as the fused candidates, then augment, scope and budget."""
    options = QueryOptions(**scope, **({"supersession": supersession} if supersession else {}))
    q = Query(id="q", text="t", started_at=1.7e9, options=options, weights={"vector": 0.0, "fts": 1.0},
              budget=Budget(max_units=max_units, max_chars=max_chars))
    fused = [Fused(id=m, rrf=1.0 / (60 + i), score=1.0 / (60 + i), ranks={"fts": i}) for i, m in enumerate(order, 1)]
    state = QueryState(query=q, legs={"fts": LegRun(leg="fts", ran=True)}, fused=fused)
    snap = reader.snapshot()
    with snap.view() as v:
        out = augment_batch(Batch(states=[state]), v.cursor, 40, v.overlay)
    return budget_batch(scope_batch(out)).states[0]


def _ids(state: QueryState) -> list[str]:
    return [r.id for r in state.results]


def _by_id(state: QueryState, mid: str):
    return next(r for r in state.results if r.id == mid)


# -- the three values -----------------------------------------------------------------------
def test_annotate_serves_the_fused_order_with_the_marker_only(store):
    reader = store(CHAIN)
    out = _serve(reader, ["old", "lone"], "annotate")
    assert _ids(out) == ["old", "lone"]
    assert [l.id for l in _by_id(out, "old").superseded_by] == ["mid"]
    assert all(r.promoted_above is None for r in out.results) and out.hidden_superseded == 0


def test_promote_puts_the_newest_successor_directly_above_and_keeps_the_superseded_one(store):
    reader = store(CHAIN)
    out = _serve(reader, ["lone", "old"], "promote")
    # the chain is followed to its newest memory, read from the store though no leg found it
    assert _ids(out) == ["lone", "new", "old"]
    new = _by_id(out, "new")
    assert new.promoted_above == "old" and new.ranks == {} and new.score == 0.0 and new.rrf == 0.0
    assert new.content == "new deploy window note" and [l.id for l in new.superseded_by] == []
    assert [l.id for l in _by_id(out, "old").superseded_by] == ["mid"]  # the marker stays
    assert [r.rank for r in out.results] == [1, 2, 3]


def test_promote_moves_a_successor_that_was_a_candidate_up_once_with_its_own_figures(store):
    reader = store(CHAIN)
    out = _serve(reader, ["old", "lone", "mid", "new"], "promote")
    assert _ids(out) == ["new", "old", "lone", "mid"]
    new = _by_id(out, "new")
    assert new.promoted_above == "old" and new.ranks == {"fts": 4}  # its own leg rank, not invented
    assert _by_id(out, "mid").promoted_above is None


def test_promote_leaves_a_successor_that_already_ranks_higher_where_it_is(store):
    reader = store(CHAIN)
    out = _serve(reader, ["new", "lone", "old"], "promote")
    assert _ids(out) == ["new", "lone", "old"]
    assert _by_id(out, "new").promoted_above is None


def test_hide_drops_superseded_results_for_their_successor_and_counts_them(store):
    reader = store(CHAIN)
    out = _serve(reader, ["old", "lone", "mid"], "hide")
    assert _ids(out) == ["new", "lone"]
    assert _by_id(out, "new").promoted_above == "old"
    assert out.hidden_superseded == 2


def test_the_default_is_promote():
    assert QueryOptions().supersession.value == "promote"


def test_branches_promote_every_newest_successor_newest_first(store):
    reader = store([_rec("v1", 1), _rec("split-a", 5, supersedes=["v1"]), _rec("split-b", 7, supersedes=["v1"])])
    out = _serve(reader, ["v1"], "promote")
    assert _ids(out) == ["split-b", "split-a", "v1"]
    assert out.results[0].promoted_above == out.results[1].promoted_above == "v1"


@pytest.mark.parametrize("order", [["a", "b"], ["b", "a"]])
def test_in_a_cycle_the_newest_memory_on_it_stands_for_the_others(store, order):
    """a and b supersede each other (one write may declare both): b, the newer,
    is what both lead to; hide serves it alone and counts one hidden, promote
    places it above a, and b is never promoted above anything for itself."""
    reader = store([_rec("a", 1, supersedes=["b"]), _rec("b", 2, supersedes=["a"]), _rec("c", 3)])
    hidden = _serve(reader, [*order, "c"], "hide")
    assert _ids(hidden) == ["b", "c"] and hidden.hidden_superseded == 1
    assert _by_id(hidden, "b").promoted_above == ("a" if order[0] == "a" else None)
    promoted = _serve(reader, [*order, "c"], "promote")
    assert _ids(promoted) == ["b", "a", "c"]
    assert _by_id(promoted, "b").promoted_above == ("a" if order[0] == "a" else None)
    assert _by_id(promoted, "a").promoted_above is None


# -- scope ----------------------------------------------------------------------------------
def test_a_successor_outside_the_scope_is_never_served_or_revealed(store):
    reader = store([_rec("old", 1), _rec("elsewhere", 2, ns="messages", supersedes=["old"]),
                    _rec("newest", 3, supersedes=["elsewhere"])])
    for value in ("promote", "hide"):
        out = _serve(reader, ["old"], value, namespace="code")
        # the chain stops at the namespace: nothing promoted, old stays as in annotate
        assert _ids(out) == ["old"], value
        assert _by_id(out, "old").superseded_by == [] and out.hidden_superseded == 0
    # without the scope, the chain goes through
    assert _ids(_serve(reader, ["old"], "promote")) == ["newest", "old"]


def test_the_chain_stops_at_the_last_successor_inside_the_scope(store):
    reader = store([_rec("old", 1, content_type="decision"), _rec("mid", 2, content_type="decision", supersedes=["old"]),
                    _rec("note", 3, content_type="text", supersedes=["mid"])])
    out = _serve(reader, ["old"], "promote", content_type=["decision"])
    assert _ids(out) == ["mid", "old"]
    assert _by_id(out, "mid").superseded_by == []  # 'note' is outside: not even as a link
    out = _serve(reader, ["old"], "hide", content_type=["decision"])
    assert _ids(out) == ["mid"] and out.hidden_superseded == 1


# -- deltas and forgotten memories ------------------------------------------------------------
def test_a_forgotten_successor_is_never_read_the_chain_ends_before_it(store, settings):
    reader = store(CHAIN, forget=["new"])
    out = _serve(reader, ["old"], "promote")
    assert _ids(out) == ["mid", "old"]
    assert all(l.id != "new" for r in out.results for l in (*r.superseded_by, *r.conflicts, *r.supported_by))
    _write(settings, forget=["mid"])  # the edge mid declared goes with it: old is superseded by nothing live
    out = _serve(reader, ["old"], "hide")
    assert _ids(out) == ["old"] and out.hidden_superseded == 0 and _by_id(out, "old").superseded_by == []


def test_a_successor_written_since_the_base_is_promoted_from_its_delta(store, settings):
    from tests.stores import compacted

    reader = store(CHAIN[:2])
    compacted(settings)
    _write(settings, [_rec("fresh", 9, supersedes=["mid"])])
    out = _serve(reader, ["lone-missing", "old"], "promote")  # a candidate deleted since the legs ran is skipped
    assert _ids(out) == ["fresh", "old"]
    assert _by_id(out, "fresh").promoted_above == "old"


# -- budgets apply after promotion ------------------------------------------------------------
def test_budgets_apply_after_promotion(store):
    reader = store(CHAIN)
    out = _serve(reader, ["old", "lone"], "promote", max_units=1)
    assert _ids(out) == ["new"]
    assert out.truncated and out.truncation.by == "maxUnits" and out.truncation.left_out == 2
    chars = len("new deploy window note") + 3
    out = _serve(reader, ["old", "lone"], "promote", max_chars=chars)
    assert _ids(out) == ["new"] and out.truncation.by == "maxChars"
    out = _serve(reader, ["old", "lone"], "hide", max_units=2)
    assert _ids(out) == ["new", "lone"] and not out.truncated and out.hidden_superseded == 1


# -- the option --------------------------------------------------------------------------------
def test_the_option_is_validated_recorded_and_asked_again(settings):
    from pipeline.contracts import options_from_recorded

    with pytest.raises(InputError) as bad:
        make_query("t", {"supersession": "newest"}, settings)
    assert bad.value.field == "supersession"
    q = make_query("t", {"supersession": "hide"}, settings)
    assert q.recorded()["supersession"] == "hide"
    assert options_from_recorded(q.recorded())["supersession"] == "hide"
    # a query state travels as JSON between workers with its option and its count
    state = QueryState(query=q, hidden_superseded=3)
    again = QueryState.model_validate_json(state.model_dump_json())
    assert again.query.options.supersession.value == "hide" and again.hidden_superseded == 3
    # rows logged before the option existed were served as annotate and are asked again so
    old = {k: v for k, v in q.recorded().items() if k != "supersession"}
    assert options_from_recorded(old)["supersession"] == "annotate"
    assert options_from_recorded({"namespace": "code"})["supersession"] == "annotate"


# -- property: random stores, scopes and candidate orders ---------------------------------------
def _ends(mid: str, by_id: dict, inside) -> set[str]:
    """The newest in-scope successors of ``mid``, worked out from the records as written."""
    succ = {r["id"]: [s["id"] for s in by_id.values() if r["id"] in s["supersedes"] and inside(s["id"])] for r in by_id.values()}
    reached, stack = set(), [mid]
    while stack:
        for s in succ[stack.pop()]:
            if s not in reached:
                reached.add(s)
                stack.append(s)
    return {s for s in reached if not succ[s]}


scopes = st.fixed_dictionaries({
    "namespace": st.none() | st.sampled_from(["a", "b"]),
    "content_type": st.lists(st.sampled_from(["code", "text"]), unique=True, max_size=1),
})


promote_cases = st.lists(st.tuples(scopes, st.sampled_from(["promote", "hide"]), st.randoms()), min_size=1, max_size=4)


# 5 examples here (each writes a lake afresh, ~0.9 s), 28 more in the slow tier (tests/slow/test_supersede_slow.py)
@hsettings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=stores(max_size=12), cases=promote_cases)
def test_promote_and_hide_keep_the_scope_and_place_every_successor(records, cases):
    check_promote_and_hide(records, cases)


def check_promote_and_hide(records, cases) -> None:
    """Served through ``promote`` or ``hide`` in each scope of ``cases``: nothing out of scope, every
    newest successor of a candidate served above it (or in its place)."""
    # ``stores`` draws edges to earlier records only, so chains have no cycles
    by_id = {r["id"]: r for r in records}
    with tempfile.TemporaryDirectory() as tmp:
        settings, membership = _ingest(Path(tmp), records)
        reader = reader_for(settings)
        try:
            for scope, value, rnd in cases:
                q = {"namespace": scope["namespace"], "content_type": scope["content_type"], "topics": [], "concepts": []}

                def inside(m, q=q):
                    return _expected_in_scope(by_id[m], membership[m], q)

                order = [r["id"] for r in records]
                rnd.shuffle(order)
                order = order[: rnd.randint(1, len(order))]
                out = _serve(reader, order, value, **{k: v for k, v in scope.items() if v not in (None, [])})
                got = _ids(out)
                assert len(set(got)) == len(got)
                for r in out.results:
                    assert inside(r.id)
                    for link in (*r.superseded_by, *r.conflicts, *r.supported_by):
                        assert inside(link.id)
                hidden = 0
                for m in (m for m in order if inside(m)):
                    ends = _ends(m, by_id, inside)
                    assert ends <= set(got), (m, ends, got)  # every newest successor is served
                    if ends and value == "hide":
                        assert m not in got
                        hidden += 1
                    elif m in got:  # each successor sits above it
                        assert all(got.index(e) < got.index(m) for e in ends)
                assert out.hidden_superseded == hidden
                # nothing served that is neither a candidate nor a promoted successor
                assert all(m in order or _by_id(out, m).promoted_above in order for m in got)
        finally:
            reader.close()
