"""The full-text leg at scale: postings-bounded BM25 (``pipeline.stages.fulltext``)
against the FTS extension's ``match_bm25`` (what it replaced) and against
``bm25s`` (what a user would pick instead), on one store, in one run.

    python -m ops.bench.fulltext --store /tmp/dimple-synth-1m --queries 200 --ref-queries 30 --out /tmp/bench-fts-1m.json

Queries: 1-6 terms, frequent and rare words, stopwords, repeats, unknown words
and identifiers (``ops.bench.synth.queries``). "Identical top-10" compares our
top 10 with ``match_bm25``'s (same scores to 1e-9, same ids in the same order;
see ``same_ranking``) on the first ``--ref-queries`` queries: the reference
scans every memory per query, so it gets fewer. bm25s (sparse matrix, numpy
backend, its own tokenizer, no stemmer, English stopwords) indexes the same
texts; its rankings differ by tokenizer and IDF, so only its speed and its
top-10 overlap with ours are reported.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def pct(xs, q) -> float:
    return round(float(np.percentile(np.asarray(xs) * 1000, q)), 3)


def run(store_dir: Path, n_queries: int, n_ref: int, bm25s_on: bool = True, log=print) -> dict:
    from ops.bench import synth
    from ops.bench.bm25_reference import match_bm25, same_ranking
    from pipeline.contracts import Scope
    from pipeline.settings import Settings
    from pipeline.stages import fulltext
    from pipeline.store.database import Store

    fts = Settings(_env_file=None).fulltext
    store = Store.open(store_dir / "store.duckdb", read_only=True)
    con = store.con
    n = con.execute("SELECT count(*) FROM memories").fetchone()[0]
    postings = con.execute("SELECT sum(df) FROM fts_postings").fetchone()[0]
    queries = synth.queries(n_queries)
    k = 10
    log(f"{store_dir}: {n} memories, {postings} postings")

    ours, lat, read = [], [], []
    fulltext.search(con, queries[0], Scope(), k, fts)  # first-query costs (plan cache, buffers) out of the timing
    for q in queries:
        t = time.perf_counter()
        ours.append(fulltext.search(con, q, Scope(), k, fts))
        lat.append(time.perf_counter() - t)
    # postings the query's terms own (what the leg's cost should follow)
    for q in queries:
        read.append(con.execute(
            "SELECT coalesce(sum(df), 0) FROM fts_main_memories.dict WHERE term IN "
            "(SELECT stem(unnest(fts_main_memories.tokenize(?)), ?))", [q, fts.stemmer]).fetchone()[0])
    out = {"n": n, "postings": postings, "queries": n_queries,
           "ours": {"p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95), "postings_read_mean": round(float(np.mean(read)), 1),
                    "postings_read_p95": float(np.percentile(read, 95))}}
    log(f"  postings BM25: p50 {out['ours']['p50_ms']} ms, p95 {out['ours']['p95_ms']} ms, "
        f"postings of the query terms: mean {out['ours']['postings_read_mean']:.0f}")

    ref_lat, same = [], 0
    whys = []
    for q, got in zip(queries[:n_ref], ours):
        t = time.perf_counter()
        ref = match_bm25(con, q, Scope(), k + 20, fts)
        ref_lat.append(time.perf_counter() - t)
        ok, why = same_ranking(ref, got, k)
        same += ok
        if not ok:
            whys.append((q, why))
    out["match_bm25"] = {"p50_ms": pct(ref_lat, 50), "p95_ms": pct(ref_lat, 95), "queries": n_ref,
                         "identical_top10": same, "identical_rate": round(same / max(n_ref, 1), 4),
                         "mismatches": whys[:5]}
    out["speedup_vs_match_bm25_p50"] = round(out["match_bm25"]["p50_ms"] / out["ours"]["p50_ms"], 1)
    log(f"  match_bm25 (reference): p50 {out['match_bm25']['p50_ms']} ms, p95 {out['match_bm25']['p95_ms']} ms; "
        f"identical top-10 {same}/{n_ref}; ours {out['speedup_vs_match_bm25_p50']}x faster")

    if bm25s_on:
        import bm25s

        texts = [r[0] for r in con.execute("SELECT fts_text FROM memories ORDER BY id").fetchall()]
        ids = [r[0] for r in con.execute("SELECT id FROM memories ORDER BY id").fetchall()]
        t = time.perf_counter()
        retriever = bm25s.BM25(k1=fts.k1, b=fts.b)
        retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
        build_s = time.perf_counter() - t
        del texts
        b_lat, overlap = [], []
        for q, got in zip(queries, ours):
            t = time.perf_counter()
            tokens = bm25s.tokenize([q], stopwords="en", show_progress=False)
            if tokens.vocab:
                docs, _ = retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
                found = {ids[i] for i in docs[0]}
            else:
                found = set()
            b_lat.append(time.perf_counter() - t)
            if got:
                overlap.append(len(found & {m for m, _ in got}) / len(got))
        out["bm25s"] = {"p50_ms": pct(b_lat, 50), "p95_ms": pct(b_lat, 95), "build_s": round(build_s, 1),
                        "top10_overlap_with_ours": round(float(np.mean(overlap)), 3) if overlap else None}
        out["ratio_to_bm25s_p50"] = round(out["ours"]["p50_ms"] / out["bm25s"]["p50_ms"], 2)
        log(f"  bm25s: p50 {out['bm25s']['p50_ms']} ms, p95 {out['bm25s']['p95_ms']} ms (index built in {build_s:.0f}s); "
            f"ours / bm25s p50 = {out['ratio_to_bm25s_p50']}; top-10 overlap {out['bm25s']['top10_overlap_with_ours']}")
    store.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="folder with store.duckdb")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--ref-queries", type=int, default=50, help="queries also run through match_bm25")
    parser.add_argument("--no-bm25s", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = run(args.store, args.queries, args.ref_queries, not args.no_bm25s)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
