"""Hybrid query p50 under each fusion configuration, side by side: the demo
store (built on first use, real model), embedded, audit off, the
configurations alternated round by round (order rotating), ten warm-up
queries before each round's timing. The first configuration is the baseline
of the printed ratios.

    python -m ops.bench.hybrid_latency --data-dir /tmp/demo-lat --rounds 4 --configs rrf,default

Configurations (``CONFIGS``): ``rrf`` (the seed's reciprocal rank fusion,
``fusion=rrf``), ``default`` (the default settings: convex fusion).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from ops.bench import emit

CONFIGS: dict[str, dict] = {
    "rrf": {"fusion": "rrf"},
    "default": {},
}


def run(data_dir: Path, rounds: int, configs: tuple[str, ...] = ("rrf", "default")) -> dict:
    import workers
    from pipeline.datasets.demo import write_demo
    from workers.api import search
    from workers.cli.common import ingest_file
    from workers.settings import WorkerSettings

    base = WorkerSettings(data_dir=data_dir, _env_file=None)
    files = write_demo(data_dir / "files")
    if not (data_dir / "MANIFEST").exists():
        ingest_file(files["memories"], base, progress=False)
    queries = [json.loads(line)["text"] for line in files["queries"].read_text(encoding="utf-8").splitlines()]
    out: dict = {"queries": len(queries), "rounds": rounds, "load_before": os.getloadavg()}
    lat: dict[str, list[float]] = {c: [] for c in configs}
    for r in range(rounds):
        turn = r % len(configs)
        for w in configs[turn:] + configs[:turn]:
            workers.configure(base.replace(**CONFIGS[w], audit_enabled=False))
            for q in queries[:10]:
                search(q)
            for q in queries:
                t = time.perf_counter()
                search(q)
                lat[w].append(time.perf_counter() - t)
    for w, v in lat.items():
        out[w] = {"p50_ms": round(statistics.median(v) * 1000, 2), "n": len(v)}
    first = configs[0]
    for w in configs[1:]:
        out[f"{w}_over_{first}_p50"] = round(out[w]["p50_ms"] / out[first]["p50_ms"], 3)
    out["load_after"] = os.getloadavg()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=Path("/tmp/dimple-hybrid-latency"))
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--configs", default="rrf,default", help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    configs = tuple(args.configs.split(","))
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or len(configs) < 2:
        p.error(f"--configs: give two or more of {', '.join(CONFIGS)} (unknown: {', '.join(unknown) or 'none'})")
    emit(run(args.data_dir, args.rounds, configs), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
