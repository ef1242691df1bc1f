"""BM25's k1 and b chosen with the fusion, leaving one real set out (issue 31).

The full-text leg's k1 and b were chosen on LoCoMo alone (issue 16). Here
they are chosen with the convex fusion's vector share, by the fusion
bench's rule (``ops.bench.fusion.leave_one_out``): each real set left out in
turn, the (k1, b, alpha) with the best mean nDCG@10 on the other sets, and
its figure on the set left out. Two pools are compared: alpha alone with
BM25 as the settings have it, and alpha with every (k1, b) given.

    # 1. the default caches (ops.bench.fusion cache, BENCHMARKS.md), then per (k1, b) the
    #    full-text leg alone again, the vector lists taken from the default cache
    DIMPLE_FULLTEXT__K1=0.9 DIMPLE_FULLTEXT__B=0.75 python -m ops.bench.fusion cache \\
        --beir ../shared/data/beir/cisi --data-dir /tmp/fusion/data/cisi \\
        --reuse-vector /tmp/fusion/cache/cisi.json --out /tmp/fusion/bm25/k1_0.9_b_0.75/cisi.json
    # 2. every variant's folder (one cache per set in each; the default caches' folder among them)
    python -m ops.bench.fusion_bm25 /tmp/fusion/cache /tmp/fusion/bm25/* --md /tmp/fusion/bm25.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ops.bench.fusion import ALPHAS, METRICS, better_leg, evaluate, leave_one_out
from pipeline.settings import FulltextSettings

LEGS = ("vector only", "fts only")


def variant(bm25: dict[str, float]) -> str:
    return f"k1 {bm25['k1']:g}, b {bm25['b']:g}"


def load(folders: list[Path]) -> dict[str, list[dict]]:
    """The caches of each folder, by BM25 variant; every variant must hold the same sets."""
    out: dict[str, list[dict]] = {}
    where: dict[str, Path] = {}
    for folder in folders:
        caches = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]
        kinds = {variant(c["bm25"]) for c in caches if "bm25" in c}
        if len(kinds) != 1 or any("bm25" not in c for c in caches):
            raise SystemExit(f"{folder}: every cache must record one BM25 variant (found {sorted(kinds) or 'none'})")
        kind = kinds.pop()
        if kind in where:  # e.g. the default caches beside the grid's folder of the settings' own (k1, b)
            raise SystemExit(f"{where[kind]} and {folder} hold the same BM25 variant ({kind}): give one of them")
        out[kind], where[kind] = caches, folder
    sets = {name: sorted(c["set"] for c in caches) for name, caches in out.items()}
    if len({tuple(s) for s in sets.values()}) != 1:
        raise SystemExit(f"the variants hold different sets: {sets}")
    return out


def joint(variants: dict[str, list[dict]], now: str) -> dict[str, Any]:
    """One table over every (variant, candidate): the legs of the ``now`` variant are the
    references (``better_leg``); its convex candidates are family ``convex``, the others' ``convex+bm25``."""
    names = list(LEGS) + [f"convex a={a:g}" for a in ALPHAS]
    table: dict[str, dict] = {}
    family: dict[str, str] = {}
    sets: list[str] = []
    keyword: dict[str, dict[str, dict[str, float]]] = {}
    for name, caches in variants.items():
        r = evaluate(caches, names)
        sets = r["sets"]
        keyword[name] = r["table"]["fts only"]
        for cand, row in r["table"].items():
            if cand in LEGS:
                if name == now:
                    table[cand], family[cand] = row, "leg"
                continue
            key = f"{name} · {cand}"
            table[key], family[key] = row, "convex" if name == now else "convex+bm25"
    if "fts only" not in table:
        raise SystemExit(f"no cache of the settings' BM25 ({now}) among the folders")
    return {"table": table, "family": family, "sets": sets, "keyword": keyword}


def markdown(result: dict[str, Any], runs: dict[str, dict]) -> str:
    t, sets = result["table"], result["sets"]
    lines = ["The keyword leg (nDCG@10) per BM25 variant:", "",
             "| k1, b | " + " | ".join(sets) + " |", "|---|" + "---|" * len(sets)]
    for name, row in sorted(result["keyword"].items()):
        lines.append(f"| {name} | " + " | ".join(f"{row[s]['ndcg@10']:.3f}" for s in sets) + " |")
    lines += ["", "Each pool chosen leaving one set out: per set, the choice on the other sets and its "
              "nDCG@10 / R@10 there (- the better leg at the settings' BM25); then the choice on every set:", ""]
    for pool, run in runs.items():
        lines += [f"**{pool}**: mean nDCG@10 left out {run['left_out_mean']:.4f}; chosen on every set "
                  f"{run['final']} (mean {run['final_mean']:.4f})", "",
                  "| left out | chosen on the others | nDCG@10 / R@10 | - better leg | the final choice there |",
                  "|---|---|---|---|---|"]
        for f in run["folds"]:
            s = f["left_out"]
            fin = t[run["final"]][s]
            lines.append(f"| {s} | {f['chosen']} | {f['ndcg@10']:.3f} / {f['recall@10']:.3f} | "
                         f"{f['vs_better_leg']:+.3f} | {fin['ndcg@10']:.3f} / {fin['recall@10']:.3f} "
                         f"({fin['ndcg@10'] - better_leg(t, s):+.3f}) |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path, help="one folder of caches per BM25 variant")
    p.add_argument("--md", type=Path)
    p.add_argument("--out", type=Path, help="JSON: the table and both pools' runs")
    args = p.parse_args(argv)
    defaults = FulltextSettings()
    now = variant({"k1": defaults.k1, "b": defaults.b})
    result = joint(load(args.folders), now)
    runs = {f"alpha, BM25 as the settings have it ({now})": leave_one_out(result, ("convex",)),
            "alpha and BM25's (k1, b)": leave_one_out(result, ("convex", "convex+bm25"))}
    md = markdown(result, runs)
    print(md)
    if args.md:
        args.md.write_text(md, encoding="utf-8")
    if args.out:
        args.out.write_text(json.dumps({**result, "runs": runs, "metrics": list(METRICS)}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
