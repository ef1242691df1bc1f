"""``dimple tune``: choose a store's fusion settings from a user's judged
queries by k-fold cross-validation, and say what they are expected to gain.

The grid is small and stated (``GRID``): convex fusion with the vector leg's
share alpha 0.1, 0.2, ..., 0.9 (Bruch et al. 2023), and RRF with k 10 and 60
(Cormack et al. 2009; k=60 is theirs, 10 the default here), 11 configurations.
Each query's legs run once (``fused_runs``: the vector and full-text stages of
``pipeline.stages.registry``), and every configuration, the current settings
included, re-fuses those same candidate lists through the stages after the legs
(fuse, augment, scope, budget), so all are scored on identical candidates and
a configuration costs a fusion, not a query.

Cross-validation (``cross_validate``): the queries are shuffled with a fixed
seed and dealt into ``k`` folds (5 by default: with the minimum of 20 queries
each fold still holds 4, and each choice is made on 80% of them, the usual
compromise between the bias of small training sets and the variance of tiny
test folds, Kohavi 1995). For each fold the configuration with the best mean
on the other folds is chosen and scored on that fold alone; every query is
held out exactly once, so the held-out figures form one paired sample against
the current settings on the same queries, tested with ``paired_p_value``
(randomised permutation, seed fixed). The expected gain is their mean
difference. The configuration applied is the one best on all queries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.audit.whynot import Pinned
from pipeline.contracts import Batch, QueryState, make_query
from pipeline.errors import InputError
from pipeline.evaluation.metrics import paired_p_value, parse_metric, score
from pipeline.evaluation.queries import QuerySet
from pipeline.settings import Settings
from pipeline.stages.fuse import merge_legs
from pipeline.stages.registry import AFTER_FUSION, FULLTEXT_LEG, FUSION, STAGES, VECTOR_LEG, Resources
from pipeline.store.reader import Snapshot
from pipeline.store.tuned import TunedFusion

MIN_QUERIES = 20  # below this a fold holds too few queries for its figure to mean anything
DEFAULT_FOLDS = 5
DEFAULT_SEED = 42
MAX_P = 0.05


@dataclass(frozen=True)
class FusionConfig:
    """One point of the grid: convex with ``convex_alpha``, or RRF with ``rrf_k``."""

    fusion: str
    convex_alpha: float | None = None
    rrf_k: int | None = None

    @property
    def name(self) -> str:
        return f"convex alpha={self.convex_alpha:g}" if self.fusion == "convex" else f"rrf k={self.rrf_k}"

    def apply(self, settings: Settings) -> Settings:
        """``settings`` with this configuration, and not the store's tuned one."""
        return settings.replace(**self.tuned().changes(), use_tuned=False)

    def tuned(self) -> TunedFusion:
        return TunedFusion(fusion=self.fusion, convex_alpha=self.convex_alpha, rrf_k=self.rrf_k)


GRID: tuple[FusionConfig, ...] = (
    *(FusionConfig("convex", convex_alpha=round(a / 10, 1)) for a in range(1, 10)),
    *(FusionConfig("rrf", rrf_k=k) for k in (10, 60)),
)


def current_config(settings: Settings) -> FusionConfig:
    """The configuration ``settings`` fuse with (the effective ones: the store's tuned values included)."""
    if settings.fusion == "convex":
        return FusionConfig("convex", convex_alpha=settings.convex_alpha)
    return FusionConfig("rrf", rrf_k=settings.rrf_k)


# -- legs once, every configuration re-fused -----------------------------------------------
def fused_runs(qset: QuerySet, settings: Settings, res: Resources, snap: Snapshot | None,
               configs: list[FusionConfig], *,
               defaults: dict[str, Any] | None = None, batch_size: int = 64) -> dict[FusionConfig, dict[str, list[str]]]:
    """Each configuration's run (query id -> served ids, best first) over
    ``qset``: the legs run once per query (both legs, whatever the weights),
    then each configuration fuses their lists and the stages after fusion run
    as on the workers. A query's own options (mode, weights, fusion) win over
    the configuration, as in a search. One store snapshot (``snap``) serves them all."""
    # both legs: RRF 1:1 wants each leg of a hybrid query; keyword/semantic queries keep their one leg
    leg_settings = settings.replace(fusion="rrf", vector_weight=1.0, fts_weight=1.0, use_tuned=False)
    legs_res = Pinned(res, snap, leg_settings)
    asked = [(q.id, q.text, {**(defaults or {}), **q.options}) for q in qset.queries]
    runs: dict[FusionConfig, dict[str, list[str]]] = {c: {} for c in configs}
    per_config = {c: c.apply(settings) for c in configs}
    for start in range(0, len(asked), batch_size):
        chunk = asked[start:start + batch_size]
        batch = Batch(states=[QueryState(query=make_query(text, opts, leg_settings)) for _, text, opts in chunk])
        parts = []
        for leg in (VECTOR_LEG, FULLTEXT_LEG):
            part = batch.model_copy(deep=True)
            for name in leg:
                part = STAGES[name].run(part, legs_res)
            parts.append(part)
        # joined once; the fusion stage copies what it is given, so each configuration starts from these lists
        legs = merge_legs(parts)
        for state in legs.states:
            state.query.vector = None  # the descent has used it; fusion drops it too
        for config in configs:
            cfg = per_config[config]
            cfg_res = Pinned(res, snap, cfg)
            for state, (_, text, opts) in zip(legs.states, chunk):
                q = make_query(text, opts, cfg)
                state.query.fusion, state.query.weights = q.fusion, q.weights
            out = STAGES[FUSION].run([legs], cfg_res)
            for name in AFTER_FUSION:
                out = STAGES[name].run(out, cfg_res)
            for state, (qid, _, _) in zip(out.states, chunk):
                runs[config][qid] = [r.id for r in state.results]
    return runs


# -- cross-validation -------------------------------------------------------------------------
@dataclass
class Fold:
    index: int
    queries: int
    chosen: FusionConfig
    train_mean: float
    held_out_mean: float
    current_mean: float


@dataclass
class TuneResult:
    metric: str
    folds: list[Fold]
    queries: int
    seed: int
    current: FusionConfig
    current_mean: float
    held_out_mean: float
    gain: float
    p_value: float
    chosen: FusionConfig
    chosen_mean: float
    means: dict[FusionConfig, float] = field(default_factory=dict)

    def significant(self, max_p: float = MAX_P) -> bool:
        return self.gain > 0 and self.p_value < max_p

    def evidence(self, max_p: float = MAX_P) -> dict[str, Any]:
        """What the store records beside the tuned settings (``pipeline.store.tuned``)."""
        return {
            "metric": self.metric, "queries": self.queries, "folds": len(self.folds), "seed": self.seed,
            "current": self.current.name, "current_mean": round(self.current_mean, 6),
            "held_out_mean": round(self.held_out_mean, 6), "gain": round(self.gain, 6),
            "p_value": self.p_value, "max_p": max_p, "stat_test": "fisher",
            "per_fold": [{"fold": f.index, "queries": f.queries, "chosen": f.chosen.name,
                          "held_out_mean": round(f.held_out_mean, 6), "current_mean": round(f.current_mean, 6)}
                         for f in self.folds],
        }


def check_queries(qset: QuerySet, folds: int) -> list[str]:
    """The judged query ids (a grade of at least 1), at least ``MIN_QUERIES``
    and at least one per fold; an ``InputError`` naming the field otherwise."""
    if folds < 2:
        raise InputError("--folds", f"must be at least 2, not {folds}")
    ids = [q.id for q in qset.queries if any(g >= 1 for g in qset.qrels.get(q.id, {}).values())]
    if len(ids) < MIN_QUERIES:
        raise InputError("QUERIES", f"{len(ids)} judged queries; tuning needs at least {MIN_QUERIES} "
                                    "(queries with a relevant judgment in QRELS)")
    if folds > len(ids):
        raise InputError("--folds", f"{folds} folds for {len(ids)} judged queries: at most one fold per query")
    return ids


def deal(ids: list[str], k: int, seed: int) -> list[list[str]]:
    """``ids`` shuffled with ``seed`` and dealt into ``k`` folds whose sizes differ by at most one."""
    order = [ids[i] for i in np.random.default_rng(seed).permutation(len(ids))]
    return [order[i::k] for i in range(k)]


def cross_validate(runs: dict[FusionConfig, dict[str, list[str]]], current: FusionConfig, ids: list[str],
                   qrels: dict[str, dict[str, int]], *, metric: str = "ndcg@10", k: int = DEFAULT_FOLDS,
                   seed: int = DEFAULT_SEED) -> TuneResult:
    """k-fold cross-validation of choosing a configuration of ``runs`` by its
    mean ``metric``, against ``current`` (one of ``runs``). A tie keeps the
    current configuration, else the first in the runs' order."""
    parse_metric(metric)
    judged = {q: qrels[q] for q in ids}
    per: dict[FusionConfig, dict[str, float]] = {
        c: {q: v[metric] for q, v in score(run, judged, [metric])[1].items()} for c, run in runs.items()}
    order = [current, *(c for c in runs if c != current)]

    def best(queries: list[str]) -> tuple[FusionConfig, float]:
        means = {c: float(np.mean([per[c][q] for q in queries])) for c in order}
        top = max(means.values())
        chosen = next(c for c in order if means[c] >= top - 1e-12)
        return chosen, means[chosen]

    folds, held, base = [], [], []
    for i, fold in enumerate(deal(ids, k, seed), start=1):
        rest = [q for q in ids if q not in set(fold)]
        chosen, train = best(rest)
        held += [per[chosen][q] for q in fold]
        base += [per[current][q] for q in fold]
        folds.append(Fold(i, len(fold), chosen, train, float(np.mean([per[chosen][q] for q in fold])),
                          float(np.mean([per[current][q] for q in fold]))))
    chosen, chosen_mean = best(ids)
    return TuneResult(
        metric=metric, folds=folds, queries=len(ids), seed=seed, current=current,
        current_mean=float(np.mean(base)), held_out_mean=float(np.mean(held)),
        gain=float(np.mean(held) - np.mean(base)), p_value=paired_p_value(base, held, stat_test="fisher", seed=seed),
        chosen=chosen, chosen_mean=chosen_mean,
        means={c: float(np.mean([per[c][q] for q in ids])) for c in order},
    )
