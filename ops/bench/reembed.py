"""What changing the embedding model costs: ``dimple reembed`` against raw embedding of the same texts.

    python -m ops.bench.reembed --n 5000 --work /tmp/dimple-reembed-bench

A store of N texts (``ops.bench.ingest.corpus``: LoCoMo turns when present) is
written with the hash fake (no model: quick), then re-embedded with
``--model`` (default the packaged MiniLM) by ``pipeline.store.reembed``; the
baseline is the same bulk embedder embedding the same texts alone, warmed
up first, in the same process.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ops.bench.ingest import corpus
from pipeline.embedders import make_embedder
from pipeline.settings import PACKAGED_MODEL
from workers.settings import WorkerSettings


def measure(work: Path, model: str, records: list[dict]) -> dict:
    from pipeline.store.reembed import reembed
    from workers.cli.common import drop_store, ingest_file

    work.mkdir(parents=True, exist_ok=True)
    before = WorkerSettings(data_dir=work, embedding_model="hash-384", _env_file=None, audit_enabled=False)
    drop_store(before)
    path = work / "memories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    ingest_file(path, before, progress=False)
    after = before.replace(embedding_model=model)
    embedder = make_embedder(after, bulk=True)
    texts = [r["content"] for r in records]
    embedder.embed(texts[:64])  # warm-up: model load and first-call costs out of both timings
    t0 = time.perf_counter()
    embedder.embed(texts)
    raw = time.perf_counter() - t0
    report = reembed(after, embedder=embedder)
    total = report.seconds["total"]
    return {
        "memories": report.memories, "model": report.model, "dim": report.dim,
        "raw_embed_s": round(raw, 2), "raw_embed_per_s": round(len(texts) / raw, 1),
        "reembed_s": round(total, 2), "reembed_per_s": round(report.memories / total, 1),
        "reembed_embed_s": round(report.seconds["embed"], 2),
        "overhead_vs_raw_embed": round(total / raw - 1, 4),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.reembed")
    p.add_argument("--n", type=int, default=5_000)
    p.add_argument("--model", default=PACKAGED_MODEL)
    p.add_argument("--work", type=Path, default=Path("/tmp/dimple-reembed-bench"))
    p.add_argument("--locomo", type=Path, default=Path(__file__).resolve().parents[3] / "shared/data/locomo/locomo10.json")
    args = p.parse_args(argv)
    print(json.dumps(measure(args.work, args.model, corpus(args.n, args.locomo)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
