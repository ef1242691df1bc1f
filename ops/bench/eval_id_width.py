"""``dimple eval``'s metrics after a new install: what a query set whose memory
ids have another width costs, with the ids coded to one width (now) against
the raw ids handed to ranx (the path before), in one run.

    python -m ops.bench.eval_id_width

ranx keeps a query's memory ids as a numpy string array typed by the longest
id, and numba compiles ranx's functions once per type into its on-disk cache.
Each side gets an empty cache of its own (``NUMBA_CACHE_DIR``) and scores, in
a process each, as ``dimple eval`` does (``pipeline.evaluation.score``, or
ranx's ``evaluate`` on the raw ids for the baseline):

1. set A (ids of 5 characters): a new install's first evaluation, cold;
2. set A again: warm;
3. set B (ids of 36 characters): another query set, same install.

Step 3 is the figure: with coded ids it costs what step 2 costs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_SCORE = """
import json, sys, time
which, width = sys.argv[1], int(sys.argv[2])
run = {f"q{i}": [f"{j:0{width}d}" for j in range(i, i + 20)] for i in range(50)}
qrels = {f"q{i}": {f"{i + 3:0{width}d}": 1, f"{i + 30:0{width}d}": 2} for i in range(50)}
t0 = time.perf_counter()
from pipeline.evaluation import METRICS, score
if which == "coded":
    means, _ = score(run, qrels)
else:  # the path before: ranx on the raw ids
    from ranx import Qrels, Run, evaluate
    means = evaluate(Qrels(qrels), Run({q: {d: float(len(ds) - k) for k, d in enumerate(ds)} for q, ds in run.items()}),
                     list(METRICS))
print(json.dumps({"s": time.perf_counter() - t0, "ndcg@10": means["ndcg@10"]}))
"""


def _score(which: str, width: int, cache: str) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    done = subprocess.run([sys.executable, "-c", _SCORE, which, str(width)], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m ops.bench.eval_id_width", description=__doc__).parse_args(argv)
    out: dict = {"load_average_before": os.getloadavg()}
    t0 = time.perf_counter()
    for which in ("raw", "coded"):
        with tempfile.TemporaryDirectory() as cache:
            steps = [_score(which, 5, cache), _score(which, 5, cache), _score(which, 36, cache)]
        assert steps[0]["ndcg@10"] == steps[2]["ndcg@10"]  # the same judgments, other ids
        out[which] = {"first_s": round(steps[0]["s"], 2), "warm_s": round(steps[1]["s"], 2),
                      "other_width_s": round(steps[2]["s"], 2), "ndcg@10": steps[0]["ndcg@10"]}
    assert out["raw"]["ndcg@10"] == out["coded"]["ndcg@10"]
    out["ratio_other_width_coded_over_raw"] = round(out["coded"]["other_width_s"] / out["raw"]["other_width_s"], 3)
    out["load_average_after"] = os.getloadavg()
    out["bench_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
