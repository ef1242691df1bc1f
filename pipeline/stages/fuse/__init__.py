"""The ``search.fuse`` stage: the legs' lists become one, by reciprocal rank
fusion (Cormack, Clarke & Buettcher, SIGIR 2009) or convex fusion, then the
recency boost where a query asks for it (``recency``, a helper of this stage).

``score(d) = sum over legs of w_leg / (k + rank_leg(d))`` with k = 60 by
default (ranx's ``rrf(runs, k=60)``). Ties keep a stable order: best single
rank first, then memory id. The full-text leg's rank is its position, except
that hits whose BM25 lies within ``fts_tie_tolerance`` (0.1) of their group's
first count at the group's average position (``tie_ranks``): they matched the
same terms and differ by length, so the vector leg orders them. Beside another
leg, full-text hits scoring under ``fts_floor`` (0.5) of the leg's best do not
count at all (``counted_ranks``): a partial match, which RRF would otherwise
weigh by its position alone.

Hybrid leg weights, by default (``fusion_weights = "lexical_match"``), are
chosen per query from how well the full-text leg's best hit matches the whole
query: ``m`` = its BM25 score over the sum of the query's term IDFs
(``pipeline.store.fulltext.query_idf``: what one occurrence of every term in
an average-length memory scores; a term no memory holds counts with df 0,
stopwords not at all), capped at 1; the vector leg
weighs 1 and the full-text leg ``scale * m ** power`` (8 and 2). A query whose
words the lexical leg finds together in one memory (an identifier, a name with
its attribute) leans on it; one whose best lexical hit shares a word or two
leans on the vector leg. ``fixed`` uses ``vector_weight``/``fts_weight``.
Measured on six judged sets in BENCHMARKS.md ("Fusion defaults (issue 16)").

``fusion = "convex"`` (a setting, or a query's option) is the score-aware
alternative: each leg's scores min-max normalised over the hits it returned,
then ``sum of w_leg / sum(w) * norm_leg(d)``, a memory a leg did not return
scoring 0 from it; hybrid weights default to ``convex_alpha`` : ``1 -
convex_alpha`` and are not chosen per query. Ties as in RRF.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from pipeline.contracts import LEGS, Batch, Fused, Fusion, LegRun, Mode, QueryState
from pipeline.settings import Settings
from pipeline.stages.fuse.recency import apply_recency
from pipeline.stages.stage import Resources, Stage
from pipeline.store.fulltext import query_idf
from pipeline.store.reader import View
from pipeline.timing import ms_since


def tie_ranks(scores: list[float], tolerance: float) -> list[float]:
    """The ranks RRF counts for one leg's hits (scores best first): hits whose
    scores lie within ``tolerance`` (relative) of their group's first share
    the group's average position, so a leg that cannot tell them apart lets
    the other leg order them. Tolerance 0 keeps the positions 1, 2, 3..."""
    if tolerance <= 0:
        return [float(i) for i in range(1, len(scores) + 1)]
    out: list[float] = []
    start, lead = 0, None
    for i, value in enumerate(scores):
        if lead is None or value < lead * (1 - tolerance) or (lead <= 0 and value != lead):
            out += [(start + 1 + i) / 2] * (i - start)  # the closed group's average position
            start, lead = i, value
    out += [(start + 1 + len(scores)) / 2] * (len(scores) - start)
    return out


def counted_ranks(scores: list[float], tolerance: float, floor: float = 0.0) -> list[float | None]:
    """The full-text leg's RRF ranks (scores best first): ``tie_ranks`` over
    the whole list, then None (not counted) for each hit scoring under
    ``floor`` times the best. The groups are formed before the floor, so a
    group the floor cuts keeps the rank it had."""
    ranks: list[float | None] = list(tie_ranks(scores, tolerance))
    cut = floor_cut(scores[0], floor) if scores else None
    if cut is not None:
        ranks = [None if value < cut else r for r, value in zip(ranks, scores)]
    return ranks


def floor_cut(best: float, floor: float) -> float | None:
    """The BM25 under which a full-text hit counts nothing: ``floor`` times the
    leg's ``best`` score (None: no floor, or no positive best)."""
    return floor * best if floor > 0 and best > 0 else None


def rrf(legs: dict[str, list[str]], weights: dict[str, float], k: int,
        tied: dict[str, list[float | None]] | None = None) -> list[Fused]:
    """Fuse ranked id lists (best first) into one list, best first. ``tied``
    gives a leg's RRF ranks where they are not its positions (``counted_ranks``;
    None: the hit counts nothing, but stays in the list with its position);
    ``Fused.ranks`` keeps the positions and ``Fused.tied_ranks`` what was counted instead."""
    scores: dict[str, float] = {}
    ranks: dict[str, dict[str, int]] = {}
    counted: dict[str, dict[str, float | None]] = {}
    for leg in sorted(legs):
        weight = weights.get(leg, 1.0)
        used = (tied or {}).get(leg)
        for rank, memory_id in enumerate(legs[leg], start=1):
            ranks.setdefault(memory_id, {})[leg] = rank
            r = used[rank - 1] if used is not None else rank
            if r != rank:
                counted.setdefault(memory_id, {})[leg] = r
            scores[memory_id] = scores.get(memory_id, 0.0) + (weight / (k + r) if r is not None else 0.0)
    order = sorted(scores, key=lambda m: (-scores[m], min(ranks[m].values()), m))
    return [Fused(id=m, rrf=scores[m], score=scores[m], ranks=ranks[m], tied_ranks=counted.get(m, {})) for m in order]


def convex(legs: dict[str, list[tuple[str, float]]], weights: dict[str, float]) -> list[Fused]:
    """Fuse ranked (id, score) lists (best first) by a weighted sum of each
    leg's min-max normalised scores, best first. A leg's weight counts as its
    share of the weights' sum; a leg with one score (or all equal) gives its
    hits 1."""
    total = sum(weights.get(leg, 1.0) for leg in legs) or 1.0
    scores: dict[str, float] = {}
    ranks: dict[str, dict[str, int]] = {}
    for leg in sorted(legs):
        hits = legs[leg]
        share = weights.get(leg, 1.0) / total
        if not hits:
            continue
        values = [s for _, s in hits]
        lo, span = min(values), max(values) - min(values)
        for rank, (memory_id, value) in enumerate(hits, start=1):
            ranks.setdefault(memory_id, {})[leg] = rank
            norm = (value - lo) / span if span > 0 else 1.0
            scores[memory_id] = scores.get(memory_id, 0.0) + share * norm
    order = sorted(scores, key=lambda m: (-scores[m], min(ranks[m].values()), m))
    return [Fused(id=m, rrf=scores[m], score=scores[m], ranks=ranks[m]) for m in order]


@dataclass(frozen=True)
class LegWeighting:
    """How hybrid queries' leg weights are chosen (the fusion fields of ``Settings``)."""

    how: str = "lexical_match"  # or "fixed": the query's resolved weights as they are
    scale: float = 8.0
    power: float = 2.0

    @classmethod
    def of(cls, settings) -> LegWeighting:
        return cls(settings.fusion_weights, settings.lexical_match_scale, settings.lexical_match_power)


def lexical_match(top_score: float, query_idf: float) -> float:
    """How well the full-text leg's best hit matches the whole query, in [0, 1]."""
    if query_idf <= 0 or top_score <= 0:
        return 0.0
    return min(1.0, top_score / query_idf)


def adapt_weights(state: QueryState, weighting: LegWeighting, query_idf: Callable[[str], float] | None) -> None:
    """Hybrid queries without weights of their own get per-query weights
    (``lexical_match``); the weights used replace ``query.weights`` (the audit
    row's RRF terms) and the match is kept in the full-text leg's profile."""
    q = state.query
    if (weighting.how != "lexical_match" or q.fusion is not Fusion.rrf or q.options.mode is not Mode.hybrid
            or q.options.weights is not None):
        return
    fts, vector = state.legs.get("fts"), state.legs.get("vector")
    if fts is None or vector is None or not (fts.ran and vector.ran) or query_idf is None:
        return
    m = lexical_match(fts.hits[0].score, query_idf(q.text)) if fts.hits else 0.0
    fts.profile["lexical_match"] = round(m, 6)
    q.weights = {"vector": 1.0, "fts": weighting.scale * m ** weighting.power}


def merge_legs(parts: list[Batch]) -> Batch:
    """Join the chord's header results (one batch per leg) into one batch."""
    base = parts[0].model_copy(deep=True)
    for other in parts[1:]:
        if len(other.states) != len(base.states):
            raise ValueError("chord parts disagree on the number of queries")
        for state, theirs in zip(base.states, other.states):
            if state.query.id != theirs.query.id:
                raise ValueError("chord parts disagree on query order")
            for name, leg in theirs.legs.items():
                if leg.ran or name not in state.legs:
                    state.legs[name] = leg
            for stage, ms in theirs.timings.items():
                state.timings.setdefault(stage, ms)
            if theirs.query.vector is not None:
                state.query.vector = theirs.query.vector
    return base


def fuse_state(state: QueryState, k: int, weighting: LegWeighting | None = None,
               query_idf: Callable[[str], float] | None = None, fts_ties: float = 0.0,
               fts_floor: float = 0.0) -> QueryState:
    """RRF (or convex fusion, as the query asks) over the legs that ran (weight > 0);
    under RRF the full-text leg's hits within ``fts_ties`` of each other share a rank
    and, beside another leg, those under ``fts_floor`` of its best count nothing (``counted_ranks``)."""
    t0 = time.perf_counter()
    for name in LEGS:
        state.legs.setdefault(name, LegRun(leg=name))
    if weighting is not None:
        adapt_weights(state, weighting, query_idf)
    ran = {name: leg for name, leg in state.legs.items() if leg.ran and state.query.weights.get(name, 0) > 0}
    if state.query.fusion is Fusion.convex:
        state.fused = convex({name: [(h.id, h.score) for h in leg.hits] for name, leg in ran.items()},
                             state.query.weights)
    else:
        # a leg alone (or beside one that found nothing) keeps its hits' scores
        floor = fts_floor if sum(1 for leg in ran.values() if leg.hits) > 1 else 0.0
        tied = ({"fts": counted_ranks([h.score for h in ran["fts"].hits], fts_ties, floor)}
                if (fts_ties > 0 or floor > 0) and "fts" in ran else None)
        state.fused = rrf({name: [h.id for h in leg.hits] for name, leg in ran.items()}, state.query.weights, k, tied)
    # consumed: the leg ranks live on in ``fused``; keep the wire small
    state.query.vector = None
    for leg in state.legs.values():
        leg.keep_top()
    state.timings["fuse"] = ms_since(t0)
    return state


def fuse_batch(parts: list[Batch], k: int, created_at_of: Callable[[list[str]], dict[str, datetime]],
               weighting: LegWeighting | None = None, query_idf: Callable[[str], float] | None = None,
               fts_ties: float = 0.0, fts_floor: float = 0.0) -> Batch:
    """The ``search.fuse`` stage: merge the legs, choose hybrid weights, fuse, apply recency where asked."""
    batch = merge_legs(parts)
    for state in batch.states:
        fuse_state(state, k, weighting, query_idf, fts_ties, fts_floor)
        boost = state.query.options.recency_boost
        if boost > 0 and state.fused:
            t0 = time.perf_counter()
            now = state.query.options.now or state.query.started_utc
            state.fused = apply_recency(state.fused, created_at_of([f.id for f in state.fused]), boost, now)
            state.timings["recency"] = ms_since(t0)
    return batch


def run(parts: list[Batch], res: Resources) -> Batch:
    """``fuse_batch`` over the published store: created-at and the query
    terms' IDFs come from the view (none without a store)."""
    settings = res.settings()
    with res.view() as v:
        created = v.created_at if v is not None else _nothing_created
        idf = _query_idf_of(v, settings) if v is not None and v.cursor is not None else None
        return fuse_batch(parts, settings.rrf_k, created, LegWeighting.of(settings), idf, settings.fts_tie_tolerance,
                          settings.fts_floor)


def _nothing_created(ids: list[str]) -> dict[str, datetime]:
    return {}


def _query_idf_of(view: View, settings: Settings) -> Callable[[str], float]:
    return lambda text: query_idf(view.cursor, text, settings.fulltext, view.overlay, view.postings())


STAGE = Stage("search.fuse", run, fan_in=True)
