"""Ingest throughput against raw embedding throughput of the same texts, in one run.

    python -m ops.bench.ingest --n 10000 --work /tmp/dimple-ingest-bench

Texts are LoCoMo turns when ../shared/data/locomo is present (cycled, each
cycle its own namespaces, to reach N), otherwise the generated demo corpus.
Goal (issue 2): store, tree and index add at most 15% to embedding time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pipeline.embedders import make_embedder
from pipeline.settings import Settings
from workers.settings import WorkerSettings


def corpus(n: int, locomo: Path) -> list[dict]:
    if locomo.is_file():
        from pipeline.datasets.locomo import load_locomo

        base = load_locomo(locomo).records
    else:
        from pipeline.datasets.demo import generate_corpus

        base = generate_corpus()
    out = []
    cycle = 0
    while len(out) < n:
        for r in base:
            if len(out) >= n:
                break
            out.append({
                "id": f"{r['id']}#{cycle}", "namespace": f"{r['namespace']}#{cycle}",
                "content": r["content"] if cycle == 0 else f"{r['content']} ({cycle})",
                "content_type": r.get("content_type", "text"), "created_at": r.get("created_at"),
            })
        cycle += 1
    return out


def measure(settings: Settings, records: list[dict]) -> dict:
    """Raw embedding of the records' texts, then ``dimple ingest`` of the same
    records into a fresh store; both timed in this process."""
    from workers.cli.common import drop_store, ingest_file

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    drop_store(settings)
    path = settings.data_dir / "memories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    embedder = make_embedder(settings)
    texts = [r["content"] for r in records]
    embedder.embed(texts[:64])  # warm-up: model load and first-call costs out of both timings
    t0 = time.perf_counter()
    embedder.embed(texts)
    raw = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = ingest_file(path, settings, progress=False)
    total = time.perf_counter() - t0
    return {
        "memories": len(records),
        "raw_embed_s": round(raw, 2),
        "raw_embed_per_s": round(len(records) / raw, 1),
        "ingest_s": round(total, 2),
        "ingest_per_s": round(len(records) / total, 1),
        "stages_s": {k: round(v, 3) for k, v in report.seconds.items()},
        "store_tree_index_s": round(total - report.seconds["embed"], 2),
        "overhead_vs_raw_embed": round(total / raw - 1, 4),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.ingest")
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--work", type=Path, default=Path("/tmp/dimple-ingest-bench"))
    p.add_argument("--locomo", type=Path, default=Path(__file__).resolve().parents[3] / "shared/data/locomo/locomo10.json")
    args = p.parse_args(argv)
    settings = WorkerSettings().replace(data_dir=args.work)
    out = measure(settings, corpus(args.n, args.locomo))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
