"""Issue 31's tuning goal: ``dimple tune`` on half of a set's judged queries,
then, on the other half, hybrid with what it applied against the better leg.

    python -m ops.bench.tune_halves --beir ../shared/data/beir/cisi --data-dir /tmp/fusion/data/cisi \
        --out /tmp/halves/cisi.json
    python -m ops.bench.tune_halves --locomo ../shared/data/locomo/locomo10.json --data-dir /tmp/fusion/data/locomo ...

The set's store is the one ``dimple eval --beir/--locomo`` builds (built when
absent; ``ops.bench.fusion cache`` builds the same ones). The judged queries
are shuffled with ``--seed`` and cut in two halves; for each half in turn:
the real CLI runs ``dimple tune HALF --apply`` (it stores the configuration
best on that half only when its cross-validated gain is significant, else
exits 3 and the defaults stay), then ``dimple eval --mode all`` on the other
half, then ``dimple tune --reset``. Each direction is reported: what tune
chose and whether it applied, and the held-out half's nDCG@10 per mode, with
hybrid minus the better leg (the goal: >= 0 on every set).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from workers.settings import WorkerSettings


def _cli(args: list[str], data_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "DIMPLE_DATA_DIR": str(data_dir)}
    env.pop("DIMPLE_BROKER_URL", None)
    return subprocess.run([sys.executable, "-m", "workers.cli", *args], env=env, capture_output=True, text=True)


def _write_half(folder: Path, name: str, specs: list, qrels: dict[str, dict[str, int]]) -> tuple[Path, Path]:
    queries, judged = folder / f"{name}.jsonl", folder / f"{name}.qrels"
    queries.write_text("".join(json.dumps({"id": q.id, "query": q.text, "options": q.options}) + "\n" for q in specs),
                       encoding="utf-8")
    judged.write_text("".join(f"{q.id} 0 {doc} {grade}\n" for q in specs for doc, grade in qrels[q.id].items()),
                      encoding="utf-8")
    return queries, judged


def run(source: argparse.Namespace, data_dir: Path, seed: int) -> dict[str, Any]:
    from workers.cli.eval import load_source

    os.environ["DIMPLE_DATA_DIR"] = str(data_dir)
    qset, run_settings = load_source(source, WorkerSettings())  # builds the set's store when absent
    store = Path(run_settings.data_dir)
    specs = [q for q in qset.queries if qset.qrels.get(q.id)]
    random.Random(seed).shuffle(specs)
    halves = {"A": specs[: len(specs) // 2], "B": specs[len(specs) // 2:]}
    out: dict[str, Any] = {"set": qset.name, "queries": len(specs), "seed": seed, "store": str(store), "directions": []}
    _cli(["tune", "--reset"], store)
    with tempfile.TemporaryDirectory(prefix="dimple-halves-") as tmp:
        folder = Path(tmp)
        files = {h: _write_half(folder, h, s, qset.qrels) for h, s in halves.items()}
        for tuned_on, held_out in (("A", "B"), ("B", "A")):
            t0 = time.perf_counter()
            tune = _cli(["tune", *map(str, files[tuned_on]), "--apply"], store)
            if tune.returncode not in (0, 3):
                raise SystemExit(f"dimple tune failed ({tune.returncode}): {tune.stderr[-2000:]}")
            shown = _cli(["tune", "--show"], store).stdout.strip()
            name = f"held-{held_out}"
            ev = _cli(["eval", "--queries", str(files[held_out][0]), "--qrels", str(files[held_out][1]),
                       "--mode", "all", "--out", str(folder), "--name", name, "--no-progress"], store)
            if ev.returncode != 0:
                raise SystemExit(f"dimple eval failed ({ev.returncode}): {ev.stderr[-2000:]}")
            ndcg = {mode: json.loads((folder / name / mode / "report.json").read_text())["metrics"]["ndcg@10"]
                    for mode in ("keyword", "semantic", "hybrid")}
            _cli(["tune", "--reset"], store)
            out["directions"].append({
                "tuned_on": tuned_on, "queries_tuned": len(halves[tuned_on]), "held_out": held_out,
                "queries_held_out": len(halves[held_out]), "applied": tune.returncode == 0,
                "tune_says": (tune.stdout.strip().splitlines() or [""])[-1] if tune.returncode == 0
                else tune.stderr.strip().splitlines()[-1], "tuned": shown, "ndcg@10": ndcg,
                "hybrid_minus_better_leg": round(ndcg["hybrid"] - max(ndcg["keyword"], ndcg["semantic"]), 4),
                "seconds": round(time.perf_counter() - t0, 1)})
            d = out["directions"][-1]
            print(f"{qset.name}: tuned on {tuned_on} ({'applied' if d['applied'] else 'not applied'}: {d['tuned']}); "
                  f"held-out {held_out}: keyword {ndcg['keyword']:.3f} semantic {ndcg['semantic']:.3f} "
                  f"hybrid {ndcg['hybrid']:.3f} ({d['hybrid_minus_better_leg']:+.3f} over the better leg)", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.tune_halves", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--beir", type=Path)
    g.add_argument("--locomo", type=Path)
    p.add_argument("--data-dir", type=Path, required=True, help="where the set's store lives (built when absent)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    source = argparse.Namespace(queries=None, qrels=None, beir=a.beir, locomo=a.locomo, demo=False, store=None,
                                strict=False)
    result = run(source, a.data_dir, a.seed)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
