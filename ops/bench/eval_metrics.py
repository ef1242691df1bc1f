"""``dimple eval``'s metrics and paired test: this project's (plain Python and
numpy) against ranx, the reference library they follow, in one run.

    python -m ops.bench.eval_metrics            # needs ranx: pip install -e '.[bench]'

What ``dimple eval --mode all`` does with its figures, on a LoCoMo-sized set
(1,536 judged queries, 50 served memories each, 1-4 relevant memories of
grade 1-2): score two runs on the seven reported metrics, then the paired
randomisation test of one against the other on each metric (1,000
permutations, seed 42). Each side runs in processes of its own, timed from
before its import to the last p-value, and gets an empty numba cache
(``NUMBA_CACHE_DIR``) so the first process is a new install's:

1. cold: the first process after an install (ranx compiles its functions and
   writes them to the cache);
2. warm: the next process (ranx loads them from the cache and still builds its
   typed containers).

ranx runs as its README shows it (``evaluate``, ``compare`` with
``stat_test="fisher"``, every thread). Both sides must give the same means,
and p-values within the randomisation test's own noise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_WORK = """
import json, random, sys, time
which = sys.argv[1]
rng = random.Random(16)
ids = [f"m{i:05d}" for i in range(6000)]
qrels, runs = {}, [{}, {}]
for q in range(1536):
    rel = rng.sample(ids, rng.randrange(1, 5))
    qrels[f"q{q}"] = {d: rng.choice((1, 2)) for d in rel}
    for run, found in zip(runs, (0.55, 0.62)):
        served = rng.sample(ids, 50)
        for d in rel:
            if rng.random() < found:
                served.insert(rng.randrange(0, 12), d)
        run[f"q{q}"] = list(dict.fromkeys(served))[:50]
t0 = time.perf_counter()
if which == "ours":
    from pipeline.evaluation.metrics import METRICS, paired_p_value, score
    (means, a), (_, b) = score(runs[0], qrels), score(runs[1], qrels)
    order = sorted(a)
    p = {m: paired_p_value([a[q][m] for q in order], [b[q][m] for q in order], seed=42) for m in METRICS}
else:
    from ranx import Qrels, Run, compare, evaluate
    from pipeline.evaluation.metrics import METRICS
    as_run = lambda run, name: Run({q: {d: float(50 - i) for i, d in enumerate(ds)} for q, ds in run.items()}, name=name)
    truth = Qrels(qrels)
    means = evaluate(truth, as_run(runs[0], "a"), list(METRICS))
    report = compare(truth, [as_run(runs[0], "a"), as_run(runs[1], "b")], metrics=list(METRICS), stat_test="fisher",
                     random_seed=42, max_p=0.05).to_dict()
    p = {m: report["b"]["comparisons"]["a"][m] for m in METRICS}
print(json.dumps({"s": time.perf_counter() - t0, "means": means, "p": p}))
"""


def _process(which: str, cache: str) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _WORK, which], env=env, capture_output=True, text=True, check=True)
    return {**json.loads(done.stdout.splitlines()[-1]), "process_s": time.perf_counter() - t0}


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m ops.bench.eval_metrics", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    out: dict = {"load_average_before": os.getloadavg()}
    t0 = time.perf_counter()
    steps = {}
    for which in ("ranx", "ours"):
        with tempfile.TemporaryDirectory() as cache:
            steps[which] = [_process(which, cache), _process(which, cache)]
        out[which] = {"cold_s": round(steps[which][0]["s"], 2), "warm_s": round(steps[which][1]["s"], 2),
                      "cold_process_s": round(steps[which][0]["process_s"], 2),
                      "warm_process_s": round(steps[which][1]["process_s"], 2)}
    ours, ranx = steps["ours"][1], steps["ranx"][1]
    assert all(abs(ours["means"][m] - ranx["means"][m]) < 1e-9 for m in ours["means"]), (ours["means"], ranx["means"])
    out["means"] = {m: round(v, 4) for m, v in ours["means"].items()}
    out["p_values"] = {m: {"ours": ours["p"][m], "ranx": ranx["p"][m]} for m in ours["p"]}
    out["ratio_cold_ours_over_ranx"] = round(out["ours"]["cold_s"] / out["ranx"]["cold_s"], 4)
    out["ratio_warm_ours_over_ranx"] = round(out["ours"]["warm_s"] / out["ranx"]["warm_s"], 4)
    out["load_average_after"] = os.getloadavg()
    out["bench_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
