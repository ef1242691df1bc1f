"""Fusion defaults (issues 16 and 31): each leg run once per judged set, deep,
then every fusion candidate evaluated offline on the cached lists, and (issue
31) each family's parameters chosen leaving one set out in turn: only real
judged sets (``--beir`` folders of ../shared/data/beir, ``--locomo``) choose;
generated ones (``--demo``, ``--probe``) test behaviour.

    # 1. cache: both legs once per query, top --depth with scores and query-time signals
    python -m ops.bench.fusion cache --demo --data-dir /tmp/fusion/data --out /tmp/fusion/cache/demo.json
    python -m ops.bench.fusion cache --locomo ../shared/data/locomo/locomo10.json --data-dir /tmp/fusion/data \\
        --out /tmp/fusion/cache/locomo.json
    python -m ops.bench.fusion cache --probe entities --data-dir /tmp/fusion/data --out /tmp/fusion/cache/entities.json
    # 2. evaluate every candidate on every cache (numpy, no model, no store); with 3 sets or more, choose
    #    each family's parameters leaving one set out (``POOLS``)
    python -m ops.bench.fusion evaluate /tmp/fusion/cache/*.json --out /tmp/fusion/fusion.json --md /tmp/fusion/fusion.md \\
        --loso-md /tmp/fusion/loso.md

``--probe NAME`` is a set of ``pipeline.datasets.probes``, written as a BEIR
folder under the data dir and ingested like ``dimple eval --beir``; ``--beir
DIR`` is such a folder as it is (``ops/bench/data/docs_qa``). Stores are
built when absent (``workers.cli.eval.load_source``, the same stores ``dimple
eval`` uses with ``DIMPLE_DATA_DIR`` set to the data dir).

The legs run through the pipeline's own stages (``search.embed``,
``search.descend``, ``search.fulltext``) with both weights 1 and ``top_k`` =
``--depth``; the cache holds each leg's ranked ids and scores, the query's
stemmed terms with their document frequencies and the store's size. Fusion
candidates only reorder these lists, so a candidate's figures are what the
engine would serve before augment (supersession, scope checks, budget).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.evaluation.metrics import score
from pipeline.store.fulltext import idf as term_idf
from workers.settings import WorkerSettings

LEG_NAMES = ("vector", "fts")
METRICS = ("ndcg@10", "recall@10")


# -- cache ---------------------------------------------------------------------------------
def cache(args) -> dict[str, Any]:
    import workers
    from pipeline.contracts import Batch, QueryState, make_query
    from pipeline.stages.registry import FULLTEXT_LEG, STAGES, VECTOR_LEG
    from pipeline.store.fulltext import query_terms
    from workers import resources
    from workers.cli.eval import load_source

    os.environ["DIMPLE_DATA_DIR"] = str(args.data_dir)

    settings = WorkerSettings()
    beir = args.beir
    if args.probe:
        from pipeline.datasets.probes import SETS, write_beir

        beir = write_beir(SETS[args.probe](args.seed), Path(args.data_dir) / "probe-sets")
    source = argparse.Namespace(queries=None, qrels=None, beir=beir, locomo=args.locomo, demo=args.demo,
                                store=None, strict=False)
    qset, run_settings = load_source(source, settings)
    workers.configure(run_settings)
    bm25 = {"k1": run_settings.fulltext.k1, "b": run_settings.fulltext.b}
    out: dict[str, Any] = {"set": args.probe or qset.name, "depth": args.depth, "bm25": bm25, "queries": []}
    specs = qset.queries[: args.limit] if args.limit else qset.queries
    # --reuse-vector: the vector leg's lists from a cache of the same set (they do not depend on
    # the full-text settings), so a BM25 variant runs the full-text leg alone
    reused = {q["id"]: q["vector"] for q in json.loads(args.reuse_vector.read_text(encoding="utf-8"))["queries"]} \
        if args.reuse_vector else None
    if reused is not None and any(spec.id not in reused for spec in specs):
        raise SystemExit(f"{args.reuse_vector} is not a cache of {out['set']} (its queries differ)")
    legs_run = (("fts", FULLTEXT_LEG),) if reused is not None else (("vector", VECTOR_LEG), ("fts", FULLTEXT_LEG))
    t0 = time.perf_counter()
    with resources.current().view() as v:
        postings = v.postings() if v is not None else None
        if v is None or postings is None:
            raise SystemExit(f"no store with a full-text index in {run_settings.data_dir}")
        n_docs = int(postings.num_docs)
        out["n_docs"] = n_docs
        out["avgdl"] = float(postings.total_len / n_docs) if n_docs else 0.0
        for start in range(0, len(specs), 64):
            chunk = specs[start:start + 64]
            states = []
            for spec in chunk:
                ask = spec.ask({})
                text = ask.pop("query")
                ask.update(mode="hybrid", weights={"vector": 1.0, "fts": 1.0}, top_k=args.depth)
                states.append(QueryState(query=make_query(text, ask, run_settings)))
            legs = {}
            for name, stages in legs_run:
                part = Batch(states=[s.model_copy(deep=True) for s in states])
                for stage in stages:
                    part = STAGES[stage].run(part, resources.current())
                legs[name] = part
            for i, spec in enumerate(chunk):
                terms = query_terms(v.cursor, spec.text, run_settings.fulltext)  # stopwords left out
                tids = postings.termids(terms)
                out["queries"].append({
                    "id": spec.id,
                    "text": spec.text,
                    "qrels": qset.qrels.get(spec.id, {}),
                    "terms": [[t, int(postings.df[tids[t]]) if t in tids else 0] for t in terms],
                    **{name: [[h.id, h.score] for h in legs[name].states[i].legs[name].hits] for name in legs},
                    **({"vector": reused[spec.id]} if reused is not None else {}),
                })
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


# -- issue 16's rules, removed from the engine in issue 31 (measured here, beside what replaced them) ---
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
    if floor > 0 and scores and scores[0] > 0:
        cut = floor * scores[0]
        ranks = [None if value < cut else r for r, value in zip(ranks, scores)]
    return ranks


def lexical_match(top_score: float, query_idf: float) -> float:
    """How well the full-text leg's best hit matches the whole query, in [0, 1]."""
    if query_idf <= 0 or top_score <= 0:
        return 0.0
    return min(1.0, top_score / query_idf)


# -- signals (query time, from the legs' lists) -------------------------------------------------
def signals(q: dict, n_docs: int) -> dict[str, float]:
    """What a per-query fusion reads at query time: ``fts_top_norm``, the full-text leg's top BM25 over
    the sum of the query terms' IDFs (what a one-occurrence, average-length match of every term scores;
    issue 16's lexical match m)."""
    idf_all = sum(term_idf(df, n_docs) for _, df in q["terms"])
    fts = [s for _, s in q["fts"]]
    return {"fts_top_norm": lexical_match(fts[0], idf_all) if fts else 0.0}


# -- candidates -------------------------------------------------------------------------------
def _ids(q: dict, leg: str) -> list[str]:
    return [d for d, _ in q[leg]]


class Lists:
    """One cached query's two lists over their union, as arrays, so that a candidate is a few numpy
    operations (the engine's functions build a ``Fused`` per memory: ~20 ms a query). The order of
    every candidate is the engine's: fused score, then the best single position, then the id;
    ``tests/unit/test_fusion_bench.py`` holds each against ``pipeline.stages.fuse`` on real lists."""

    def __init__(self, q: dict):
        self.q = q
        self.ids = list(dict.fromkeys(_ids(q, "vector") + _ids(q, "fts")))
        at = {d: i for i, d in enumerate(self.ids)}
        n = len(self.ids)
        self.rank = {leg: np.full(n, np.inf) for leg in LEG_NAMES}
        self.value = {leg: np.full(n, np.nan) for leg in LEG_NAMES}
        self.where = {leg: np.array([at[d] for d, _ in q[leg]], dtype=np.int64) for leg in LEG_NAMES}
        for leg in LEG_NAMES:
            if q[leg]:
                self.rank[leg][self.where[leg]] = np.arange(1, len(q[leg]) + 1)
                self.value[leg][self.where[leg]] = [x for _, x in q[leg]]
        best = np.minimum(self.rank["vector"], self.rank["fts"])
        by_id = np.empty(n, dtype=np.int64)
        by_id[sorted(range(n), key=self.ids.__getitem__)] = np.arange(n)
        self._keys = (by_id, best)
        self._counted: dict[tuple[float, float], np.ndarray] = {}
        self._cut: dict[int, Lists] = {}

    def cut(self, depth: int) -> Lists:
        """These lists as each leg would hand them to fusion with ``leg_top_k`` = ``depth``: its
        ``depth`` best (each leg's own order; the cache holds ``--depth`` of them)."""
        if depth >= max(len(self.q["vector"]), len(self.q["fts"])):
            return self
        if depth not in self._cut:
            self._cut[depth] = Lists({**self.q, **{leg: self.q[leg][:depth] for leg in LEG_NAMES}})
        return self._cut[depth]

    def top(self, scores: np.ndarray, n: int = 10) -> list[str]:
        order = np.lexsort((*self._keys, -scores))[:n]
        return [self.ids[i] for i in order]

    def counted(self, ties: float, floor: float) -> np.ndarray:
        """The full-text ranks RRF counts (``counted_ranks``; inf: counts nothing)."""
        if (ties, floor) not in self._counted:
            out = np.full(len(self.ids), np.inf)
            ranks = counted_ranks([x for _, x in self.q["fts"]], ties, floor)
            out[self.where["fts"]] = [np.inf if r is None else r for r in ranks]
            self._counted[(ties, floor)] = out
        return self._counted[(ties, floor)]


Fuse = Callable[[Lists, dict], list[str]]


def rrf_per_query(weights: Callable[[dict], tuple[float, float]], k: int = 60, ties: float = 0.0,
                  floor: float = 0.0) -> Fuse:
    """RRF (``pipeline.stages.fuse.rrf``: full text's term added first, a leg that missed adds 0) with
    per-query weights; ``ties`` and ``floor``: issue 16's full-text tie tolerance and score floor
    (``pipeline.stages.fuse.counted_ranks``; every cached query ran both legs)."""
    def fuse(lists: Lists, sig: dict) -> list[str]:
        wv, wf = weights(sig)
        floor_here = floor if lists.q["vector"] and lists.q["fts"] else 0.0
        rf = lists.counted(ties, floor_here) if ties > 0 or floor_here > 0 else lists.rank["fts"]
        return lists.top(wf / (k + rf) + wv / (k + lists.rank["vector"]))
    return fuse


def rrf_fixed(wv: float, wf: float, k: int = 60, ties: float = 0.0, floor: float = 0.0) -> Fuse:
    return rrf_per_query(lambda s: (wv, wf), k, ties, floor)


def scaled(c: float, p: float, ties: float = 0.0, floor: float = 0.0) -> Fuse:
    """Issue 16's ``lexical_match``: RRF with the vector leg at 1 and the full-text leg at ``c * m ** p``
    (m = ``fts_top_norm``)."""
    return rrf_per_query(lambda s: (1.0, c * s["fts_top_norm"] ** p), 60, ties, floor)


def _minmax(lists: Lists, leg: str) -> np.ndarray:
    v = lists.value[leg]
    if not lists.q[leg]:
        return np.zeros(len(v))
    lo, span = np.nanmin(v), np.nanmax(v) - np.nanmin(v)
    if span <= 0:  # one hit, or all equal: 1
        return np.where(np.isnan(v), 0.0, 1.0)
    return np.nan_to_num((v - lo) / span, nan=0.0)  # a leg that missed a memory gives it 0


def _zscore(lists: Lists, leg: str) -> np.ndarray:
    v = lists.value[leg]
    if not lists.q[leg]:
        return np.zeros(len(v))
    sd = np.nanstd(v)
    if sd <= 0:  # one hit, or all equal: 1, as min-max gives them
        return np.where(np.isnan(v), 0.0, 1.0)
    z = (v - np.nanmean(v)) / sd
    return np.nan_to_num(z - np.nanmin(z), nan=0.0)  # shifted by the lowest: a miss counts as the lowest


# the lowest score each leg can give: the vector leg's is a cosine (normalised embeddings), BM25's 0
THEORETICAL_MIN = {"vector": -1.0, "fts": 0.0}


def _tmm(lists: Lists, leg: str) -> np.ndarray:
    """Theoretical min-max (Bruch et al. 2023, TMM): a leg's scores less the lowest it could give, over
    its list's highest less that; unlike min-max, how deep the list goes does not move it."""
    v = lists.value[leg]
    if not lists.q[leg]:
        return np.zeros(len(v))
    lo = THEORETICAL_MIN[leg]
    span = np.nanmax(v) - lo
    if span <= 0:
        return np.where(np.isnan(v), 0.0, 1.0)
    return np.nan_to_num((v - lo) / span, nan=0.0)


NORMS = {"minmax": _minmax, "zscore": _zscore, "tmm": _tmm}


def convex(alpha: float, norm: str = "minmax") -> Fuse:
    """``fusion=convex`` (``pipeline.stages.fuse.convex``) at vector share alpha: alpha x minmax(vector) +
    (1 - alpha) x minmax(fts) over the union; a leg that did not return a candidate gives it 0.
    ``norm="zscore"``: each leg's scores less their list's mean over its standard deviation (Bruch et
    al. 2023's other normalisation), a miss counting as the list's lowest z."""
    def fuse(lists: Lists, sig: dict) -> list[str]:
        total = alpha + (1 - alpha)
        return lists.top((1 - alpha) / total * NORMS[norm](lists, "fts") + alpha / total * NORMS[norm](lists, "vector"))
    return fuse


def convex_at(alpha: float, depth: int) -> Fuse:
    """Convex min-max over each leg's ``depth`` best (``DIMPLE_LEG_TOP_K`` = ``depth``): how deep the
    lists go moves min-max's lowest score, and what one leg found below ``depth`` counts 0 there."""
    def fuse(lists: Lists, sig: dict) -> list[str]:
        return convex(alpha)(lists.cut(depth), sig)
    return fuse


def adaptive_convex(p: float) -> Fuse:
    """Convex fusion with a per-query alpha = 1 - m ** p (m = ``fts_top_norm``)."""
    def fuse(lists: Lists, s: dict) -> list[str]:
        return convex(1 - s["fts_top_norm"] ** p)(lists, s)
    return fuse


# the candidate space: every fusion parameter's values (chosen leave-one-set-out; issue 31)
RRF_K = (10, 30, 60, 100)
RRF_VECTOR_WEIGHTS = (0.25, 0.4, 0.5, 0.7, 1.0, 1.4, 2.0, 4.0)  # beside the full-text leg's 1
ALPHAS = tuple(round(0.1 + 0.05 * i, 2) for i in range(17))  # 0.1 .. 0.9, the vector leg's share
# TMM measures a cosine from -1: the vector leg's hits all normalise near 1, so its share runs higher
TMM_ALPHAS = tuple(round(0.3 + 0.05 * i, 2) for i in range(14))  # 0.3 .. 0.95
LEG_DEPTHS = (20, 30, 50, 70)  # beside the cache's own 100 (``DIMPLE_LEG_TOP_K``'s default)
OLD_DEFAULT = "rrf lexical_match 8*m^2, ties 0.1, floor 0.5"  # issue 16's default


class Candidate:
    """One fusion: its family (``FAMILIES``) and the fused order of a cached query."""

    def __init__(self, family: str, fuse: Fuse):
        self.family, self.fuse = family, fuse

    def __call__(self, lists: Lists, sig: dict) -> list[str]:
        return self.fuse(lists, sig)


FAMILIES = {
    "leg": "one leg alone (the references; never chosen)",
    "rrf": "RRF with fixed weights (vector:full text) and k",
    "rrf+rules": "RRF, k 60, with issue 16's ties 0.1 and/or floor 0.5 on fixed weights",
    "lexical_match": "RRF, k 60, full-text weight c*m^p per query (issue 16), with/without ties and floor",
    "convex": "convex combination of min-max normalised scores, vector share alpha",
    "convex_z": "convex combination of z-scores, vector share alpha",
    "convex per query": "convex min-max with alpha = 1 - m^p per query",
    "convex_tmm": "convex combination of theoretical-min-max normalised scores (TMM), vector share alpha",
    "convex depth": "convex min-max over each leg's top d (leg_top_k = d, not 100), vector share alpha",
}


def candidates() -> dict[str, Candidate]:
    out: dict[str, Candidate] = {
        "vector only": Candidate("leg", lambda lists, s: _ids(lists.q, "vector")[:10]),
        "fts only": Candidate("leg", lambda lists, s: _ids(lists.q, "fts")[:10]),
    }
    for k in RRF_K:
        for wv in RRF_VECTOR_WEIGHTS:
            out[f"rrf k={k} {wv:g}:1"] = Candidate("rrf", rrf_fixed(wv, 1.0, k))
    for wv in (0.4, 1.0):
        for ties, floor in ((0.1, 0.0), (0.0, 0.5), (0.1, 0.5)):
            rules = ", ".join(r for r, on in ((f"ties {ties:g}", ties), (f"floor {floor:g}", floor)) if on)
            out[f"rrf k=60 {wv:g}:1, {rules}"] = Candidate("rrf+rules", rrf_fixed(wv, 1.0, 60, ties, floor))
    for c, p in ((4, 2), (8, 1), (8, 2), (8, 3), (16, 2)):
        for ties, floor in ((0.0, 0.0), (0.1, 0.0), (0.0, 0.5), (0.1, 0.5)):
            rules = "".join(r for r, on in ((f", ties {ties:g}", ties), (f", floor {floor:g}", floor)) if on)
            out[f"rrf lexical_match {c:g}*m^{p:g}{rules}"] = Candidate("lexical_match", scaled(c, p, ties, floor))
    for alpha in ALPHAS:
        out[f"convex a={alpha:g}"] = Candidate("convex", convex(alpha))
    for alpha in ALPHAS:
        out[f"convex_z a={alpha:g}"] = Candidate("convex_z", convex(alpha, "zscore"))
    for alpha in TMM_ALPHAS:
        out[f"convex_tmm a={alpha:g}"] = Candidate("convex_tmm", convex(alpha, "tmm"))
    for p in (1, 2):
        out[f"convex a=1-m^{p:g}"] = Candidate("convex per query", adaptive_convex(p))
    for depth in LEG_DEPTHS:
        for alpha in ALPHAS:
            out[f"convex a={alpha:g} top {depth}"] = Candidate("convex depth", convex_at(alpha, depth))
    return out


def evaluate(caches: list[dict], names: list[str] | None = None) -> dict[str, Any]:
    cands = candidates()
    if names:
        cands = {k: v for k, v in cands.items() if k in names}
    table: dict[str, dict[str, dict[str, float]]] = {}
    per_query: dict[str, dict[str, dict[str, float]]] = {}
    for c in caches:
        qrels = {q["id"]: q["qrels"] for q in c["queries"]}
        sigs = {q["id"]: signals(q, c["n_docs"]) for q in c["queries"]}
        lists = {q["id"]: Lists(q) for q in c["queries"]}
        for name, fuse in cands.items():
            run = {qid: fuse(lists[qid], sigs[qid]) for qid in lists}  # the top 10: the metrics' depth
            means, pq = score(run, qrels, METRICS)
            table.setdefault(name, {})[c["set"]] = {m: round(v, 4) for m, v in means.items()}
            per_query.setdefault(name, {})[c["set"]] = {q: v["ndcg@10"] for q, v in pq.items()}
    return {"table": table, "per_query": per_query, "sets": [c["set"] for c in caches],
            "family": {name: cand.family for name, cand in cands.items()},
            "queries": {c["set"]: len(c["queries"]) for c in caches}}


# -- leave one set out ---------------------------------------------------------------------------
def better_leg(table: dict, s: str, metric: str = "ndcg@10") -> float:
    return max(table["vector only"][s][metric], table["fts only"][s][metric])


def objective(table: dict, name: str, sets: list[str]) -> tuple[float, float]:
    """What a choice maximises over ``sets``: the mean nDCG@10, then (ties) the worst gap to the better leg."""
    ndcg = [table[name][s]["ndcg@10"] for s in sets]
    return round(float(np.mean(ndcg)), 4), round(min(v - better_leg(table, s) for v, s in zip(ndcg, sets)), 4)


def choose(table: dict, pool: list[str], sets: list[str]) -> str:
    """The candidate of ``pool`` with the best ``objective`` on ``sets`` (the first listed on a tie)."""
    return max(pool, key=lambda name: objective(table, name, sets))


def leave_one_out(result: dict[str, Any], families: tuple[str, ...] | None = None) -> dict[str, Any]:
    """For each set: the candidate (of ``families``; every hybrid one without) chosen on the other
    sets, and its figures on the set left out; then the choice on every set."""
    table, sets = result["table"], result["sets"]
    pool = [n for n, f in result["family"].items() if f != "leg" and (families is None or f in families)]
    folds = []
    for s in sets:
        others = [x for x in sets if x != s]
        pick = choose(table, pool, others)
        folds.append({"left_out": s, "chosen": pick, "others_mean": objective(table, pick, others)[0],
                      **{m: table[pick][s][m] for m in METRICS},
                      "vs_better_leg": round(table[pick][s]["ndcg@10"] - better_leg(table, s), 4)})
    final = choose(table, pool, sets)
    mean_out = float(np.mean([f["ndcg@10"] for f in folds]))
    return {"families": list(families or FAMILIES), "folds": folds, "final": final,
            "final_mean": objective(table, final, sets)[0], "left_out_mean": round(mean_out, 4),
            "better_leg_mean": round(float(np.mean([better_leg(table, s) for s in sets])), 4)}


# pools compared leave-one-set-out: each rule or family earns its place only if adding it to a pool
# raises the mean left-out nDCG@10
POOLS: dict[str, tuple[str, ...]] = {
    "rrf (weights, k)": ("rrf",),
    "rrf + ties/floor": ("rrf", "rrf+rules"),
    "rrf + lexical_match (+ ties/floor)": ("rrf", "lexical_match"),
    "convex min-max (alpha)": ("convex",),
    "convex z-score (alpha)": ("convex_z",),
    "convex min-max + per-query alpha": ("convex", "convex per query"),
    "convex min-max or z-score": ("convex", "convex_z"),
    "convex TMM (alpha)": ("convex_tmm",),
    "convex min-max or TMM": ("convex", "convex_tmm"),
    "convex min-max, alpha and depth": ("convex", "convex depth"),
    "rrf or convex min-max": ("rrf", "convex"),
    "everything": tuple(f for f in FAMILIES if f != "leg"),
}


def loso(result: dict[str, Any]) -> dict[str, Any]:
    return {pool: leave_one_out(result, families) for pool, families in POOLS.items()}


def loso_markdown(result: dict[str, Any], runs: dict[str, Any]) -> str:
    t, sets = result["table"], result["sets"]
    main = runs["everything"]
    lines = ["Leave one set out over every candidate (objective: the mean nDCG@10 over the other sets; ties: "
             "the worst gap to the better leg):", "",
             "| left out | chosen on the others | their mean | nDCG@10 / R@10 left out | keyword | semantic "
             "| - better leg | " + main["final"] + " (final) | " + OLD_DEFAULT + " |",
             "|---|---|---|---|---|---|---|---|---|"]

    def cell(n: str, s: str) -> str:
        return f"{t[n][s]['ndcg@10']:.3f} / {t[n][s]['recall@10']:.3f}" if n in t else "-"

    for f in main["folds"]:
        s = f["left_out"]
        lines.append(f"| {s} | {f['chosen']} | {f['others_mean']:.4f} | {f['ndcg@10']:.3f} / {f['recall@10']:.3f} | "
                     f"{cell('fts only', s)} | {cell('vector only', s)} | {f['vs_better_leg']:+.3f} | "
                     f"{cell(main['final'], s)} | {cell(OLD_DEFAULT, s)} |")
    lines += ["", f"Chosen on all {len(sets)} sets: **{main['final']}** (mean nDCG@10 {main['final_mean']:.4f}; "
              f"the better leg's mean {main['better_leg_mean']:.4f}).", "",
              "Each pool chosen leave one set out (mean of the left-out figures; the final choice on every set):", "",
              "| pool | mean nDCG@10 left out | " + " | ".join(sets) + " | chosen on every set | its mean |",
              "|---|---|" + "---|" * len(sets) + "---|---|"]
    for pool, run in runs.items():
        lines.append(f"| {pool} | {run['left_out_mean']:.4f} | " + " | ".join(f"{f['ndcg@10']:.3f}" for f in run["folds"])
                     + f" | {run['final']} | {run['final_mean']:.4f} |")
    return "\n".join(lines) + "\n"


def markdown(result: dict[str, Any]) -> str:
    """One row per candidate: nDCG@10 / R@10 per set, its mean nDCG@10, and whether it is within 0.01
    of the better leg (nDCG@10) on every set."""
    sets = result["sets"]
    t = result["table"]
    head = ("| candidate | " + " | ".join(f"{s} nDCG@10 / R@10" for s in sets)
            + " | mean nDCG@10 | >= better leg - 0.01 on every set |")
    lines = [head, "|" + "---|" * (len(sets) + 3)]
    for name, row in t.items():
        cells = [f"{row[s]['ndcg@10']:.3f} / {row[s]['recall@10']:.3f}" for s in sets]
        legs = result["family"][name] == "leg"
        near = all(row[s]["ndcg@10"] >= better_leg(t, s) - 0.01 for s in sets)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {np.mean([row[s]['ndcg@10'] for s in sets]):.4f} | "
                     + ("-" if legs else ("yes" if near else "no")) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    c = sub.add_parser("cache", help="run both legs once per query, deep, and write the lists")
    g = c.add_mutually_exclusive_group(required=True)
    g.add_argument("--demo", action="store_true")
    g.add_argument("--locomo", type=Path)
    g.add_argument("--probe", help="a set of pipeline.datasets.probes")
    g.add_argument("--beir", type=Path, help="a BEIR folder (e.g. ops/bench/data/docs_qa)")
    c.add_argument("--seed", type=int, default=16)
    c.add_argument("--data-dir", type=Path, required=True, help="where the sets' stores live (built when absent)")
    c.add_argument("--depth", type=int, default=100)
    c.add_argument("--limit", type=int, default=0, help="first N queries only (smoke runs)")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--reuse-vector", type=Path, help="a cache of the same set: its vector lists are taken as they are "
                   "and the full-text leg alone runs (BM25 variants: DIMPLE_FULLTEXT__K1, DIMPLE_FULLTEXT__B)")
    e = sub.add_parser("evaluate", help="every candidate on every cache, then each chosen leaving one set out")
    e.add_argument("caches", nargs="+", type=Path)
    e.add_argument("--out", type=Path, help="JSON: every candidate's figures and the leave-one-set-out runs")
    e.add_argument("--md", type=Path, help="markdown: every candidate on every set")
    e.add_argument("--loso-md", type=Path, help="markdown: the leave-one-set-out choices (3 sets or more)")
    args = p.parse_args(argv)
    if args.action == "cache":
        out = cache(args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out), encoding="utf-8")
        print(f"{args.out}: {out['set']}, {len(out['queries'])} queries, {out['n_docs']} memories, {out['seconds']} s",
              file=sys.stderr)
        return 0
    result = evaluate([json.loads(path.read_text(encoding="utf-8")) for path in args.caches])
    md = markdown(result)
    print(md)
    if len(result["sets"]) >= 3:
        result["loso"] = loso(result)
        loso_md = loso_markdown(result, result["loso"])
        print(loso_md)
        if args.loso_md:
            args.loso_md.write_text(loso_md, encoding="utf-8")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    if args.md:
        args.md.write_text(md, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
