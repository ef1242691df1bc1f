"""``dimple demo``'s showcase picks each capability from what the pipeline
served, and its titles say what the ranks show: constructed hybrid results
with known leg ranks, judgments and graph context."""

from __future__ import annotations

from datetime import datetime

from pipeline.contracts import GraphLink, Mode, Result, Results
from workers.cli.demo import _show, showcase
from workers.cli.render import around, format_results


def _r(rank, mid, ranks, **kw) -> Result:
    return Result(rank=rank, id=mid, score=0.01, rrf=0.01, ranks=ranks, namespace="code", content_type="text",
                  created_at=datetime(2025, 1, 1), content=mid, preview=mid, **kw)


def _res(*results: Result) -> Results:
    return Results(query_id="x", query="q", mode="hybrid", requested_mode=Mode.hybrid, results=list(results),
                   truncated=False)


def _link(mid: str) -> GraphLink:
    return GraphLink(id=mid, preview=mid, namespace="code", content_type="text")


def _titles(queries, qrels, hybrid, scopes=(), supersedes=None) -> list[str]:
    return [show.args[0] if show.func is _show else show.func.__name__
            for show in showcase(queries, qrels, hybrid, scopes, supersedes)]


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
    # q3's table (the paraphrase) shows d's conflict already: printed again, it was the same table twice
    assert len(titles) == 3  # no other conflict, no scope example given: no scope or budget show
    hybrid.append(_res(_r(1, "f", {"fts": 1, "vector": 1}, conflicts=[_link("g")])))
    queries.append({"id": "q5", "text": "lunch", "kind": "paraphrase"})
    assert _titles(queries, qrels, hybrid)[3] == "a conflict shown: f conflicts with g"


def test_a_promoted_successor_is_not_shown_as_a_leg_finding_and_missing_capabilities_are_left_out():
    queries = [{"id": "q1", "text": "cut day", "kind": "paraphrase", "namespace": "code"}]
    hybrid = [_res(_r(1, "new", {"vector": 2}, promoted_above="old"), _r(2, "old", {"fts": 1, "vector": 1}))]
    other = {"id": "q2", "text": "lunch", "kind": "paraphrase", "namespace": "code"}
    titles = _titles(queries, {"q1": {"new": 2, "old": 1}}, hybrid, scopes=[queries[0], other])
    # 'new' sits first because of supersession, not fusion: it is the promotion example only
    assert not any(t.startswith("a paraphrase") for t in titles)
    assert titles[0].startswith("a successor promoted: new supersedes old")
    assert titles[1].startswith("a scope:") and titles[2] == "_show_budget"
    # the scope is shown on a query not shown already (q1 asked in its namespace again was the same table)
    scope = next(s for s in showcase(queries, {"q1": {"new": 2}}, hybrid, [queries[0], other]) if s.func is _show
                 and s.args[0].startswith("a scope:"))
    assert scope.args[1] is other
    assert len(_titles(queries, {"q1": {"new": 2, "old": 1}}, hybrid, scopes=[queries[0]])) == 1


def test_a_promotion_spells_out_its_whole_supersession_chain():
    """msg-0113 supersedes msg-0105, which supersedes msg-0061: the title
    named msg-0113 and msg-0061 only, and msg-0105 never showed."""
    queries = [{"id": "q1", "text": "cut day", "kind": "paraphrase"}]
    hybrid = [_res(_r(1, "msg-0113", {}, promoted_above="msg-0061"), _r(2, "msg-0061", {"fts": 1, "vector": 1}))]
    links = {"msg-0113": ["msg-0105", "msg-0020"], "msg-0105": ["msg-0061"], "msg-0020": []}
    titles = _titles(queries, {"q1": {"msg-0113": 2}}, hybrid, supersedes=lambda mid: links.get(mid, []))
    assert ("a successor promoted: msg-0113 supersedes msg-0061 through msg-0105 (msg-0113 -> msg-0105 -> msg-0061) "
            "and is placed directly above it") in titles[0]


def test_a_query_is_shown_once_whatever_it_shows():
    """A query whose top results show a promotion and a conflict printed the
    same table twice: the conflict is shown on another query, or not at all."""
    queries = [{"id": "q1", "text": "deploy day", "kind": "paraphrase"},
               {"id": "q2", "text": "lunch", "kind": "paraphrase"}]
    both = _res(_r(1, "new", {}, promoted_above="old", conflicts=[_link("e")]),
                _r(2, "old", {"fts": 1, "vector": 1}))
    titles = _titles(queries[:1], {}, [both])
    assert len(titles) == 1 and titles[0].startswith("a successor promoted")
    other = _res(_r(1, "d", {"fts": 1, "vector": 2}, conflicts=[_link("f")]))
    titles = _titles(queries, {}, [both, other])
    assert titles[1] == "a conflict shown: d conflicts with f"


def test_an_identifier_is_previewed_where_it_sits_in_the_memory():
    content = "Runbook for the payments edge proxy, section four, retries and backoff: " * 2 + \
        "the client sees ERR_CONN_RESET when the upstream closes idle sockets."
    shown = around(content, "what does ERR_CONN_RESET mean")
    assert shown is not None and "ERR_CONN_RESET" in shown and shown.startswith("…")
    assert len(shown.strip("…")) == 80
    assert around("nothing of it here", "ERR_CONN_RESET") is None
    table = format_results(_res(_r(1, "a", {"fts": 1}).model_copy(update={"content": content, "preview": content[:80]})),
                           focus="ERR_CONN_RESET")
    assert "ERR_CONN_RESET" in table
    assert "ERR_CONN_RESET" not in format_results(
        _res(_r(1, "a", {"fts": 1}).model_copy(update={"content": content, "preview": content[:80]})))
