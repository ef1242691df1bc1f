"""What keeping the tree and the full-text index fresh costs as the store grows:
one ingest batch into synthetic stores of 10k, 100k and 1M memories.

    python -m ops.bench.freshness --stores /tmp/scale/s10000 /tmp/scale/s100000 /tmp/scale/s1000000 \\
        --batch 1000 --out /tmp/b/freshness.json

Each store (``python -m ops.bench.synth``) is copied to a scratch folder and
receives the same ``--batch`` new memories (synthetic texts and embeddings
near stored ones, spread over the store's namespaces) through
``ingest_records``, the function ``dimple ingest`` and the ``ingest`` queue
call: one transaction that upserts, inserts into the tree leaf by leaf,
rewrites the touched namespaces' subtrees, rebuilds the FTS index and
derives the postings. The embedding is precomputed (a fixed embedder), so
what is timed is the freshness work, stage by stage, against the batch's own
size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


class _Fixed:
    """An embedder that returns vectors computed beforehand, in order."""

    name = "synthetic"

    def __init__(self, vectors: np.ndarray):
        self.vectors, self.dim, self.at = vectors, vectors.shape[1], 0

    def embed(self, texts, progress: bool = False) -> np.ndarray:
        out = self.vectors[self.at : self.at + len(texts)]
        self.at += len(texts)
        return out


def measure(store_dir: Path, batch: int, log=print) -> dict:
    from ops.bench import synth
    from pipeline.store.database import Store
    from pipeline.store.ingest import MemoryRecord, ingest_records
    from workers.settings import WorkerSettings

    with tempfile.TemporaryDirectory(dir=store_dir.parent) as scratch:
        t = time.perf_counter()
        path = Path(scratch) / "store.duckdb"
        shutil.copyfile(store_dir / "store.duckdb", path)
        copy_s = time.perf_counter() - t
        settings = WorkerSettings(data_dir=Path(scratch), _env_file=None)
        store = Store.open(path, read_only=False)
        n, namespaces = store.con.execute("SELECT count(*), list(DISTINCT namespace ORDER BY namespace) FROM memories").fetchone()
        rng = np.random.default_rng(5)
        # near stored memories, like new facts on known topics
        picks = sorted(rng.choice(n, size=batch, replace=n < batch).tolist())
        stored = np.asarray(
            [r[0] for r in store.con.execute(
                "SELECT embedding FROM memories WHERE list_contains(?, rowid) ORDER BY rowid", [picks]).fetchall()],
            dtype=np.float32,
        )
        stored = stored[rng.integers(len(stored), size=batch)]
        vectors = synth._unit(stored + 0.3 * synth._unit(rng.standard_normal(stored.shape).astype(np.float32)))
        texts = synth.texts(batch, seed=99)
        records = [
            MemoryRecord(id=f"fresh-{i:06d}", namespace=namespaces[i % len(namespaces)], content=texts[i],
                         content_type="text")
            for i in range(batch)
        ]
        t = time.perf_counter()
        report = ingest_records(store, records, _Fixed(vectors), settings)
        total = time.perf_counter() - t
        store.con.execute("CHECKPOINT")
        store.close()
    seconds = {k: round(v, 3) for k, v in report.seconds.items()}
    # what the transaction's COMMIT took (the stages end before it)
    seconds["commit"] = round(report.seconds["write"] - sum(report.seconds.get(k, 0.0) for k in ("upsert", "tree", "fulltext")), 3)
    out = {"n": int(n), "batch": batch, "copy_s": round(copy_s, 1), "seconds": seconds, "total_s": round(total, 2),
           "per_memory_ms": round(total / batch * 1000, 2), "inserted": report.inserted}
    log(f"{store_dir}: {n} memories + {batch}: {total:.1f}s in all ({out['per_memory_ms']} ms a memory); "
        f"{seconds}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stores", type=Path, nargs="+", required=True, help="folders holding store.duckdb")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    results = [measure(s, args.batch) for s in args.stores]
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
