"""The full-text floor under RRF (``fts_floor``): beside another leg, a
full-text hit scoring under half the leg's best BM25 counts nothing in the
fusion; it keeps its place in the list and its leg rank, and the audit row
says it was not counted (BENCHMARKS.md, "Fusion defaults, fourth round")."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from pipeline.audit.explain import explain
from pipeline.audit.record import AuditRecord, build_record
from pipeline.contracts import Hit, LegRun, QueryState, Result, make_query
from pipeline.stages.fuse import LegWeighting, counted_ranks, fuse_state, rrf, tie_ranks
from workers.settings import WorkerSettings

SETTINGS = WorkerSettings(_env_file=None)


def test_hits_under_the_floor_are_not_counted():
    assert counted_ranks([10.0, 9.5, 6.0, 5.5, 4.9, 1.0], 0.1, 0.5) == [1.5, 1.5, 3.5, 3.5, None, None]
    assert counted_ranks([4.0, 2.0], 0.0, 0.5) == [1, 2]  # exactly half counts


def test_tie_groups_are_formed_before_the_floor_cuts_one():
    # 5.2 and 4.9 are one group (average position 2.5); the floor (5.0) leaves 5.2 at 2.5
    assert tie_ranks([10.0, 5.2, 4.9], 0.1) == [1, 2.5, 2.5]
    assert counted_ranks([10.0, 5.2, 4.9], 0.1, 0.5) == [1, 2.5, None]


def test_floor_zero_or_no_positive_score_counts_every_hit():
    assert counted_ranks([10.0, 1.0], 0.1, 0.0) == tie_ranks([10.0, 1.0], 0.1) == [1, 2]
    assert counted_ranks([0.0, 0.0], 0.0, 0.5) == [1, 2]
    assert counted_ranks([], 0.1, 0.5) == []


def test_an_uncounted_hit_stays_in_the_list_with_its_position():
    legs = {"fts": ["a", "b", "c"], "vector": ["v", "b"]}
    fused = rrf(legs, {"fts": 8.0, "vector": 1.0}, 60, {"fts": counted_ranks([6.0, 2.0, 1.0], 0.0, 0.5)})
    by_id = {f.id: f for f in fused}
    assert [f.id for f in fused] == ["a", "v", "b", "c"]
    assert by_id["b"].rrf == pytest.approx(1 / 62)  # its vector rank only
    assert by_id["b"].ranks == {"fts": 2, "vector": 2} and by_id["b"].tied_ranks == {"fts": None}
    assert by_id["c"].rrf == 0.0 and by_id["c"].ranks == {"fts": 3}  # found, kept, counted nothing


def _state(fts, vector, settings=SETTINGS, **ask):
    q = make_query("parcel courier signature", ask, settings)
    legs = {"fts": LegRun(leg="fts", ran=True, hits=[Hit(id=m, score=s, rank=i + 1) for i, (m, s) in enumerate(fts)])}
    legs["vector"] = LegRun(leg="vector", ran=vector is not None,
                            hits=[Hit(id=m, score=s, rank=i + 1) for i, (m, s) in enumerate(vector or [])])
    return QueryState(query=q, legs=legs)


FTS = [("d1", 6.0), ("d2", 2.0), ("d3", 1.8)]  # d2 and d3 share one common word with the query
VECTOR = [("v1", 0.81), ("v2", 0.78), ("d1", 0.52)]


def _fuse(state, floor):
    # query IDF 6.0: the best hit matches the whole query, m = 1, full-text weight 8
    return fuse_state(state, 60, LegWeighting.of(SETTINGS), lambda text: 6.0, SETTINGS.fts_tie_tolerance, floor)


def test_a_partial_lexical_match_no_longer_outranks_the_vector_legs_best():
    assert SETTINGS.fts_floor == 0.5
    on = _fuse(_state(FTS, VECTOR), SETTINGS.fts_floor)
    off = _fuse(_state(FTS, VECTOR), 0.0)
    assert on.query.weights == off.query.weights == {"vector": 1.0, "fts": 8.0}
    assert [f.id for f in off.fused][:3] == ["d1", "d2", "d3"]  # 8 / 62 outweighs the vector leg's 1 / 61
    assert [f.id for f in on.fused] == ["d1", "v1", "v2", "d2", "d3"]


def test_a_leg_alone_keeps_every_hits_score():
    alone = _fuse(_state(FTS, None, mode="keyword"), SETTINGS.fts_floor)
    assert [f.id for f in alone.fused] == ["d1", "d2", "d3"] and all(f.rrf > 0 for f in alone.fused)
    beside_nothing = _fuse(_state(FTS, []), SETTINGS.fts_floor)  # the vector leg ran and found nothing
    assert all(f.rrf > 0 and None not in f.tied_ranks.values() for f in beside_nothing.fused)


def test_convex_fusion_has_no_floor():
    state = _state(FTS, VECTOR, fusion="convex")
    fused = {f.id: f for f in _fuse(state, SETTINGS.fts_floor).fused}
    assert fused["d2"].rrf > 0 and not fused["d2"].tied_ranks  # convex counts scores, not ranks


def _results(state):
    return [Result(rank=i + 1, id=f.id, score=f.score, rrf=f.rrf, ranks=f.ranks, tied_ranks=f.tied_ranks,
                   namespace="n", content_type="text", created_at="2026-01-01T00:00:00", content=f.id,
                   preview=f.id) for i, f in enumerate(state.fused)]


def test_the_audit_row_says_what_was_not_counted():
    state = _fuse(_state(FTS, VECTOR), SETTINGS.fts_floor)
    state.results = _results(state)
    row = AuditRecord.model_validate(json.loads(build_record(state, 60, store_text=False).model_dump_json()))
    paths = {p["id"]: p for p in explain(row)}
    assert paths["d2"]["tied_ranks"] == {"fts": None}
    assert paths["d2"]["rrf_contributions"] == {"fts": 0.0} and paths["d2"]["rrf"] == 0.0
    for p in paths.values():  # the row alone gives every served score
        assert sum(p["rrf_contributions"].values()) == pytest.approx(p["rrf"])


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_a_floor_outside_zero_to_one_is_refused_by_name(value):
    with pytest.raises(ValidationError, match="fts_floor"):
        WorkerSettings(_env_file=None, fts_floor=value)


def test_the_text_table_shows_an_uncounted_rank_in_brackets():
    from pipeline.contracts import Mode, Results
    from workers.cli.render import UNCOUNTED_LEGEND, format_results

    state = _fuse(_state(FTS, VECTOR), SETTINGS.fts_floor)
    res = Results(query_id="q", query="parcel courier signature", mode="hybrid", requested_mode=Mode.hybrid,
                  results=_results(state), truncated=False, total_ms=3.0)
    table = format_results(res).splitlines()
    assert table[-1] == UNCOUNTED_LEGEND  # what the brackets mean, under the table
    rows = {line.split()[4]: line.split()[2:4] for line in table[1:-2]}
    assert rows["d1"] == ["1", "3"]  # counted in both legs
    assert rows["d2"] == ["(2)", "-"] and rows["d3"] == ["(3)", "-"]  # returned, under the floor
    assert rows["v1"] == ["-", "1"]
