"""Query latency with the audit trail on against off, in one run.

    python -m ops.bench.audit --n 300

Embedded pipeline on the demo store (built if absent), single queries,
interleaved so drift hits every side alike: audit off, audit on, and audit on
with a broken audit store (a folder where its file should be, so every write
fails, retries and is dead-lettered in the background). Goal (issue 4): p50
within 5%, and queries at full speed while audit writes fail.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from ops.bench import embedded_demo


def main(argv=None) -> int:
    import workers
    from workers import audit
    from workers.api import search

    p = argparse.ArgumentParser(prog="python -m ops.bench.audit")
    p.add_argument("--n", type=int, default=300, help="queries per side")
    p.add_argument("--work", type=Path, default=Path("/tmp/dimple-audit-bench"))
    args = p.parse_args(argv)
    base, queries = embedded_demo(args.work)
    broken_dir = args.work / "broken"
    shutil.rmtree(broken_dir, ignore_errors=True)  # dead letters of an earlier run
    broken_dir.mkdir(parents=True)
    (broken_dir / "audit.duckdb").mkdir(exist_ok=True)
    sides = {
        "off": base.replace(audit_enabled=False),
        "on": base,
        # same store, audit rows aimed at an unwritable place
        "broken": base.replace(audit_dir=broken_dir, audit_max_retries=3, audit_backoff_base_s=0.05),
    }
    for q in queries[:20]:  # warm-up: model, store, index
        search(q["text"], namespace=q.get("namespace"))
    timings = {side: [] for side in sides}
    names = list(sides)
    for i in range(args.n * len(names)):
        side = names[i % len(names)]
        workers.configure(sides[side])
        q = queries[(i // len(names)) % len(queries)]
        t0 = time.perf_counter()
        search(q["text"], namespace=q.get("namespace"))
        timings[side].append((time.perf_counter() - t0) * 1000)
    audit.flush(120)
    out = {}
    for side, values in timings.items():
        v = np.asarray(values)
        out[side] = {"n": len(v), "p50_ms": round(float(np.median(v)), 2), "p95_ms": round(float(np.percentile(v, 95)), 2)}
    out["p50_ratio_on_vs_off"] = round(out["on"]["p50_ms"] / out["off"]["p50_ms"], 4)
    out["p50_ratio_broken_vs_off"] = round(out["broken"]["p50_ms"] / out["off"]["p50_ms"], 4)
    from pipeline.audit.letters import dead_letters

    out["dead_letters_from_broken_side"] = len(dead_letters(broken_dir / "audit-dead-letters"))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
