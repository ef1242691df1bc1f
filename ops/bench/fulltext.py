"""The full-text leg at scale: postings-bounded BM25 (``pipeline.stages.fulltext``)
against ``bm25s`` in the configuration its documentation recommends (what a
user would pick instead) and against the FTS extension's ``match_bm25`` (what
the leg replaced), on one store, in one process, timed interleaved.

    python -m ops.bench.fulltext --store /tmp/scale/s100000 --queries 200 --rounds 3 --ref-queries 50 --out fts100k.json

(``pip install -e ".[bench]"`` and ``pip install PyStemmer`` first: bm25s,
numba, PyStemmer.) Smoke run on a tiny store (seconds; figures meaningless):

    python -m ops.bench.synth --n 2000 --out /tmp/scale/s2000
    python -m ops.bench.fulltext --store /tmp/scale/s2000 --queries 20 --rounds 1 --ref-queries 5 --warmup 5

Sides:

- **ours**: ``pipeline.store.fulltext.search`` on the store opened read-only,
  scoring from the base's postings held in memory (``pipeline.store.fulltext.postings``,
  as query processes do); its load time and size are printed.
- **ours_sql**: the same search reading the postings by SQL (what topic and
  concept scopes still use), DuckDB with ``--threads`` threads (default:
  DuckDB's own default, one per core).
- **bm25s**, as its README recommends for speed and quality: ``BM25(backend=
  "numba")`` (JIT-compiled retrieval; the default backend is numpy), the
  corpus and each query tokenized by ``bm25s.tokenize(..., stopwords="en",
  stemmer=Stemmer.Stemmer("english"))`` (PyStemmer, a Snowball stemmer;
  ours is the FTS extension's Porter stemmer), ``k1`` and ``b`` set to ours,
  its default ``method="lucene"`` (Lucene's IDF and length norm: the same
  ranking as ours for the same tokens; BM25's log base and the constant
  ``k1 + 1`` do not change an order), ``retrieve(tokens, k=10, n_threads=T)``
  with ``T`` the same thread count as ours. bm25s's threads split a batch's
  queries among them; for a single query its serial path (``n_threads=1``)
  is the faster, so it is timed too as **bm25s_serial**, and the baseline
  figure is the faster of the two.
- **match_bm25** (reference, the first ``--ref-queries`` queries of the first
  round only: it scans every memory per query): also checks that our top 10
  is its top 10 (same scores to 1e-9, same ids in the same order; see
  ``same_ranking``).

Timing: ``--warmup`` queries on every side first (untimed: plan caches,
buffers, numba's compilation), then ``--rounds`` passes over the queries; for
each query the sides run one after the other in an order that rotates query
by query, so load and drift hit every side alike. Each side's time includes
tokenizing the query. The load average is printed before and after.
Queries: 1-6 terms, frequent and rare words, stopwords, repeats, unknown
words and identifiers (``ops.bench.synth.queries``). bm25s ranks with its
own tokenizer and stemmer, so only its speed and its top-10 overlap with ours
are compared. Where bm25s is faster, the output says so.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from ops.bench import emit


def pct(xs, q) -> float:
    return round(float(np.percentile(np.asarray(xs) * 1000, q)), 3)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def build_bm25s(texts: list[str], k1: float, b: float):
    """bm25s as its README recommends: numba backend, English stopwords and stemmer.
    Returns (retriever, tokenize one query)."""
    import bm25s

    try:
        import Stemmer
    except ImportError as exc:  # a weaker bm25s than its README's is not the baseline
        raise SystemExit("bm25s as its README recommends needs PyStemmer: pip install PyStemmer "
                         "(or run with --no-bm25s)") from exc

    stemmer = Stemmer.Stemmer("english")
    retriever = bm25s.BM25(k1=k1, b=b, backend="numba")
    retriever.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)

    def tokenize(q: str):
        return bm25s.tokenize([q], stopwords="en", stemmer=stemmer, show_progress=False)

    return retriever, tokenize


def run(store_dir: Path, n_queries: int, n_ref: int, bm25s_on: bool = True, *, rounds: int = 3,
        warmup: int = 20, threads: int | None = None, log=print) -> dict:
    from ops.bench import synth
    from ops.bench.bm25_reference import match_bm25, same_ranking
    from pipeline.contracts import Scope
    from pipeline.store import fulltext
    from pipeline.store.database import Store
    from pipeline.store.fulltext import Postings
    from workers.settings import WorkerSettings

    load_before = loadavg()
    fts = WorkerSettings(_env_file=None).fulltext
    store = Store.open(store_dir / "store.duckdb", read_only=True)
    con = store.con
    if threads is not None:
        con.execute(f"SET threads = {int(threads)}")
    threads = int(con.execute("SELECT current_setting('threads')").fetchone()[0])
    n = con.execute("SELECT count(*) FROM memories").fetchone()[0]
    postings = con.execute("SELECT sum(df) FROM fts_postings").fetchone()[0]
    queries = synth.queries(n_queries)
    k = 10
    log(f"{store_dir}: {n} memories, {postings} postings; load average {load_before}; "
        f"DuckDB threads {threads}, bm25s n_threads {threads} (and 1)")

    t = time.perf_counter()
    held = Postings.load(con)
    load_s = time.perf_counter() - t

    def ours(q):
        return fulltext.search(con, q, Scope(), k, fts, held)

    def ours_sql(q):
        return fulltext.search(con, q, Scope(), k, fts)

    sides = {"ours": ours, "ours_sql": ours_sql}
    out: dict = {"n": n, "postings": postings, "queries": n_queries, "rounds": rounds, "threads": threads,
                 "loadavg_before": load_before,
                 "postings_in_memory": {"load_s": round(load_s, 2), "mib": round(held.nbytes / 2**20, 1),
                                        "bytes_per_memory": round(held.nbytes / max(n, 1), 1)}}
    log(f"  ours: postings in memory loaded in {load_s:.1f} s, {held.nbytes / 2**20:.0f} MiB "
        f"({held.nbytes / max(n, 1):.0f} bytes per memory)")
    if bm25s_on:
        import bm25s

        texts = [r[0] for r in con.execute("SELECT fts_text FROM memories ORDER BY id").fetchall()]
        ids = [r[0] for r in con.execute("SELECT id FROM memories ORDER BY id").fetchall()]
        t = time.perf_counter()
        retriever, tokenize = build_bm25s(texts, fts.k1, fts.b)
        build_s = time.perf_counter() - t
        del texts
        index_mib = sum(v.nbytes for v in retriever.scores.values() if isinstance(v, np.ndarray)) / 2**20

        def bm25s_side(n_threads: int):
            def side(q):
                tokens = tokenize(q)
                if not tokens.vocab:  # nothing but stopwords or punctuation
                    return []
                docs, scores = retriever.retrieve(tokens, k=min(k, n), show_progress=False, n_threads=n_threads)
                return [(ids[i], float(s)) for i, s in zip(docs[0], scores[0]) if s > 0]
            return side

        sides["bm25s"] = bm25s_side(threads)
        if threads > 1:  # the same call otherwise
            sides["bm25s_serial"] = bm25s_side(1)
        out["bm25s_config"] = {"version": bm25s.__version__, "backend": retriever.backend, "method": retriever.method,
                               "k1": fts.k1, "b": fts.b, "stopwords": "en", "stemmer": "PyStemmer english",
                               "n_threads": threads, "build_s": round(build_s, 1), "index_mib": round(index_mib, 1)}
        log(f"  bm25s {bm25s.__version__} backend={retriever.backend} method={retriever.method}: "
            f"index built in {build_s:.1f}s, {index_mib:.0f} MiB of score arrays")

    for i, q in enumerate(queries[:warmup]):  # out of the timing: plan caches, buffers, numba's compilation
        for side in sides.values():
            side(q)
        if i < 2 and n_ref:  # a full scan per query (seconds at 1M): two are warm-up enough
            match_bm25(con, q, Scope(), k + 20, fts)

    lat: dict[str, list[float]] = {name: [] for name in [*sides, "match_bm25"]}
    first: dict[str, list] = {name: [] for name in [*sides, "match_bm25"]}
    for r in range(rounds):
        for i, q in enumerate(queries):
            names = list(sides) + (["match_bm25"] if r == 0 and i < n_ref else [])
            turn = (i + r) % len(names)
            for name in names[turn:] + names[:turn]:
                fn = sides.get(name)
                t = time.perf_counter()
                got = fn(q) if fn is not None else match_bm25(con, q, Scope(), k + 20, fts)
                lat[name].append(time.perf_counter() - t)
                if r == 0:
                    first[name].append(got)

    read = [con.execute(  # postings the query's terms own (what the leg's cost should follow)
        "SELECT coalesce(sum(df), 0) FROM fts_main_memories.dict WHERE term IN "
        "(SELECT stem(unnest(fts_main_memories.tokenize(?)), ?))", [q, fts.stemmer]).fetchone()[0] for q in queries]
    out["ours"] = {"p50_ms": pct(lat["ours"], 50), "p95_ms": pct(lat["ours"], 95),
                   "postings_read_mean": round(float(np.mean(read)), 1),
                   "postings_read_p95": float(np.percentile(read, 95)),
                   "answered": sum(bool(g) for g in first["ours"])}
    out["ours_sql"] = {"p50_ms": pct(lat["ours_sql"], 50), "p95_ms": pct(lat["ours_sql"], 95),
                       "same_as_ours": sum(same_ranking(a, b, k)[0] for a, b in zip(first["ours_sql"], first["ours"]))}
    log(f"  ours (postings in memory, numpy; the query path): p50 {out['ours']['p50_ms']} ms, "
        f"p95 {out['ours']['p95_ms']} ms; postings of the query terms: mean {out['ours']['postings_read_mean']:.0f}")
    log(f"  ours_sql (postings read by SQL, {threads} DuckDB threads; topic and concept scopes): p50 "
        f"{out['ours_sql']['p50_ms']} ms, p95 {out['ours_sql']['p95_ms']} ms; same top-10 and scores (1e-9) as ours for "
        f"{out['ours_sql']['same_as_ours']}/{len(queries)} queries")

    same, whys = 0, []
    for q, ref, got in zip(queries, first["match_bm25"], first["ours"]):
        ok, why = same_ranking(ref, got, k)
        same += ok
        if not ok:
            whys.append((q, why))
    n_ref = len(first["match_bm25"])
    if n_ref:
        out["match_bm25"] = {"p50_ms": pct(lat["match_bm25"], 50), "p95_ms": pct(lat["match_bm25"], 95),
                             "queries": n_ref, "identical_top10": same, "identical_rate": round(same / n_ref, 4),
                             "mismatches": whys[:5]}
        out["speedup_vs_match_bm25_p50"] = round(out["match_bm25"]["p50_ms"] / out["ours"]["p50_ms"], 1)
        log(f"  match_bm25 (reference): p50 {out['match_bm25']['p50_ms']} ms, p95 {out['match_bm25']['p95_ms']} ms; "
            f"identical top-10 {same}/{n_ref}; ours {out['speedup_vs_match_bm25_p50']}x faster")

    if bm25s_on:
        timed = [name for name in ("bm25s", "bm25s_serial") if name in sides]
        for name in timed:
            overlap = [len({m for m, _ in b} & {m for m, _ in o}) / len(o)
                       for b, o in zip(first[name], first["ours"]) if o]
            out[name] = {"p50_ms": pct(lat[name], 50), "p95_ms": pct(lat[name], 95),
                         "n_threads": threads if name == "bm25s" else 1,
                         "top10_overlap_with_ours": round(float(np.mean(overlap)), 3) if overlap else None}
            log(f"  {name} (numba, n_threads {out[name]['n_threads']}): p50 {out[name]['p50_ms']} ms, "
                f"p95 {out[name]['p95_ms']} ms; top-10 overlap with ours {out[name]['top10_overlap_with_ours']}")
        best = min(timed, key=lambda s: out[s]["p50_ms"])
        ratio = out["ours"]["p50_ms"] / out[best]["p50_ms"]
        out["baseline"] = best
        out["ratio_to_bm25s_p50"] = round(ratio, 2)
        out["verdict"] = (f"bm25s (numba) is {ratio:.1f}x FASTER than ours at p50 "
                          f"({out[best]['p50_ms']} ms against {out['ours']['p50_ms']} ms)" if ratio > 1 else
                          f"ours is {1 / ratio:.1f}x faster than bm25s (numba) at p50 "
                          f"({out['ours']['p50_ms']} ms against {out[best]['p50_ms']} ms)")
        log(f"  {out['verdict']}")
    out["loadavg_after"] = loadavg()
    log(f"  load average after: {out['loadavg_after']}")
    store.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="folder with store.duckdb")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="timed passes over the queries")
    parser.add_argument("--warmup", type=int, default=20, help="untimed queries on every side first")
    parser.add_argument("--ref-queries", type=int, default=50, help="queries also run through match_bm25 (first round)")
    parser.add_argument("--threads", type=int, help="DuckDB threads, and bm25s's n_threads (default: DuckDB's default)")
    parser.add_argument("--no-bm25s", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = run(args.store, args.queries, args.ref_queries, not args.no_bm25s, rounds=args.rounds,
                 warmup=args.warmup, threads=args.threads)
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
