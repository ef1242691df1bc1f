"""Latency against store size for each leg, from the JSON of ``ops.bench.vector``
and ``ops.bench.fulltext`` runs.

    python -m ops.bench.plot --vector /tmp/b/vec10k.json /tmp/b/vec100k.json /tmp/b/vec1m.json \\
        --fulltext /tmp/b/fts10k.json /tmp/b/fts100k.json /tmp/b/fts1m.json --out docs/bench
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _load(paths: list[Path]) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in paths), key=lambda r: r["n"])


def _finish(fig, ax, title: str, path: Path) -> None:
    """Log-log axes, grid, legend; write the PNG and say where."""
    ax.set(xscale="log", yscale="log", xlabel="memories", ylabel="p50 ms per query", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(path)


def main(argv: list[str] | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vector", type=Path, nargs="*", default=[])
    parser.add_argument("--fulltext", type=Path, nargs="*", default=[])
    parser.add_argument("--beams", default="8,32", help="descent beam widths to plot")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    if args.vector:
        runs = _load(args.vector)
        ns = [r["n"] for r in runs]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(ns, [r["exact"]["p50_ms"] for r in runs], "o-", label="exact numpy")
        for beam in args.beams.split(","):
            ax.plot(ns, [r["descent"][beam]["p50_ms"] for r in runs], "o-", label=f"tree descent, beam {beam}")
            faiss = []
            for r in runs:  # FAISS's fastest measured point (any nlist) at that beam's Recall@10 or better
                want = r["descent"][beam]["recall10"]
                pts = [c for f in r["faiss"].values() for c in f["curve"].values() if c["recall10"] >= want]
                faiss.append(min(c["p50_ms"] for c in pts) if pts else float("nan"))
            ax.plot(ns, faiss, "s--", label=f"FAISS IVF-Flat, fastest at beam {beam}'s recall")
        _finish(fig, ax, "Vector leg: latency vs store size (1 thread)", args.out / "vector_latency.png")

        fig, axes = plt.subplots(1, len(runs), figsize=(4.5 * len(runs), 4), squeeze=False)
        for ax, r in zip(axes[0], runs):  # the measured curves, no interpolation
            beams = sorted(r["descent"].values(), key=lambda d: d["scored_mean"])
            ax.plot([d["scored_mean"] for d in beams], [d["recall10"] for d in beams], "o-", label="tree descent (beams)")
            for nlist, f in r["faiss"].items():
                pts = sorted(f["curve"].values(), key=lambda c: c["scored_mean"])
                ax.plot([c["scored_mean"] for c in pts], [c["recall10"] for c in pts], "s--", label=f"FAISS nlist {nlist}")
            ax.set(xscale="log", xlabel="vectors scored (mean)", ylabel="Recall@10", title=f"{r['n']:,} vectors")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.out / "vector_recall_curves.png", dpi=110)
        print(args.out / "vector_recall_curves.png")

    if args.fulltext:
        runs = _load(args.fulltext)
        ns = [r["n"] for r in runs]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(ns, [r["ours"]["p50_ms"] for r in runs], "o-", label="postings BM25 (dimple)")
        ax.plot(ns, [r["match_bm25"]["p50_ms"] for r in runs], "o-", label="match_bm25 (FTS extension)")
        if all("baseline" in r for r in runs):
            ax.plot(ns, [r[r["baseline"]]["p50_ms"] for r in runs], "o-", label="bm25s (numba, stemmer)")
        _finish(fig, ax, "Full-text leg: latency vs store size", args.out / "fulltext_latency.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
