"""The vector leg at scale: beam descent against exact numpy search and FAISS
IVF-Flat trained as our tree is, compared at measured points of both curves
(vectors scored, Recall@10, p50), on one store, in one process, timed
interleaved.

    python -m ops.bench.vector --store /tmp/scale/s100000 --queries 200 --rounds 3 --out vec100k.json

(``pip install -e ".[bench]"`` first: faiss-cpu.) Smoke run on a tiny store
(seconds; figures meaningless):

    python -m ops.bench.synth --n 2000 --out /tmp/scale/s2000
    python -m ops.bench.vector --store /tmp/scale/s2000 --queries 20 --rounds 1 --beams 2,8 --nlists 16,32

``--store`` is a folder holding ``store.duckdb`` (``python -m ops.bench.synth``
writes one; ``--locomo FILE`` builds one from LoCoMo turns embedded by the real
model, and its questions as the queries, unscoped; ``--docstrings N`` one from N
sentences of the installed packages' docstrings, ``ops/bench/docstrings.py``,
with held-out sentences as the queries). Synthetic queries are
stored memories plus noise (paraphrase-like). Recall@10 is against exact search
over the whole store. "Vectors scored" counts memories (leaf or list members)
compared with the query; centroids compared are reported beside it.

Sides:

- **exact**: one matmul over every vector, argpartition, sort (numpy).
- **descent**: ``pipeline.store.vector.descend`` at each ``--beams`` width,
  unscoped (every namespace), the store's own tree.
- **FAISS IVF-Flat** (inner product on unit vectors, i.e. cosine), one index
  per ``--nlists`` value (default: n/64, lists the size of our leaves, and
  4·sqrt(n), 16·sqrt(n) and sqrt(n), the range FAISS's guidelines give, each
  at most n/39, FAISS's minimum of training points per list, and none within
  25% of another: 10k: 100, 156, 256; 100k: 316, 1,562, 2,564; 1M: 1,000,
  4,000, 15,625).
  Each is trained as our tree's k-means is (``pipeline/store/vector/tree.py``): on
  at most ``_SAMPLE_PER_CENTER`` (256) points per centre (FAISS's
  ``max_points_per_centroid``; FAISS samples them itself), for
  ``settings.tree.kmeans_iterations`` (25) iterations (IndexIVF's own default
  is 10), spherical (unit centroids, as ours). ``nprobe`` runs 1, 2, 3, 4, 6,
  8, 12, ... until FAISS scores more vectors than our widest beam and
  reaches our best recall; every point is measured, none interpolated.
  ``--faiss-cache DIR`` keeps trained indexes between runs (training at 1M
  takes minutes to an hour per nlist on 2 cores).

Every side runs single-threaded (OpenBLAS and FAISS's OpenMP: one thread), so
latencies compare work, not thread counts; FAISS's training uses every core
(it is not what is compared). Recall and vectors scored are computed first,
untimed; then ``--warmup`` queries on every configuration, then ``--rounds``
passes over the queries in which every configuration answers each query in
turn, in an order shuffled query by query (none always follows the same one,
whose vectors of that query it would find in cache), so load and drift hit
every side alike; exact search, which sweeps the caches, is timed in a pass
of its own. The load average is printed before and after.

Comparisons, for each beam and each nlist, between measured points only:
FAISS's points just below and just above the beam's mean vectors scored
(their recall against ours), and FAISS's cheapest nprobe whose Recall@10 is
at least ours (its p50 against ours). Where FAISS is faster at equal or
better recall, the output says so.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from ops.bench import emit  # noqa: E402

PROBES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def pct(xs, q) -> float:
    return round(float(np.percentile(np.asarray(xs) * 1000, q)), 4)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


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


def _faiss_query(ivf, params, k: int):
    return lambda q: ivf.search(q[None, :], k, params=params)


def _descent_query(descend, index, start, beam: int, max_depth: int, k: int):
    return lambda q: descend(index, q, start, beam_width=beam, max_depth=max_depth, top_k=k)


def default_nlists(n: int) -> list[int]:
    """n/64 (lists the size of our leaves), 4·sqrt(n), 16·sqrt(n) and sqrt(n), each
    at most n/39 (FAISS's minimum of training points per list), leaving out one
    within 25% of a value already kept (at 1M: 15,625, 4,000 and 1,000)."""
    cap = max(1, n // 39)
    kept: list[int] = []
    for x in (n / 64, 4 * math.sqrt(n), 16 * math.sqrt(n), math.sqrt(n)):
        v = max(1, min(cap, int(x)))
        if all(abs(v - k) > 0.25 * max(v, k) for k in kept):
            kept.append(v)
    return sorted(kept)


def train_ivf(emb: np.ndarray, nlist: int, iterations: int, per_centre: int, cache: Path | None, log=print):
    """FAISS IVF-Flat (inner product) trained as our tree's k-means is. Returns (index, seconds to build)."""
    import hashlib

    import faiss

    sample = np.ascontiguousarray(emb[:: max(1, len(emb) // 4096)])
    data = hashlib.blake2b(sample.tobytes(), digest_size=6).hexdigest()  # which vectors, not only how many
    name = f"ivf-n{len(emb)}-d{emb.shape[1]}-{data}-nlist{nlist}-it{iterations}-pc{per_centre}-sph.faiss"
    if cache is not None and (cache / name).exists():
        ivf = faiss.read_index(str(cache / name))
        if ivf.ntotal == len(emb):
            log(f"  faiss nlist {nlist}: read from {cache / name}")
            return ivf, None
    quant = faiss.IndexFlatIP(emb.shape[1])
    ivf = faiss.IndexIVFFlat(quant, emb.shape[1], nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.own_fields = True
    quant.this.disown()
    ivf.cp.niter = iterations
    ivf.cp.max_points_per_centroid = per_centre
    ivf.cp.spherical = True
    ivf.cp.seed = 0
    faiss.omp_set_num_threads(os.cpu_count() or 1)  # training is not what is compared
    t = time.perf_counter()
    ivf.train(emb)  # FAISS samples per_centre * nlist points itself when given more
    ivf.add(emb)
    build_s = time.perf_counter() - t
    faiss.omp_set_num_threads(1)
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        faiss.write_index(ivf, str(cache / name))
    log(f"  faiss nlist {nlist} (~{len(emb) / nlist:.0f} per list): trained and filled in {build_s:.1f}s")
    return ivf, build_s


def run(store_dir: Path, n_queries: int, beams: list[int], noise: float, *, nlists: list[int] | None = None,
        rounds: int = 3, warmup: int = 20, faiss_cache: Path | None = None, log=print) -> dict:
    import faiss

    from ops.bench import synth
    from pipeline.contracts import Scope
    from pipeline.settings import Settings
    from pipeline.store.database import Store
    from pipeline.store.vector import VectorIndex, compile_kernels, descend
    from pipeline.store.vector.tree import _SAMPLE_PER_CENTER

    faiss.omp_set_num_threads(1)
    load_before = loadavg()
    tree = Settings(_env_file=None).tree
    store = Store.open(store_dir / "store.duckdb", read_only=True)
    rss0 = rss_mb()
    t = time.perf_counter()
    index = VectorIndex.load(store.con, store.generation, store.info.embedding_dim)
    load_s = time.perf_counter() - t
    compile_kernels()  # as a search worker does at start
    store.close()
    n = index.size
    leaves = np.flatnonzero(index.is_leaf)
    leaf_sizes = (index.leaf_end - index.leaf_start)[leaves]
    log(f"{store_dir}: {n} vectors in {len(leaves)} leaves (mean {leaf_sizes.mean():.0f}, max {leaf_sizes.max()}), "
        f"index loaded in {load_s:.1f}s, {index.nbytes() / 2**20:.0f} MiB of arrays, RSS +{rss_mb() - rss0:.0f} MiB; "
        f"load average {load_before}")
    real = store_dir / "queries.npy"
    if real.exists():  # real queries embedded by the model (--locomo, --docstrings)
        queries = np.load(real)[:n_queries]
        log(f"  {len(queries)} real queries from {real}")
    else:
        queries = synth.query_vectors(index.emb, n_queries, noise=noise)
    k = 10
    exact_ids = [set(exact_top(index.emb, q, k).tolist()) for q in queries]

    def recall_of(found_rows) -> float:
        return float(np.mean([len(set(f) & w) / k for f, w in zip(found_rows, exact_ids)]))

    out: dict = {"n": n, "queries": len(queries), "real_queries": real.exists(), "rounds": rounds,
                 "load_s": round(load_s, 2), "index_mib": round(index.nbytes() / 2**20, 1),
                 "leaves": int(len(leaves)), "leaf_size_mean": round(float(leaf_sizes.mean()), 1),
                 "tree": {"branching": tree.branching, "max_leaf_items": tree.max_leaf_items,
                          "kmeans_iterations": tree.kmeans_iterations, "sample_per_centre": _SAMPLE_PER_CENTER},
                 "loadavg_before": load_before, "descent": {}, "faiss": {}}

    # -- untimed: what each configuration finds and how much it scores
    start = index.start_topics(Scope())  # unscoped: every namespace
    configs: dict[str, object] = {"exact": lambda q: exact_top(index.emb, q, k)}
    for beam in beams:
        found, scored, topics = [], [], []
        for q in queries:
            hits, prof = descend(index, q, start, beam_width=beam, max_depth=tree.max_depth, top_k=k)
            found.append([index.row_of[h] for h, _ in hits])
            scored.append(prof["memories_scored"])
            topics.append(prof["topics_scored"])
        out["descent"][beam] = {"scored_mean": round(float(np.mean(scored)), 1), "scored_max": int(np.max(scored)),
                                "centroids_mean": round(float(np.mean(topics)), 1), "recall10": round(recall_of(found), 4)}
        configs[f"beam{beam}"] = _descent_query(descend, index, start, beam, tree.max_depth, k)
    most_scored = max(d["scored_mean"] for d in out["descent"].values())
    best_recall = max(d["recall10"] for d in out["descent"].values())

    ivfs = {}
    for nlist in nlists or default_nlists(n):
        ivf, build_s = train_ivf(index.emb, nlist, tree.kmeans_iterations, _SAMPLE_PER_CENTER, faiss_cache, log)
        ivfs[nlist] = ivf
        sizes = np.array([ivf.invlists.list_size(i) for i in range(nlist)])
        curve = {}
        for nprobe in PROBES:
            if nprobe > nlist:
                break
            params = faiss.SearchParametersIVF(nprobe=nprobe)
            _, found = ivf.search(queries, k, params=params)
            _, lists = ivf.quantizer.search(queries, nprobe)
            scored = sizes[lists].sum(axis=1)  # the members of the probed lists, counted exactly
            curve[nprobe] = {"scored_mean": round(float(scored.mean()), 1), "centroids": nlist,
                             "recall10": round(recall_of(found.tolist()), 4)}
            configs[f"faiss{nlist}/{nprobe}"] = _faiss_query(ivf, params, k)
            if curve[nprobe]["scored_mean"] > 1.25 * most_scored and curve[nprobe]["recall10"] >= best_recall:
                break
        out["faiss"][nlist] = {"build_s": None if build_s is None else round(build_s, 1),
                               "list_size_mean": round(n / nlist, 1), "list_size_max": int(sizes.max()),
                               "curve": curve}

    # -- timed: every configuration answers each query in turn, in an order
    # shuffled query by query (a configuration run after another one of the
    # same query finds some of its vectors in cache: no configuration always
    # follows the same one); exact search, which sweeps every vector out of
    # the caches, is timed in a pass of its own
    names = [name for name in configs if name != "exact"]
    for q in queries[:warmup]:
        for name in configs:
            configs[name](q)
    lat: dict[str, list[float]] = {name: [] for name in configs}
    shuffle = random.Random(7)
    for _ in range(rounds):
        for q in queries:
            for name in shuffle.sample(names, len(names)):
                fn = configs[name]
                t = time.perf_counter()
                fn(q)
                lat[name].append(time.perf_counter() - t)
    for _ in range(rounds):
        for q in queries:
            t = time.perf_counter()
            configs["exact"](q)
            lat["exact"].append(time.perf_counter() - t)

    out["exact"] = {"p50_ms": pct(lat["exact"], 50), "p95_ms": pct(lat["exact"], 95), "scored": n}
    log(f"  exact numpy: p50 {out['exact']['p50_ms']} ms, p95 {out['exact']['p95_ms']} ms, {n} scored")
    for beam, d in out["descent"].items():
        d["p50_ms"], d["p95_ms"] = pct(lat[f"beam{beam}"], 50), pct(lat[f"beam{beam}"], 95)
        d["speedup_vs_exact_p50"] = round(out["exact"]["p50_ms"] / max(d["p50_ms"], 1e-9), 1)
        log(f"  descent beam {beam} x {tree.max_leaf_items}: {d['scored_mean']} scored (max {d['scored_max']}) "
            f"+ {d['centroids_mean']} centroids, Recall@10 {d['recall10']}, p50 {d['p50_ms']} ms, p95 {d['p95_ms']} ms")
    for nlist, f in out["faiss"].items():
        for nprobe, c in f["curve"].items():
            c["p50_ms"], c["p95_ms"] = pct(lat[f"faiss{nlist}/{nprobe}"], 50), pct(lat[f"faiss{nlist}/{nprobe}"], 95)
            log(f"  faiss nlist {nlist} nprobe {nprobe}: {c['scored_mean']} scored + {nlist} centroids, "
                f"Recall@10 {c['recall10']}, p50 {c['p50_ms']} ms, p95 {c['p95_ms']} ms")

    # -- comparisons between measured points
    out["comparisons"] = []
    for beam, d in out["descent"].items():
        for nlist, f in out["faiss"].items():
            pts = sorted(({"nprobe": p, **c} for p, c in f["curve"].items()), key=lambda c: c["scored_mean"])
            below = [c for c in pts if c["scored_mean"] <= d["scored_mean"]]
            above = [c for c in pts if c["scored_mean"] >= d["scored_mean"]]
            reach = [c for c in sorted(pts, key=lambda c: c["nprobe"]) if c["recall10"] >= d["recall10"]]
            cmp = {"beam": beam, "nlist": nlist, "ours": {k_: d[k_] for k_ in ("scored_mean", "recall10", "p50_ms")},
                   "faiss_at_or_below_scored": below[-1] if below else None,
                   "faiss_at_or_above_scored": above[0] if above else None,
                   "faiss_cheapest_at_equal_recall": reach[0] if reach else None}
            if reach:
                ratio = d["p50_ms"] / reach[0]["p50_ms"]
                cmp["p50_ours_over_faiss_at_equal_recall"] = round(ratio, 2)
                cmp["verdict"] = (
                    f"FAISS nlist {nlist} nprobe {reach[0]['nprobe']} reaches Recall@10 {reach[0]['recall10']} "
                    f"(ours {d['recall10']}) scoring {reach[0]['scored_mean']} (ours {d['scored_mean']}) and is "
                    + (f"{ratio:.1f}x FASTER than beam {beam} ({reach[0]['p50_ms']} ms against {d['p50_ms']} ms)"
                       if ratio > 1 else
                       f"{1 / ratio:.1f}x slower than beam {beam} ({reach[0]['p50_ms']} ms against {d['p50_ms']} ms)"))
            else:
                cmp["verdict"] = (f"no measured FAISS nlist {nlist} point reaches beam {beam}'s Recall@10 "
                                  f"{d['recall10']} (best {max(c['recall10'] for c in pts)})")
            if below:
                b = below[-1]
                cmp["recall_at_or_below_scored"] = (
                    f"at <= {d['scored_mean']} scored FAISS nprobe {b['nprobe']} ({b['scored_mean']} scored) "
                    f"reaches {b['recall10']} against our {d['recall10']}")
            out["comparisons"].append(cmp)
            log(f"  beam {beam} vs nlist {nlist}: {cmp['verdict']}"
                + (f"; {cmp['recall_at_or_below_scored']}" if below else "; FAISS's least (nprobe 1) scores more"))
    out["rss_mib"] = round(rss_mb(), 0)
    out["loadavg_after"] = loadavg()
    log(f"  load average after: {out['loadavg_after']}")
    return out


def build_real_store(path: Path, texts: list[str], namespaces: list[str], questions: list[str], what: str,
                     log=print) -> None:
    """A store of ``texts`` embedded by the configured (real) model, with the
    ``questions`` embedded beside it (``queries.npy``) as the queries."""
    from ops.bench import synth
    from pipeline.embedders import make_embedder
    from pipeline.settings import Settings

    path.mkdir(parents=True, exist_ok=True)
    settings = Settings(data_dir=path, _env_file=None)
    embedder = make_embedder(settings)
    t = time.perf_counter()
    emb = embedder.embed(texts)
    asked = embedder.embed(questions)
    np.save(path / "queries.npy", np.asarray(asked, dtype=np.float32))
    log(f"embedded {len(texts)} {what} and {len(questions)} queries in {time.perf_counter() - t:.0f}s")
    synth.build_store(path / "store.duckdb", len(texts), settings, dim=emb.shape[1],
                      emb=np.asarray(emb, dtype=np.float32), docs=texts, namespace_of=namespaces, log=log)


def build_locomo_store(path: Path, data: Path, log=print) -> None:
    """A store of every LoCoMo turn; its questions are the queries."""
    from pipeline.datasets.locomo import load_locomo

    if (path / "store.duckdb").exists():
        return
    loaded = load_locomo(data)
    build_real_store(path, [r["content"] for r in loaded.records], [r["namespace"] for r in loaded.records],
                     [q["text"] for q in loaded.queries], "LoCoMo turns", log=log)


def build_docstring_store(path: Path, n: int, queries: int, log=print) -> None:
    """A store of ``n`` docstring sentences of the installed packages
    (``ops.bench.docstrings``); ``queries`` held-out sentences are the queries."""
    from ops.bench import docstrings

    if (path / "store.duckdb").exists():
        return
    t = time.perf_counter()
    c = docstrings.corpus(n, queries)
    log(f"{n} docstring sentences in {len(set(c.namespaces))} packages, {queries} held out, "
        f"read in {time.perf_counter() - t:.0f}s")
    build_real_store(path, c.texts, c.namespaces, c.queries, "docstring sentences", log=log)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="folder with store.duckdb")
    parser.add_argument("--locomo", type=Path, help="build --store from this LoCoMo file first (real model)")
    parser.add_argument("--docstrings", type=int, metavar="N",
                        help="build --store from N docstring sentences of the installed packages first (real model; "
                             "ops/bench/docstrings.py), with --queries held-out sentences as the queries")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--beams", default="2,4,8,16,32,64")
    parser.add_argument("--nlists", help="FAISS list counts, comma-separated (default: see above)")
    parser.add_argument("--rounds", type=int, default=3, help="timed passes over the queries")
    parser.add_argument("--warmup", type=int, default=20, help="untimed queries on every configuration first")
    parser.add_argument("--noise", type=float, default=0.5, help="query = memory + noise x a random unit vector")
    parser.add_argument("--faiss-cache", type=Path, help="keep trained FAISS indexes here between runs")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.locomo:
        build_locomo_store(args.store, args.locomo)
    if args.docstrings:
        build_docstring_store(args.store, args.docstrings, args.queries)
    result = run(args.store, args.queries, _ints(args.beams), args.noise,
                 nlists=_ints(args.nlists) if args.nlists else None, rounds=args.rounds, warmup=args.warmup,
                 faiss_cache=args.faiss_cache)
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
