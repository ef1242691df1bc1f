"""Fusion defaults (issue 16): each leg run once per judged set, deep, then
every fusion candidate evaluated offline on the cached lists.

    # 1. cache: both legs once per query, top --depth with scores and query-time signals
    python -m ops.bench.fusion cache --demo --data-dir /tmp/fusion/data --out /tmp/fusion/cache/demo.json
    python -m ops.bench.fusion cache --locomo ../shared/data/locomo/locomo10.json --data-dir /tmp/fusion/data \\
        --out /tmp/fusion/cache/locomo.json
    python -m ops.bench.fusion cache --probe entities --data-dir /tmp/fusion/data --out /tmp/fusion/cache/entities.json
    # 2. evaluate every candidate on every cache (numpy, no model, no store)
    python -m ops.bench.fusion evaluate /tmp/fusion/cache/*.json --out /tmp/fusion/fusion.json --md /tmp/fusion/fusion.md
    # ... --grid adds every full-text weight scale x m^power of GRID (docs/bench/results/fusion16.md)

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
from pipeline.settings import Settings
from pipeline.stages.fuse import LegWeighting, counted_ranks, lexical_match, rrf
from pipeline.stages.fuse import convex as fuse_convex
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
    out: dict[str, Any] = {"set": args.probe or qset.name, "depth": args.depth, "queries": []}
    specs = qset.queries[: args.limit] if args.limit else qset.queries
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
            for name, stages in (("vector", VECTOR_LEG), ("fts", FULLTEXT_LEG)):
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
                    **{name: [[h.id, h.score] for h in legs[name].states[i].legs[name].hits] for name in LEG_NAMES},
                })
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


# -- signals (query time, from the legs' lists) -------------------------------------------------
def signals(q: dict, n_docs: int) -> dict[str, float]:
    """What a fusion could know at query time: the lexical leg's coverage of
    the query (IDF-weighted share of its terms that occur in the store), its
    score gap, the vector leg's margin, and the legs' agreement in their top 10."""
    idf = [term_idf(df, n_docs) for _, df in q["terms"]]
    idf_all = sum(idf)
    idf_hit = sum(i for i, (_, df) in zip(idf, q["terms"]) if df)
    vec = [s for _, s in q["vector"]]
    fts = [s for _, s in q["fts"]]
    top_v = {d for d, _ in q["vector"][:10]}
    top_f = {d for d, _ in q["fts"][:10]}
    return {
        "coverage": idf_hit / idf_all if idf_all else 0.0,
        # the top hit's BM25 over what a one-occurrence, average-length match of every term scores
        "fts_top_norm": lexical_match(fts[0], idf_all) if fts else 0.0,  # the default's m
        "fts_top_matched": min(1.0, fts[0] / idf_hit) if fts and idf_hit else 0.0,
        "fts_gap": (fts[0] - fts[min(9, len(fts) - 1)]) / fts[0] if fts and fts[0] > 0 else 0.0,
        "vec_margin": (vec[0] - vec[min(9, len(vec) - 1)]) if vec else 0.0,
        # the vector leg's top cosine in standard deviations above its list's mean (no model's units)
        "vec_z": float((vec[0] - np.mean(vec)) / np.std(vec)) if len(vec) > 2 and np.std(vec) > 0 else 0.0,
        "agreement": len(top_v & top_f) / 10.0,
        "fts_hits": float(len(fts)),
    }


# -- candidates -------------------------------------------------------------------------------
def _ids(q: dict, leg: str) -> list[str]:
    return [d for d, _ in q[leg]]


def rrf_fixed(wv: float, wf: float, ties: float = 0.0, floor: float = 0.0) -> Callable[[dict, dict], list[str]]:
    return rrf_per_query(lambda s: (wv, wf), ties, floor)


def rrf_per_query(weights: Callable[[dict], tuple[float, float]], ties: float = 0.0,
                  floor: float = 0.0) -> Callable[[dict, dict], list[str]]:
    """RRF with per-query weights; ``ties`` and ``floor``: the full-text tie tolerance and score floor
    (``pipeline.stages.fuse.counted_ranks``; every cached query ran both legs)."""
    def fuse(q: dict, sig: dict) -> list[str]:
        wv, wf = weights(sig)
        floor_here = floor if q["vector"] and q["fts"] else 0.0
        tied = ({"fts": counted_ranks([x for _, x in q["fts"]], ties, floor_here)}
                if ties > 0 or floor_here > 0 else None)
        return [f.id for f in rrf({leg: _ids(q, leg) for leg in LEG_NAMES}, {"vector": wv, "fts": wf}, 60, tied)]
    return fuse


def scaled(c: float, p: float, ties: float = 0.0, floor: float = 0.0) -> Callable[[dict, dict], list[str]]:
    """RRF with the vector leg at 1 and the full-text leg at ``c * m ** p`` (m = ``fts_top_norm``)."""
    def weights(s: dict) -> tuple[float, float]:
        return 1.0, c * s["fts_top_norm"] ** p
    return rrf_per_query(weights, ties, floor)


def adaptive_convex(p: float) -> Callable[[dict, dict], list[str]]:
    """Convex fusion with alpha = 1 - m ** p."""
    def fuse(q: dict, s: dict) -> list[str]:
        return convex(1 - s["fts_top_norm"] ** p)(q, s)
    return fuse


def convex(alpha: float) -> Callable[[dict, dict], list[str]]:
    """``fusion=convex`` (``pipeline.stages.fuse.convex``) at vector share alpha: alpha x minmax(vector) +
    (1 - alpha) x minmax(fts) over the union; a leg that did not return a candidate gives it 0."""
    def fuse(q: dict, sig: dict) -> list[str]:
        lists = {leg: [(d, x) for d, x in q[leg]] for leg in LEG_NAMES}
        return [f.id for f in fuse_convex(lists, {"vector": alpha, "fts": 1 - alpha})]
    return fuse


GRID = ((4, 5, 6, 7, 8, 10, 12, 16), (1.5, 2, 2.5, 3, 4, 5))  # --grid: full-text weight scale x m^power


def candidates(grid: bool = False) -> dict[str, Callable[[dict, dict], list[str]]]:
    out: dict[str, Callable[[dict, dict], list[str]]] = {
        "vector only": lambda q, s: _ids(q, "vector"),
        "fts only": lambda q, s: _ids(q, "fts"),
    }
    for wv, wf in ((0.4, 1.0), (0.6, 1.0), (0.8, 1.0), (1.0, 1.0), (1.0, 0.8), (1.0, 0.6), (1.0, 0.4)):
        out[f"rrf {wv:g}:{wf:g}"] = rrf_fixed(wv, wf)
    # per-query weights, each from one signal (the vector leg's weight 1; the lexical leg's from the signal)
    out["rrf fts=coverage"] = rrf_per_query(lambda s: (1.0, s["coverage"]))
    out["rrf fts=0.4+coverage"] = rrf_per_query(lambda s: (1.0, 0.4 + s["coverage"]))
    out["rrf fts=coverage^2*1.5"] = rrf_per_query(lambda s: (1.0, 1.5 * s["coverage"] ** 2))
    out["rrf fts=0.5+fts_gap"] = rrf_per_query(lambda s: (1.0, 0.5 + s["fts_gap"]))
    out["rrf vec=0.4+4*margin"] = rrf_per_query(lambda s: (min(1.5, 0.4 + 4 * s["vec_margin"]), 1.0))
    out["rrf agree: 1:1 else 0.7:1"] = rrf_per_query(lambda s: (1.0, 1.0) if s["agreement"] >= 0.3 else (0.7, 1.0))
    # the lexical leg's weight from how well its top hit matches the whole query (fts_top_norm)
    out["rrf fts=top_norm"] = rrf_per_query(lambda s: (1.0, s["fts_top_norm"]))
    out["rrf fts=2*top_norm"] = rrf_per_query(lambda s: (1.0, 2 * s["fts_top_norm"]))
    out["rrf fts=2*top_norm^2"] = rrf_per_query(lambda s: (1.0, 2 * s["fts_top_norm"] ** 2))
    out["rrf fts=3*top_norm^2"] = rrf_per_query(lambda s: (1.0, 3 * s["fts_top_norm"] ** 2))
    out["rrf fts=4*top_norm^3"] = rrf_per_query(lambda s: (1.0, 4 * s["fts_top_norm"] ** 3))
    for c, p in ((6, 2), (10, 2), (12, 2), (8, 1.5), (8, 2.5)):
        out[f"rrf fts={c:g}*top_norm^{p:g}"] = scaled(c, p)
    default = LegWeighting()
    out[f"rrf fts={default.scale:g}*top_norm^{default.power:g}"] = scaled(default.scale, default.power)
    # the full-text leg's near-equal scores sharing their group's average rank (fts_tie_tolerance)
    ties = Settings.model_fields["fts_tie_tolerance"].default
    for t in sorted({0.05, 0.1, 0.15, 0.2, ties}):
        name = f"rrf fts={default.scale:g}*top_norm^{default.power:g}, ties {t:g}"
        out[name] = scaled(default.scale, default.power, t)
    for c, p in ((12, 2), (12, 1.5)):
        out[f"rrf fts={c:g}*top_norm^{p:g}, ties {ties:g}"] = scaled(c, p, ties)
    # beside the vector leg, full-text hits under a share of the leg's best BM25 count nothing (fts_floor)
    floor = Settings.model_fields["fts_floor"].default
    for f in sorted({0.3, 0.4, 0.45, 0.5, 0.55, 0.6, floor}):
        name = f"rrf fts={default.scale:g}*top_norm^{default.power:g}, ties {ties:g}, floor {f:g}"
        out[name + (" (default)" if f == floor else "")] = scaled(default.scale, default.power, ties, f)
    for c, p in ((12, 2), (12, 1.5), (16, 1.5)):
        out[f"rrf fts={c:g}*top_norm^{p:g}, ties {ties:g}, floor {floor:g}"] = scaled(c, p, ties, floor)
    for wv, wf in ((0.4, 1.0), (1.0, 1.0)):
        out[f"rrf {wv:g}:{wf:g}, ties {ties:g}"] = rrf_fixed(wv, wf, ties)
    # the default, with the vector leg's weight from its own confidence: (vec_z / zr) ** p, within [0.25, 4]
    for zr, p in ((3, 1), (3, 2), (3.5, 1), (3.5, 2), (4, 1), (4, 2), (4, 3)):
        out[f"rrf vec=(z/{zr:g})^{p:g}, fts={default.scale:g}*top_norm^{default.power:g}, ties {ties:g}, "
            f"floor {floor:g}"] = rrf_per_query(
            lambda s, zr=zr, p=p: (min(4.0, max(0.25, (max(s["vec_z"], 0.0) / zr) ** p)),
                                   default.scale * s["fts_top_norm"] ** default.power), ties, floor)
    # the same, one-sided: a confident vector leg weighs more, an unsure one never less than 1
    for zr, p in ((4, 1), (4, 2), (4.5, 1), (4.5, 2), (4.5, 3), (5, 2), (5, 3)):
        out[f"rrf vec=max(1,(z/{zr:g})^{p:g}), fts={default.scale:g}*top_norm^{default.power:g}, ties {ties:g}, "
            f"floor {floor:g}"] = rrf_per_query(
            lambda s, zr=zr, p=p: (min(4.0, max(1.0, (max(s["vec_z"], 0.0) / zr) ** p)),
                                   default.scale * s["fts_top_norm"] ** default.power), ties, floor)
    out["rrf fts=2*top_matched^2"] = rrf_per_query(lambda s: (1.0, 2 * s["fts_top_matched"] ** 2))
    out["convex a=1-top_norm"] = adaptive_convex(1.0)
    if grid:
        for c in GRID[0]:
            for p in GRID[1]:
                out.setdefault(f"rrf fts={c:g}*top_norm^{p:g}", scaled(c, p))
    for p in (1.5, 2):
        out[f"convex a=1-top_norm^{p:g}"] = adaptive_convex(p)
    for alpha in (0.3, 0.35, 0.4, 0.5, 0.7):  # 0.4: DIMPLE_CONVEX_ALPHA's default
        out[f"convex a={alpha:g}"] = convex(alpha)
    return out


def evaluate(caches: list[dict], names: list[str] | None = None, grid: bool = False) -> dict[str, Any]:
    cands = candidates(grid)
    if names:
        cands = {k: v for k, v in cands.items() if k in names}
    table: dict[str, dict[str, dict[str, float]]] = {}
    per_query: dict[str, dict[str, dict[str, float]]] = {}
    for c in caches:
        qrels = {q["id"]: q["qrels"] for q in c["queries"]}
        sigs = {q["id"]: signals(q, c["n_docs"]) for q in c["queries"]}
        for name, fuse in cands.items():
            run = {q["id"]: fuse(q, sigs[q["id"]])[:100] for q in c["queries"]}
            means, pq = score(run, qrels, METRICS)
            table.setdefault(name, {})[c["set"]] = {m: round(v, 4) for m, v in means.items()}
            per_query.setdefault(name, {})[c["set"]] = {q: v["ndcg@10"] for q, v in pq.items()}
    return {"table": table, "per_query": per_query, "sets": [c["set"] for c in caches],
            "queries": {c["set"]: len(c["queries"]) for c in caches}}


TODAY = "rrf 0.4:1"  # the seed's default: fixed weights, vector 0.4, full text 1


def markdown(result: dict[str, Any]) -> str:
    """One row per candidate: nDCG@10 / R@10 per set, whether it is at least the
    better leg on every set (both metrics), and at least today's default on every set."""
    sets = result["sets"]
    t = result["table"]
    head = ("| candidate | " + " | ".join(f"{s} nDCG@10 / R@10" for s in sets)
            + " | >= best leg on every set | >= today's default on every set |")
    lines = [head, "|" + "---|" * (len(sets) + 3)]

    def at_least(row, ref, s):
        return all(row[s][m] >= ref[s][m] for m in METRICS)

    for name, row in t.items():
        cells = [f"{row[s]['ndcg@10']:.3f} / {row[s]['recall@10']:.3f}" for s in sets]
        legs = name in ("vector only", "fts only")
        best = all(at_least(row, t["vector only"], s) and at_least(row, t["fts only"], s) for s in sets)
        today = all(at_least(row, t[TODAY], s) for s in sets) if TODAY in t and name != TODAY else None
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'-' if legs else ('yes' if best else 'no')} | "
                     + ("-" if legs or today is None else ("yes" if today else "no")) + " |")
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
    e = sub.add_parser("evaluate", help="every candidate on every cache")
    e.add_argument("caches", nargs="+", type=Path)
    e.add_argument("--out", type=Path)
    e.add_argument("--md", type=Path)
    e.add_argument("--grid", action="store_true", help=f"also every full-text weight scale x m^power of {GRID}")
    args = p.parse_args(argv)
    if args.action == "cache":
        out = cache(args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out), encoding="utf-8")
        print(f"{args.out}: {out['set']}, {len(out['queries'])} queries, {out['n_docs']} memories, {out['seconds']} s",
              file=sys.stderr)
        return 0
    result = evaluate([json.loads(path.read_text(encoding="utf-8")) for path in args.caches], grid=args.grid)
    md = markdown(result)
    print(md)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    if args.md:
        args.md.write_text(md, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
