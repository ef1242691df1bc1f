"""``dimple demo``'s showcase picks each capability from what the pipeline
served, and its titles say what the ranks show: constructed hybrid results
with known leg ranks, judgments and graph context."""

from __future__ import annotations

from datetime import datetime

from pipeline.contracts import GraphLink, Mode, Result, Results
from workers.cli.demo import showcase


def _r(rank, mid, ranks, **kw) -> Result:
    return Result(rank=rank, id=mid, score=0.01, rrf=0.01, ranks=ranks, namespace="code", content_type="text",
                  created_at=datetime(2025, 1, 1), content=mid, preview=mid, **kw)


def _res(*results: Result) -> Results:
    return Results(query_id="x", query="q", mode="hybrid", requested_mode=Mode.hybrid, results=list(results),
                   truncated=False)


def _link(mid: str) -> GraphLink:
    return GraphLink(id=mid, preview=mid, namespace="code", content_type="text")


def _titles(queries, qrels, hybrid, scoped=None) -> list[str]:
    return [show.args[0] for show in showcase(queries, qrels, hybrid, scoped)]


def test_each_capability_is_picked_from_the_served_ranks_and_titled_by_them():
    queries = [{"id": "q1", "text": "ERR_X", "kind": "identifier"},
               {"id": "q2", "text": "ERR_Y", "kind": "identifier"},
               {"id": "q3", "text": "when do we cut", "kind": "paraphrase"},
               {"id": "q4", "text": "deploy day", "kind": "paraphrase"}]
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 1}, "q4": {"new": 2, "old": 1}}
    hybrid = [
        _res(_r(1, "a", {"fts": 1, "vector": 3})),
        _res(_r(1, "b", {"fts": 1})),  # the vector leg did not return it: the better example
        _res(_r(1, "c", {"vector": 1}), _r(2, "d", {"fts": 1, "vector": 2}, conflicts=[_link("e")])),
        _res(_r(1, "new", {}, promoted_above="old"), _r(2, "old", {"fts": 1, "vector": 1},
                                                       superseded_by=[_link("new")])),
    ]
    titles = _titles(queries, qrels, hybrid)
    assert titles[0] == "an identifier the full-text leg finds: b is full-text #1 and not returned by the vector leg"
    assert titles[1] == "a paraphrase the vector leg finds: c is vector #1 and not returned by the full-text leg"
    assert titles[2].startswith("a successor promoted: new supersedes old and is placed directly above it (no leg")
    assert titles[3] == "a conflict shown: d conflicts with e"
    assert len(titles) == 4  # no scope example given: no scope or budget show


def test_a_promoted_successor_is_not_shown_as_a_leg_finding_and_missing_capabilities_are_left_out():
    queries = [{"id": "q1", "text": "cut day", "kind": "paraphrase", "namespace": "code"}]
    hybrid = [_res(_r(1, "new", {"vector": 2}, promoted_above="old"), _r(2, "old", {"fts": 1, "vector": 1}))]
    titles = _titles(queries, {"q1": {"new": 2, "old": 1}}, hybrid, scoped=queries[0])
    # 'new' sits first because of supersession, not fusion: it is the promotion example only
    assert not any(t.startswith("a paraphrase") for t in titles)
    assert titles[0].startswith("a successor promoted: new supersedes old")
    assert titles[1].startswith("a scope:") and titles[2].startswith("a budget cut:")
