"""Why was a memory not returned? ``why_not`` replays a logged query (its audit
row) in this process, stage by stage as the canvas runs it
(``pipeline.stages.registry.run_local``, each stage's output kept), on one
store version for the whole replay, and names the first stage that dropped
the memory with the numbers behind it, each read from a stage's own output:

- the store: the memory is forgotten (a memory it does not hold at all is
  an ``InputError`` naming ``memory_id``);
- the scope, pushed into both legs: which filter it fails (namespace, topics,
  content type, concepts);
- ``search.descend``: the beam never reached its leaf (the leaf, the topic on
  its path the beam dropped, that topic's rank among the beam's candidates
  and its centroid score beside the last kept one, the leaf's best rank), or
  it was below the leg's top-k (its cosine, the k-th cosine);
- ``search.fulltext``: no term of the query matched, or it was below the
  leg's top-k (its BM25, the k-th BM25);
- ``search.augment``: hidden as superseded (by which successor);
- ``search.budget``: fused below the cut (its fused score and rank, the last kept).

Where the memory would have been past a cut is measured by running that
stage again without the cut, never by scoring it here: a leg with a top-k
as large as the store (the vector leg with its beam traced,
``pipeline.store.vector.descend``), and the stages after fusion with no
budget.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.audit.explain import replay_options, store_changed
from pipeline.audit.record import AuditRecord, retrieval_settings
from pipeline.contracts import (
    Batch,
    Budget,
    Fused,
    GraphLink,
    Hit,
    LegRun,
    Query,
    QueryState,
    Result,
    Scope,
    id_problem,
    make_query,
)
from pipeline.embedders import Embedder
from pipeline.errors import InputError
from pipeline.settings import Settings
from pipeline.stages import augment, descend, fulltext
from pipeline.stages.registry import AFTER_FUSION, FULLTEXT_LEG, FUSION, STAGES, VECTOR_LEG, Resources, run_local
from pipeline.stages.scope import in_scope
from pipeline.store.reader import Snapshot, View
from pipeline.store.vector import VectorIndex

EMBED, DESCEND = VECTOR_LEG
(FULLTEXT,) = FULLTEXT_LEG
BUDGET = AFTER_FUSION[-1]
AUGMENT = AFTER_FUSION[0]
STORE, SCOPE = "store", "scope"


class Reason(str, Enum):
    """Why a memory was not returned (``returned``: it was)."""

    returned = "returned"
    forgotten = "forgotten"
    out_of_scope = "out_of_scope"
    beam = "beam"
    vector_top_k = "vector_top_k"
    fts_no_match = "fts_no_match"
    fts_top_k = "fts_top_k"
    leg_timed_out = "leg_timed_out"
    hidden_superseded = "hidden_superseded"
    budget = "budget"
    unexplained = "unexplained"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Drop(_Strict):
    """One stage that dropped the memory (the store, the scope, or a task name)."""

    stage: str
    reason: Reason
    detail: str


class ScopeMiss(_Strict):
    """The filters of the query's scope the memory fails, and what it holds."""

    filters: list[Literal["namespace", "topics", "content_type", "concepts"]]
    asked: Scope
    namespace: str
    content_type: str
    topics: list[str]
    concepts: list[str]


class BeamCut(_Strict):
    """Where the beam descent left the memory's leaf behind."""

    leaf: str = Field(description="the topic key of the leaf the memory sits in")
    topic: str = Field(description="the leaf, or the topic on its path, that the beam dropped")
    depth: int = Field(description="the descent's depth (1: its first cut) where that topic was dropped")
    rank: int | None = Field(description="that topic's rank among the beam's candidates there (None: max_depth "
                                         "ended the descent with it kept, above the leaf)")
    candidates: int = Field(description="how many candidates the beam ranked at that depth")
    beam_width: int
    score: float | None = Field(description="that topic's centroid score (cosine with the query)")
    last_kept_score: float | None = Field(description="the centroid score of the last candidate the beam kept there")
    leaf_best_rank: int | None = Field(description="the leaf's best rank among the beam's candidates at any depth "
                                                   "(None: it never was one)")
    leaves_reached: list[str] = Field(description="the leaves the beam reached")


class VectorLeg(_Strict):
    """What the vector leg (``search.descend``) did with the memory."""

    status: Literal["hit", "beam", "below_top_k", "not_run", "timed_out"]
    top_k: int
    hits: int = Field(description="how many memories the leg returned")
    rank: int | None = Field(None, description="hit: its rank in the leg; below_top_k: its rank among every "
                                               "memory the beam reached")
    cosine: float | None = None
    kth_cosine: float | None = Field(None, description="the cosine of the leg's last hit when the top-k was full")
    leaf: str | None = Field(None, description="its leaf (None for a memory in a delta, which is scored exactly)")
    beam: BeamCut | None = None


class FulltextLeg(_Strict):
    """What the full-text leg (``search.fulltext``) did with the memory."""

    status: Literal["hit", "no_match", "below_top_k", "not_run", "timed_out"]
    top_k: int
    hits: int = Field(description="how many memories the leg returned")
    rank: int | None = Field(None, description="hit: its rank in the leg; below_top_k: its rank among every match")
    bm25: float | None = None
    kth_bm25: float | None = Field(None, description="the BM25 of the leg's last hit when the top-k was full")
    best_bm25: float | None = None


class Placement(_Strict):
    """Where the memory stood in the list the budget cut (fused, re-ranked by
    recency and supersession, scoped), beside what was kept."""

    rank: int
    score: float
    rrf: float
    ranks: dict[str, int] = Field(default_factory=dict)
    kept: int = Field(description="results served")
    last_kept_id: str | None = None
    last_kept_score: float | None = None
    cut_by: str | None = Field(None, description="the budget that cut: maxUnits, maxChars or maxMs")
    limit: int | None = None
    promoted_above_it: list[str] = Field(default_factory=list, description="its successors that supersession "
                                                                           "placed above it, among those kept")


class WhyNot(_Strict):
    """The answer to "why was this memory not returned for that query?"."""

    query_id: str
    memory_id: str
    query: str
    reason: Reason = Field(description="the first stage's reason (returned: it was served)")
    stage: str | None = Field(description="the first stage that dropped it: store, scope or a task name")
    summary: str
    drops: list[Drop] = Field(default_factory=list, description="every stage that dropped it (both legs, when "
                                                                "neither returned it)")
    returned_rank: int | None = None
    scope: ScopeMiss | None = None
    vector: VectorLeg | None = None
    fulltext: FulltextLeg | None = None
    placement: Placement | None = None
    hidden_by: list[str] = Field(default_factory=list, description="the successors that took its place (hide)")
    store_version: int | None = Field(description="the store version the logged query read")
    replayed_version: int | None = Field(description="the store version this replay read")
    replay_same: bool = Field(description="whether the replay served the row's list")
    replayed_with: dict[str, Any] = Field(description="the retrieval settings the replay ran with: the row's, "
                                                      "where it recorded them")
    caveat: str | None = Field(None, description="why the replay may not be the query as it ran")


# -- one store version for the whole replay ---------------------------------------------
class Pinned:
    """``res`` with every stage reading ``snapshot`` and using ``settings``."""

    def __init__(self, res: Resources, snapshot: Snapshot | None, settings: Settings):
        self._res, self._snapshot, self._settings = res, snapshot, settings

    def settings(self) -> Settings:
        return self._settings

    def embedder(self) -> Embedder:
        return self._res.embedder()

    @contextmanager
    def view(self) -> Iterator[View | None]:
        if self._snapshot is None:
            yield None
            return
        with self._snapshot.view() as v:
            yield v


# -- the answer -------------------------------------------------------------------------
def why_not(row: AuditRecord, memory_id: Any, res: Resources, snapshot: Snapshot | None) -> WhyNot:
    """Why ``memory_id`` was not among the results of the query logged in
    ``row``, replayed on ``snapshot`` (the store as this process reads it)
    with the settings the query ran with (``_as_logged``). Raises ``InputError`` naming
    ``memory_id`` for a bad id or one the store does not hold, and naming
    ``query_id`` for a row whose text was not stored."""
    problem = id_problem(memory_id)
    if problem is not None:
        raise InputError("memory_id", problem)
    if row.query_text is None:
        raise InputError("query_id", f"query {row.query_id} cannot be replayed: its text was not stored "
                                     "(DIMPLE_STORE_QUERY_TEXT=false)")
    settings = _as_logged(res.settings(), row)
    pinned = Pinned(res, snapshot, settings)
    version = snapshot.version if snapshot is not None else None
    with pinned.view() as v:
        link, index = _memory(v, memory_id, settings, version)
        leaf = _leaf(index, memory_id, v.overlay if v is not None else None)
    query = make_query(row.query_text, replay_options(row), settings)
    start = Batch(states=[QueryState(query=query)])
    keep: dict[str, Batch] = {}
    final = run_local(start.model_copy(deep=True), pinned, keep).states[0]
    same = [r.id for r in final.results] == [s["id"] for s in row.sources]
    base: dict[str, Any] = {
        "query_id": row.query_id, "memory_id": memory_id, "query": row.query_text,
        "store_version": row.query_profile.get("store_version"), "replayed_version": version,
        "replay_same": same, "caveat": _caveat(row, version, same),
        "replayed_with": {"rrf_k": settings.rrf_k, **retrieval_settings(settings)},
    }
    served = next((r for r in final.results if r.id == memory_id), None)
    if served is not None:
        return WhyNot(**base, reason=Reason.returned, stage=None, returned_rank=served.rank,
                      placement=_placed(served, final),
                      summary=f"{memory_id} was returned at rank {served.rank} (score {served.score:.5f})")
    if link is None:
        drop = Drop(stage=STORE, reason=Reason.forgotten,
                    detail=f"{memory_id} is forgotten (store version {version}): no stage reads it")
        return _answer(base, [drop])
    miss = _scope_miss(link, query)
    if miss is not None:
        return _answer(base, [Drop(stage=SCOPE, reason=Reason.out_of_scope, detail=_scope_detail(memory_id, miss))],
                       scope=miss)
    total = (index.size if index is not None else 0) + (len(snapshot.overlay.ids) if snapshot is not None else 0)
    vector = _vector_leg(keep, pinned, memory_id, total, leaf, index, settings)
    fts = _fulltext_leg(keep, start, pinned, memory_id, total)
    legs = {"vector": vector, "fulltext": fts}
    fused = next((f for f in keep[FUSION].states[0].fused if f.id == memory_id), None)
    uncut = _without_budget(keep[FUSION], pinned)
    placed = next((r for r in uncut.results if r.id == memory_id), None)
    if placed is not None:
        placement = _placed(placed, final)
        return _answer(base, [_budget_drop(memory_id, placement)], placement=placement, **legs)
    if fused is not None:
        hidden_by = [r.id for r in uncut.results if r.promoted_above == memory_id]
        if hidden_by:
            drop = Drop(stage=AUGMENT, reason=Reason.hidden_superseded,
                        detail=f"hidden as superseded (supersession=hide): {', '.join(hidden_by)} took its place")
            return _answer(base, [drop], hidden_by=hidden_by, **legs)
        return _answer(base, [_unexplained(memory_id, fused)], **legs)
    drops = [d for d in (_vector_drop(memory_id, vector), _fulltext_drop(memory_id, fts)) if d is not None]
    return _answer(base, drops or [_unexplained(memory_id, None)], **legs)


def _answer(base: dict[str, Any], drops: list[Drop], **parts: Any) -> WhyNot:
    first = drops[0]
    summary = drops[0].detail if len(drops) == 1 else "no leg returned it: " + "; ".join(d.detail for d in drops)
    return WhyNot(**base, reason=first.reason, stage=first.stage, summary=summary, drops=drops, **parts)


def _as_logged(current: Settings, row: AuditRecord) -> Settings:
    """``current`` with the retrieval settings the logged query ran with (its
    RRF k, and ``query_profile["settings"]``: ``pipeline.audit.record.retrieval_settings``;
    a row written before that has none), less any this dimple no longer has."""
    changes: dict[str, Any] = {"rrf_k": row.rrf_k}
    for name, value in (row.query_profile.get("settings") or {}).items():
        if name not in type(current).model_fields:
            continue
        if isinstance(value, dict):
            part = getattr(current, name)
            value = {**part.model_dump(), **{k: v for k, v in value.items() if k in type(part).model_fields}}
        changes[name] = value
    return current.replace(**changes)


def _caveat(row: AuditRecord, version: int | None, same: bool) -> str | None:
    """Why this replay may not be the query as it ran: a store changed since
    (the lake keeps its snapshots within ``store.retain``; a row the segment
    store of earlier versions logged names none), or a different served list."""
    notes = []
    moved = store_changed(row, version)
    if moved:
        notes.append(f"{moved}; this replay reads version {version}")
    if not same:
        notes.append("the replay served a different list than the logged query (changed settings or store), so "
                     "this explains the replay")
    return "; ".join(notes) or None


# -- the memory -------------------------------------------------------------------------
def _memory(v: View | None, memory_id: str, settings: Settings, version: int | None):
    """The memory as augment reads it (a ``GraphLink``, None when forgotten)
    and the base's vector index; ``InputError`` when the store does not hold it."""
    if v is None:
        raise InputError("memory_id", f"no memory {memory_id!r}: the store is empty")
    graph = augment.Graph(v.cursor, v.overlay)
    graph.load([memory_id])
    if memory_id in graph.rows:
        return graph.link(memory_id, settings.preview_chars), v.index()
    if memory_id in v.overlay.forgotten:
        return None, None
    raise InputError("memory_id", f"no memory {memory_id!r} in the store (version {version}): never written, "
                                  "or forgotten and erased since by a compaction")


def _leaf(index: VectorIndex | None, memory_id: str, overlay) -> str | None:
    """The base leaf a memory sits in (None for a delta's memory, scored exactly)."""
    if index is None or memory_id not in index.row_of or (overlay is not None and memory_id in overlay.touched):
        return None
    return index.keys[int(index.row_leaf[index.row_of[memory_id]])]


# -- scope ------------------------------------------------------------------------------
def _scope_miss(link: GraphLink, query: Query) -> ScopeMiss | None:
    """The scope's filters the memory fails, each checked alone by the scope stage's own test."""
    scope = query.scope
    one = {"namespace": Scope(namespace=scope.namespace), "topics": Scope(topics=scope.topics),
           "content_type": Scope(content_types=scope.content_types), "concepts": Scope(concepts=scope.concepts)}
    failed = [name for name, alone in one.items() if not alone.empty and not in_scope(link, alone)]
    if not failed:
        return None
    return ScopeMiss(filters=failed, asked=scope, namespace=link.namespace, content_type=link.content_type,
                     topics=link.topics, concepts=link.concepts)


def _scope_detail(memory_id: str, miss: ScopeMiss) -> str:
    asked = miss.asked
    says = {
        "namespace": f"namespace {miss.namespace!r}, the query asked {asked.namespace!r}",
        "topics": f"topics {miss.topics}, the query asked one of {list(asked.topics)}",
        "content_type": f"content type {miss.content_type!r}, the query asked one of {list(asked.content_types)}",
        "concepts": f"concepts {miss.concepts}, the query asked one of {list(asked.concepts)}",
    }
    return f"{memory_id} is outside the query's scope (both legs search inside it): " + "; ".join(
        says[f] for f in miss.filters)


# -- the legs ---------------------------------------------------------------------------
def _leg_state(leg: LegRun | None, weight: float) -> Literal["not_run", "timed_out"] | None:
    if leg is not None and leg.profile.get("timed_out"):
        return "timed_out"
    if leg is None or not leg.ran or weight <= 0:
        return "not_run"
    return None


def _find(hits: list[Hit], memory_id: str) -> Hit | None:
    return next((h for h in hits if h.id == memory_id), None)


def _kth(hits: list[Hit], k: int) -> float | None:
    return hits[k - 1].score if len(hits) >= k else None


def _vector_leg(keep: dict[str, Batch], res: Pinned, memory_id: str, total: int, leaf: str | None,
                index: VectorIndex | None, settings: Settings) -> VectorLeg:
    state = keep[DESCEND].states[0]
    q, leg = state.query, state.legs.get("vector")
    hits = leg.hits if leg is not None else []
    out = VectorLeg(status="hit", top_k=q.top_k, hits=len(hits), kth_cosine=_kth(hits, q.top_k), leaf=leaf)
    stopped = _leg_state(leg, q.weights.get("vector", 0.0))
    if stopped is not None:
        return out.model_copy(update={"status": stopped})
    hit = _find(hits, memory_id)
    if hit is not None:
        return out.model_copy(update={"rank": hit.rank, "cosine": hit.score})
    # the leg again, from the embedded query, keeping every memory the beam reaches, the beam traced
    again = keep[EMBED].model_copy(deep=True)
    again.states[0].query.top_k = max(total, q.top_k)
    trace: dict[str, list] = {}
    found = _find(descend.run(again, res, trace=trace).states[0].legs["vector"].hits, memory_id)
    if found is not None:
        return out.model_copy(update={"status": "below_top_k", "rank": found.rank, "cosine": found.score})
    beam = None
    if leaf is not None and index is not None:
        beam = _beam_cut(index, leaf, trace.get(q.id, []), settings.tree.beam_width,
                         list((leg.profile if leg is not None else {}).get("reached", [])))
    return out.model_copy(update={"status": "beam", "beam": beam})


def _beam_cut(index: VectorIndex, leaf: str, trace: list[list[tuple[str, float]]], width: int,
              reached: list[str]) -> BeamCut:
    """Where the traced descent dropped ``leaf``'s path: the first depth whose
    candidates hold a topic of the path past the beam's width (at most one
    topic of a path is a candidate at a depth)."""
    path, t = set(), index.key_index[leaf]
    while t >= 0:
        path.add(index.keys[t])
        t = int(index.parent[t])
    best: int | None = None
    last: tuple[int, str, int, float, int, float | None] | None = None
    for depth, ranked in enumerate(trace, start=1):
        at = next(((i, key, score) for i, (key, score) in enumerate(ranked, start=1) if key in path), None)
        if at is None:
            continue
        rank, key, score = at
        if key == leaf:
            best = rank if best is None else min(best, rank)
        kept = ranked[width - 1][1] if len(ranked) >= width else None
        last = (depth, key, rank, score, len(ranked), kept)
        if rank > width:
            break
    if last is None:  # the descent made no cut at all (the frontier was all leaves)
        return BeamCut(leaf=leaf, topic=leaf, depth=0, rank=None, candidates=0, beam_width=width, score=None,
                       last_kept_score=None, leaf_best_rank=None, leaves_reached=reached)
    depth, key, rank, score, n, kept = last
    return BeamCut(leaf=leaf, topic=key, depth=depth, rank=rank if rank > width else None, candidates=n,
                   beam_width=width, score=score, last_kept_score=kept, leaf_best_rank=best, leaves_reached=reached)


def _fulltext_leg(keep: dict[str, Batch], start: Batch, res: Pinned, memory_id: str, total: int) -> FulltextLeg:
    state = keep[FULLTEXT].states[0]
    q, leg = state.query, state.legs.get("fts")
    hits = leg.hits if leg is not None else []
    out = FulltextLeg(status="hit", top_k=q.top_k, hits=len(hits), kth_bm25=_kth(hits, q.top_k),
                      best_bm25=hits[0].score if hits else None)
    stopped = _leg_state(leg, q.weights.get("fts", 0.0))
    if stopped is not None:
        return out.model_copy(update={"status": stopped})
    hit = _find(hits, memory_id)
    if hit is not None:
        return out.model_copy(update={"rank": hit.rank, "bm25": hit.score})
    # the leg again, keeping every memory that matches
    again = start.model_copy(deep=True)
    again.states[0].query.top_k = max(total, q.top_k)
    found = _find(fulltext.STAGE.run(again, res).states[0].legs["fts"].hits, memory_id)
    if found is None:
        return out.model_copy(update={"status": "no_match"})
    return out.model_copy(update={"status": "below_top_k", "rank": found.rank, "bm25": found.score})


def _vector_drop(memory_id: str, leg: VectorLeg) -> Drop | None:
    if leg.status == "timed_out":
        return Drop(stage=DESCEND, reason=Reason.leg_timed_out, detail="the vector leg ran out of time (max_ms)")
    if leg.status == "below_top_k":
        return Drop(stage=DESCEND, reason=Reason.vector_top_k, detail=(
            f"the vector leg kept its top {leg.top_k}: {memory_id} ranked {leg.rank} (cosine {leg.cosine:.4f}; "
            f"the last kept, #{leg.top_k}: {_num(leg.kth_cosine)})"))
    if leg.status == "beam":
        b = leg.beam
        if b is None:
            return Drop(stage=DESCEND, reason=Reason.beam, detail="the vector leg's beam did not reach it")
        if b.leaf in b.leaves_reached:  # reached, yet not scored: nothing the beam did
            return None
        if b.rank is None:
            where = f"the descent stopped at max_depth (depth {b.depth}) with {b.topic} kept, above the leaf"
        else:
            where = (f"{b.topic} ranked {b.rank} of {b.candidates} candidates at depth {b.depth} (centroid score "
                     f"{_num(b.score)}; the last kept, #{b.beam_width}: {_num(b.last_kept_score)})")
        best = f"#{b.leaf_best_rank}" if b.leaf_best_rank is not None else "never a candidate"
        return Drop(stage=DESCEND, reason=Reason.beam, detail=(
            f"the vector leg's beam (width {b.beam_width}) did not reach its leaf {b.leaf}: {where}; the leaf's "
            f"best rank among the beam's candidates: {best}"))
    return None


def _fulltext_drop(memory_id: str, leg: FulltextLeg) -> Drop | None:
    if leg.status == "timed_out":
        return Drop(stage=FULLTEXT, reason=Reason.leg_timed_out, detail="the full-text leg ran out of time (max_ms)")
    if leg.status == "no_match":
        return Drop(stage=FULLTEXT, reason=Reason.fts_no_match,
                    detail=f"the full-text leg did not match {memory_id}: it holds none of the query's terms")
    if leg.status == "below_top_k":
        return Drop(stage=FULLTEXT, reason=Reason.fts_top_k, detail=(
            f"the full-text leg kept its top {leg.top_k}: {memory_id} ranked {leg.rank} (BM25 {leg.bm25:.4f}; "
            f"the last kept, #{leg.top_k}: {_num(leg.kth_bm25)})"))
    return None


# -- after fusion -----------------------------------------------------------------------
def _without_budget(fused: Batch, res: Pinned) -> QueryState:
    """The stages after fusion again, with no budget: every candidate in the
    order the budget would cut (supersession applied, scope held)."""
    out = fused.model_copy(deep=True)
    out.states[0].query.budget = Budget()
    for name in AFTER_FUSION:
        out = STAGES[name].run(out, res)
    return out.states[0]


def _placed(result: Result, final: QueryState) -> Placement:
    last = final.results[-1] if final.results else None
    cut = final.truncation
    return Placement(rank=result.rank, score=result.score, rrf=result.rrf, ranks=result.ranks,
                     kept=len(final.results),
                     last_kept_id=last.id if last else None, last_kept_score=last.score if last else None,
                     cut_by=cut.by if cut else None, limit=cut.limit if cut else None,
                     promoted_above_it=[r.id for r in final.results if r.promoted_above == result.id])


def _budget_drop(memory_id: str, p: Placement) -> Drop:
    kept = (f"the last kept, #{p.kept}: {p.last_kept_id} (score {p.last_kept_score:.5f})" if p.last_kept_id
            else "nothing was kept")
    cut = f"{p.cut_by} limit {p.limit}" if p.cut_by else "the budget"
    below = f"fused score {p.score:.5f} at rank {p.rank}, below the cut ({cut}; {kept})"
    if p.promoted_above_it:
        below += f"; supersession placed its successor {', '.join(p.promoted_above_it)} above it"
    return Drop(stage=BUDGET, reason=Reason.budget, detail=f"{memory_id} was cut by the budget: {below}")


def _unexplained(memory_id: str, fused: Fused | None) -> Drop:
    where = "a fusion candidate" if fused is not None else "in no leg's list"
    return Drop(stage=FUSION if fused is not None else STORE, reason=Reason.unexplained,
                detail=f"{memory_id} was {where}, and no stage of the replay says where it went")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
