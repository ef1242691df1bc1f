"""Synthetic memories for the scale benchmarks: texts, clustered embeddings and
stores written directly through the store and tree primitives (no model: the
real one embeds ~180 texts/s here, so 1M memories would take ~1.5 hours).

Texts: ~40 words drawn from a Zipf-distributed vocabulary of pronounceable
pseudo-words (some with English suffixes, so the Porter stemmer has work),
English stopwords, and identifiers (``ERR_CONN_RESET``, ``db-17``,
``src/app/main.py``). Embeddings: a two-level mixture (topics, sub-topics,
points), unit length, so a tree has structure to find.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"] + ["str", "pl", "qu", "th", "sh", "ch"]
SUFFIXES = ["", "", "", "s", "ing", "ed", "er", "ly", "tion", "ness"]
STOPWORDS = ["the", "a", "of", "to", "and", "in", "is", "it", "for", "on", "with", "was", "this", "that", "we"]
IDENT_PARTS = ["ERR", "CONN", "RESET", "TIMEOUT", "AUTH", "DB", "CACHE", "MISS", "QUEUE", "FULL"]
VOCAB = 200_000
PATHS = ["src/app/main.py", "lib/core/io.rs", "cmd/server/run.go", "web/ui/index.ts", "ops/deploy.sh"]


def vocabulary(size: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        n = int(rng.integers(2, 5))
        w = "".join(SYLLABLES[i] for i in rng.integers(len(SYLLABLES), size=n)) + SUFFIXES[int(rng.integers(len(SUFFIXES)))]
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def identifiers(rng: np.random.Generator, n: int) -> list[str]:
    out = []
    for _ in range(n):
        kind = int(rng.integers(3))
        if kind == 0:
            out.append("_".join(IDENT_PARTS[i] for i in rng.choice(len(IDENT_PARTS), size=3, replace=False)))
        elif kind == 1:
            out.append(f"db-{int(rng.integers(100))}")
        else:
            out.append(PATHS[int(rng.integers(len(PATHS)))])
    return out


def texts(n: int, *, words: int = 40, vocab_size: int = VOCAB, seed: int = 0) -> list[str]:
    """``n`` synthetic memory texts; the same arguments give the same texts."""
    vocab = np.asarray(vocabulary(vocab_size, seed), dtype=object)
    rng = np.random.default_rng(seed + 1)
    # Zipf-Mandelbrot over ranks: the most frequent content word is ~0.25% of
    # tokens (in ~9% of texts), as in English once stopwords are removed
    p = 1.0 / (np.arange(1, vocab_size + 1) + 50.0)
    p /= p.sum()
    out = []
    chunk = 50_000
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        lengths = rng.integers(words // 2, words * 3 // 2 + 1, size=m)
        draws = rng.choice(vocab_size, size=int(lengths.sum()), p=p)
        stops = rng.random(int(lengths.sum())) < 0.2
        stop_words = np.asarray(STOPWORDS, dtype=object)[rng.integers(len(STOPWORDS), size=int(lengths.sum()))]
        tokens = np.where(stops, stop_words, vocab[draws])
        idents = identifiers(rng, m)
        has_ident = rng.random(m) < 0.3
        pos = 0
        for j in range(m):
            k = int(lengths[j])
            line = " ".join(tokens[pos : pos + k])
            pos += k
            if has_ident[j]:
                line = f"{line} {idents[j]}"
            out.append(line)
    return out


def queries(n: int, *, vocab_size: int = VOCAB, seed: int = 7, corpus_seed: int = 0) -> list[str]:
    """Queries of 1-6 terms mixing frequent and rare words, stopwords, repeats,
    unknown words and identifiers."""
    vocab = vocabulary(vocab_size, corpus_seed)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 7))
        terms = []
        for _ in range(k):
            r = rng.random()
            if r < 0.55:
                terms.append(vocab[int(rng.integers(2000))])  # frequent
            elif r < 0.8:
                terms.append(vocab[int(rng.integers(vocab_size))])  # anywhere
            elif r < 0.87:
                terms.append(STOPWORDS[int(rng.integers(len(STOPWORDS)))])
            elif r < 0.93:
                terms.append(identifiers(rng, 1)[0])
            elif r < 0.97 and terms:
                terms.append(terms[-1])  # repeated term
            else:
                terms.append("zzq" + "".join(rng.choice(list("xyzq"), size=4)))  # unknown
        out.append(" ".join(terms))
    return out


def queries_from_texts(docs: list[str], n: int, *, seed: int = 7) -> list[str]:
    """Queries of 1-6 terms drawn from ``docs`` themselves (a store's own texts,
    or the texts of one scope), so a query is never empty for want of a known
    word: each starts with a word of a random text, later terms are words of
    that text or of another (frequent words are drawn as often as they occur),
    stopwords, repeats, identifiers and, rarely, an unknown word."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 7))
        words = docs[int(rng.integers(len(docs)))].split()
        content = [w for w in words if w not in STOPWORDS] or words
        terms = [content[int(rng.integers(len(content)))]]  # a word its text is indexed under
        while len(terms) < k:
            r = rng.random()
            if r < 0.45:
                terms.append(words[int(rng.integers(len(words)))])  # co-occurs with the first
            elif r < 0.75:
                other = docs[int(rng.integers(len(docs)))].split()
                terms.append(other[int(rng.integers(len(other)))])
            elif r < 0.85:
                terms.append(STOPWORDS[int(rng.integers(len(STOPWORDS)))])
            elif r < 0.92:
                terms.append(terms[-1])  # repeated term
            elif r < 0.97:
                terms.append(identifiers(rng, 1)[0])
            else:
                terms.append("zzq" + "".join(rng.choice(list("xyzq"), size=4)))  # unknown
        out.append(" ".join(terms))
    return out


def clustered_embeddings(n: int, dim: int = 384, *, topics: int | None = None, seed: int = 0,
                         spread: float = 0.35, sub_spread: float = 0.5) -> np.ndarray:
    """Unit vectors from a two-level mixture: ~sqrt(n)/2 topics of ~8 sub-topics each.

    Each point is its sub-topic centre plus isotropic noise, renormalised, so
    neighbours are mostly (not always) in the same sub-topic.
    """
    rng = np.random.default_rng(seed)
    topics = topics or max(8, int(math.sqrt(n) / 2))
    centres = _unit(rng.standard_normal((topics, dim)).astype(np.float32))
    subs = _unit(np.repeat(centres, 8, axis=0) + sub_spread * _unit(rng.standard_normal((topics * 8, dim)).astype(np.float32)))
    out = np.empty((n, dim), dtype=np.float32)
    chunk = 100_000
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        which = rng.integers(len(subs), size=m)
        noise = _unit(rng.standard_normal((m, dim)).astype(np.float32))
        out[start : start + m] = _unit(subs[which] + spread * 2.0 * noise)
    return out


def query_vectors(emb: np.ndarray, n: int, seed: int = 11, noise: float = 0.5) -> np.ndarray:
    """Queries near stored memories (a memory plus noise), like a paraphrase."""
    rng = np.random.default_rng(seed)
    base = emb[rng.integers(len(emb), size=n)]
    return _unit(base + noise * _unit(rng.standard_normal(base.shape).astype(np.float32)))


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    norms[norms == 0] = 1
    return (x / norms).astype(np.float32)


def build_store(path: Path, n: int, settings, *, namespaces: int = 4, dim: int = 384, seed: int = 0,
                emb: np.ndarray | None = None, docs: list[str] | None = None,
                namespace_of: list[str] | None = None, content_type_of: list[str] | None = None,
                embedding_model: str = "synthetic", log=print) -> dict:
    """Write ``n`` synthetic memories, their tree and their full-text index into
    a new store at ``path`` through the same primitives ingest uses. Returns timings.

    Namespaces default to ``ns{i % namespaces}`` and content types to one of
    three by ``i % 3``; pass ``namespace_of`` / ``content_type_of`` (one per
    memory) for assignments independent of each other."""
    from pipeline.store.database import Store, utcnow
    from pipeline.store.fulltext import rebuild_index
    from pipeline.store.ingest import fts_text_of

    seconds: dict[str, float] = {}
    t = time.perf_counter()
    docs = docs if docs is not None else texts(n, seed=seed)
    emb = emb if emb is not None else clustered_embeddings(n, dim, seed=seed)
    ids = [f"s{i:07d}" for i in range(n)]
    ns_of = namespace_of if namespace_of is not None else [f"ns{i % namespaces}" for i in range(n)]
    ctypes = ["text", "code", "decision"]
    ct_of = content_type_of if content_type_of is not None else [ctypes[i % 3] for i in range(n)]
    seconds["generate"] = time.perf_counter() - t
    log(f"generated {n} texts and embeddings in {seconds['generate']:.1f}s")
    t = time.perf_counter()
    # ``embedding_model``: the model the store records (a bench that writes with the hash embedder names it)
    store = Store.open(path, read_only=False, embedding_model=embedding_model, embedding_dim=dim)
    con = store.con
    now = utcnow()
    chunk = 50_000
    cols = ", ".join(f"column{j}" for j in range(1, dim + 1))
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        # DuckDB scans this local numpy array by name (pipeline.store.ingest.embedding_rows registers its columns on the connection instead)
        _synth_vectors = np.empty((dim + 1, stop - start), dtype=np.float32)
        _synth_vectors[0] = np.arange(stop - start)
        _synth_vectors[1:] = emb[start:stop].T
        con.execute(
            "INSERT INTO memories (id, namespace, content, content_type, created_at, content_hash, embedding, "
            "metadata, ingested_at, context, fts_text) "
            "SELECT m.id, m.ns, m.content, m.ctype, ?, 'synthetic', e.embedding, NULL, ?, NULL, m.fts "
            "FROM (SELECT unnest(?) AS pos, unnest(?) AS id, unnest(?) AS ns, unnest(?) AS content, "
            f"unnest(?) AS ctype, unnest(?) AS fts) m JOIN (SELECT column0::BIGINT AS pos, [{cols}]::FLOAT[{dim}] AS embedding "
            "FROM _synth_vectors) e USING (pos)",
            [now, now, list(range(stop - start)), ids[start:stop], ns_of[start:stop], docs[start:stop],
             ct_of[start:stop], [fts_text_of(d, None) for d in docs[start:stop]]],
        )
        del _synth_vectors
    seconds["insert"] = time.perf_counter() - t
    log(f"inserted in {seconds['insert']:.1f}s")
    t = time.perf_counter()
    _save_tree(con, settings, ids, ns_of, emb, docs)
    seconds["tree"] = time.perf_counter() - t
    log(f"tree in {seconds['tree']:.1f}s")
    t = time.perf_counter()
    rebuild_index(con, settings.fulltext)
    store.set_meta("generation", "1")
    store.set_meta("fts_generation", "1")
    seconds["fulltext"] = time.perf_counter() - t
    log(f"full-text index in {seconds['fulltext']:.1f}s")
    con.execute("CHECKPOINT")
    store.close()
    return seconds


def _save_tree(con, settings, ids, ns_of, emb, docs) -> None:
    from pipeline.store.vector import Tree, save_namespaces

    tree = Tree(settings.tree)
    names = sorted(set(ns_of))
    ns_arr = np.asarray(ns_of)
    for ns in names:
        rows = np.flatnonzero(ns_arr == ns)
        # labels only need a few words; short texts keep 1M builds quick
        tree.build_namespace(ns, [ids[i] for i in rows], emb[rows], [docs[i][:40] for i in rows])
    save_namespaces(con, tree, names)


def retree(path: Path, n: int, settings, *, namespaces: int = 4, dim: int = 384, seed: int = 0, log=print) -> float:
    """Rebuild only the topic tree of a store ``build_store`` wrote with the same
    arguments (its texts and embeddings are generated again, bit for bit), as a
    new generation; memories and the full-text index are left as they are."""
    from pipeline.store.database import Store

    t = time.perf_counter()
    docs, emb = texts(n, seed=seed), clustered_embeddings(n, dim, seed=seed)
    ids = [f"s{i:07d}" for i in range(n)]
    ns_of = [f"ns{i % namespaces}" for i in range(n)]
    store = Store.open(path, read_only=False)
    con = store.con
    con.execute("BEGIN TRANSACTION")
    con.execute("DELETE FROM topics")
    con.execute("DELETE FROM memory_topics WHERE kind IN ('leaf', 'ancestor')")
    _save_tree(con, settings, ids, ns_of, emb, docs)
    generation = str(store.generation + 1)
    store.set_meta("generation", generation)
    store.set_meta("fts_generation", generation)  # same memories: the index stays valid
    con.execute("COMMIT")
    con.execute("CHECKPOINT")
    store.close()
    log(f"tree rebuilt in {time.perf_counter() - t:.1f}s")
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    """``python -m ops.bench.synth --n 1000000 --out /tmp/dimple-synth-1m``: one
    synthetic store (its embeddings also as ``embeddings.npy`` for baselines)."""
    import argparse
    import json

    from workers.settings import WorkerSettings

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--namespaces", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--retree", action="store_true",
                        help="rebuild only the topic tree of the store already there (after a tree change)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "store.duckdb"
    if args.retree:
        retree(path, args.n, WorkerSettings(data_dir=args.out, _env_file=None), namespaces=args.namespaces, seed=args.seed)
        return 0
    if path.exists():
        print(f"{path} exists")
        return 0
    settings = WorkerSettings(data_dir=args.out, _env_file=None)
    seconds = build_store(path, args.n, settings, namespaces=args.namespaces, seed=args.seed)
    (args.out / "build.json").write_text(json.dumps({"n": args.n, "seconds": seconds}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
