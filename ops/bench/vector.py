"""The vector leg at scale: beam descent against exact numpy search and FAISS
IVF-Flat at the same number of vectors scored, on one store, in one run.

    python -m ops.bench.vector --store /tmp/dimple-synth-1m --queries 200 --out /tmp/bench-vector-1m.json

``--store`` is a folder holding ``store.duckdb`` (``python -m ops.bench.synth``
writes one; ``--locomo FILE`` builds one from LoCoMo turns embedded by the real
model, and its questions as the queries, unscoped). Synthetic queries are
stored memories plus noise (paraphrase-like). All sides
score the same queries, single-threaded BLAS and FAISS so latencies compare
work, not thread counts. Recall@10 is against exact search over the whole
store. "Vectors scored" counts memories (leaf or list members) compared with
the query; centroids compared are reported beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402


def pct(xs, q) -> float:
    return round(float(np.percentile(np.asarray(xs) * 1000, q)), 3)


def exact_top(emb: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """The numpy baseline a user would write: one matmul over every vector, argpartition, sort."""
    sims = emb @ q
    part = np.argpartition(-sims, k - 1)[:k]
    return part[np.argsort(-sims[part], kind="stable")]


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run(store_dir: Path, n_queries: int, beams: list[int], noise: float, log=print) -> dict:
    import faiss

    from ops.bench import synth
    from pipeline.contracts import Scope
    from pipeline.settings import Settings
    from pipeline.stages.descend import VectorIndex, descend
    from pipeline.store.database import Store

    faiss.omp_set_num_threads(1)
    tree = Settings(_env_file=None).tree
    store = Store.open(store_dir / "store.duckdb", read_only=True)
    rss0 = rss_mb()
    t = time.perf_counter()
    index = VectorIndex.load(store.con, store.generation, store.info.embedding_dim)
    load_s = time.perf_counter() - t
    store.close()
    n = index.size
    log(f"{store_dir}: {n} vectors, index loaded in {load_s:.1f}s, {index.nbytes() / 2**20:.0f} MiB of arrays, "
        f"RSS +{rss_mb() - rss0:.0f} MiB")
    real = store_dir / "queries.npy"
    if real.exists():  # real questions embedded by the model (--locomo)
        queries = np.load(real)[:n_queries]
        log(f"  {len(queries)} real queries from {real}")
    else:
        queries = synth.query_vectors(index.emb, n_queries, noise=noise)
    k = 10

    exact_ids, exact_lat = [], []
    for q in queries:
        t = time.perf_counter()
        top = exact_top(index.emb, q, k)
        exact_lat.append(time.perf_counter() - t)
        exact_ids.append(set(top.tolist()))
    out = {"n": n, "queries": len(queries), "real_queries": real.exists(), "load_s": round(load_s, 2), "index_mib": round(index.nbytes() / 2**20, 1),
           "exact": {"p50_ms": pct(exact_lat, 50), "p95_ms": pct(exact_lat, 95), "scored": n}, "descent": {}, "faiss": {}}
    log(f"  exact numpy: p50 {out['exact']['p50_ms']} ms, p95 {out['exact']['p95_ms']} ms, {n} scored")

    start = index.start_topics(Scope())  # unscoped: every namespace
    for beam in beams:
        lat, scored, topics, recall = [], [], [], []
        for q, want in zip(queries, exact_ids):
            t = time.perf_counter()
            hits, prof = descend(index, q, start, beam_width=beam, max_depth=tree.max_depth, top_k=k)
            lat.append(time.perf_counter() - t)
            scored.append(prof["memories_scored"])
            topics.append(prof["topics_scored"])
            got = {index.row_of[h] for h, _ in hits}
            recall.append(len(got & want) / k)
        r = {"p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95), "scored_mean": round(float(np.mean(scored)), 1),
             "scored_max": int(np.max(scored)), "centroids_mean": round(float(np.mean(topics)), 1),
             "recall10": round(float(np.mean(recall)), 4),
             "speedup_p50": round(out["exact"]["p50_ms"] / max(pct(lat, 50), 1e-9), 1)}
        out["descent"][beam] = r
        log(f"  descent beam {beam} x {tree.max_leaf_items}: p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms, "
            f"scored {r['scored_mean']} (max {r['scored_max']}) + {r['centroids_mean']} centroids, "
            f"Recall@10 {r['recall10']}, {r['speedup_p50']}x faster than exact")

    # FAISS IVF-Flat, inner product on unit vectors (= cosine); lists about
    # the size of our leaves where training time allows, trained on a sample
    nlist = max(8, min(n // 64, 4 * int(np.sqrt(n))))
    quant = faiss.IndexFlatIP(index.emb.shape[1])
    ivf = faiss.IndexIVFFlat(quant, index.emb.shape[1], nlist, faiss.METRIC_INNER_PRODUCT)
    rng = np.random.default_rng(0)
    sample = index.emb[rng.choice(n, size=min(n, 40 * nlist), replace=False)]
    faiss.omp_set_num_threads(os.cpu_count() or 1)  # training is not what is compared
    t = time.perf_counter()
    ivf.train(sample)
    ivf.add(index.emb)
    train_s = time.perf_counter() - t
    faiss.omp_set_num_threads(1)
    list_size = n / nlist
    out["faiss"]["nlist"] = nlist
    out["faiss"]["build_s"] = round(train_s, 1)
    log(f"  faiss IVF-Flat: nlist {nlist} (~{list_size:.0f} per list), trained and filled in {train_s:.1f}s")
    # nprobe from 1 up until FAISS scores more than the widest beam did, so each
    # beam's count of memories scored lies between two measured nprobes
    most = max(out["descent"][b]["scored_mean"] for b in beams)
    probes = [p for p in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256) if p <= nlist]
    curve = []
    for nprobe in probes:
        ivf.nprobe = nprobe
        lat, recall, scored = [], [], []
        for q, want in zip(queries, exact_ids):
            t = time.perf_counter()
            _, found = ivf.search(q[None, :], k)
            lat.append(time.perf_counter() - t)
            recall.append(len(set(found[0].tolist()) & want) / k)
        # vectors scored: the members of the probed lists (counted exactly)
        _, lists = quant.search(queries, nprobe)
        invlists = ivf.invlists
        scored = [sum(invlists.list_size(int(l)) for l in row) for row in lists]
        r = {"p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95), "scored_mean": round(float(np.mean(scored)), 1),
             "centroids": nlist, "recall10": round(float(np.mean(recall)), 4)}
        out["faiss"][nprobe] = r
        curve.append((r["scored_mean"], r["recall10"]))
        log(f"  faiss nprobe {nprobe}: p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms, scored {r['scored_mean']} "
            f"+ {nlist} centroids, Recall@10 {r['recall10']}")
        if r["scored_mean"] > most:
            break
    # FAISS's Recall@10 at each beam's count of memories scored, read off its
    # measured curve (linear between the two nprobes around that count)
    xs, ys = zip(*curve)
    for beam in beams:
        d = out["descent"][beam]
        d["faiss_recall10_at_equal_scored"] = round(float(np.interp(d["scored_mean"], xs, ys)), 4)
        d["recall10_minus_faiss"] = round(d["recall10"] - d["faiss_recall10_at_equal_scored"], 4)
        # below one list's worth FAISS has no point at that count: its nprobe 1 is shown
        d["faiss_scored_more"] = d["scored_mean"] < xs[0]
        note = f" (FAISS's least is nprobe 1, {xs[0]} scored)" if d["faiss_scored_more"] else ""
        log(f"  beam {beam}: {d['scored_mean']} scored, Recall@10 {d['recall10']} against FAISS "
            f"{d['faiss_recall10_at_equal_scored']} at the same count ({d['recall10_minus_faiss']:+.4f}){note}")
    out["rss_mib"] = round(rss_mb(), 0)
    return out


def build_locomo_store(path: Path, data: Path, log=print) -> None:
    """A store of every LoCoMo turn, embedded by the configured (real) model."""
    from ops.bench import synth
    from pipeline.datasets.locomo import load_locomo
    from pipeline.embedders import make_embedder
    from pipeline.settings import Settings

    if (path / "store.duckdb").exists():
        return
    path.mkdir(parents=True, exist_ok=True)
    records = load_locomo(data).records
    settings = Settings(data_dir=path, _env_file=None)
    embedder = make_embedder(settings)
    texts = [r["content"] for r in records]
    t = time.perf_counter()
    emb = embedder.embed(texts)
    questions = embedder.embed([q["text"] for q in load_locomo(data).queries])
    np.save(path / "queries.npy", np.asarray(questions, dtype=np.float32))
    log(f"embedded {len(texts)} LoCoMo turns and {len(questions)} questions in {time.perf_counter() - t:.0f}s")
    synth.build_store(path / "store.duckdb", len(texts), settings, dim=emb.shape[1],
                      emb=np.asarray(emb, dtype=np.float32), docs=texts,
                      namespace_of=[r["namespace"] for r in records], log=log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="folder with store.duckdb")
    parser.add_argument("--locomo", type=Path, help="build --store from this LoCoMo file first (real model)")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--beams", default="8,16,32")
    parser.add_argument("--noise", type=float, default=0.5, help="query = memory + noise x a random unit vector")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.locomo:
        build_locomo_store(args.store, args.locomo)
    result = run(args.store, args.queries, [int(b) for b in args.beams.split(",")], args.noise)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
