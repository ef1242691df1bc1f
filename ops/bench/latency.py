"""The floor against the whole query (issue 33): how much of a query is the
model and the legs, and how much is everything around them.

    python -m ops.bench.latency --work /tmp/dimple-latency --rounds 4 --out latency.json
    python -m ops.bench.latency --work /tmp/dimple-latency --rounds 2 --embedded-only
    python -m ops.bench.latency --work /tmp/dimple-latency --synthetic 100000 --rounds 2 --embedded-only

On the demo store under ``--work`` (built on first use, real model), single
queries (the demo's queries, ``--queries`` of them), in rounds; or, with
``--synthetic N``, on a synthetic store of N memories (``ops.bench.synth``,
migrated into a lake under ``--work`` on first use, as ``ops.bench.writes``
builds them: 384-d hash embeddings, so the floor's ``embed`` is the hash
embedder's and only the differences to it mean anything), with queries of 1-6
of its own words (``synth.queries_from_texts``, ``--queries`` per block, 75
by default), over the whole store, each side's block of each round (and of
the warm-up and the breakdown) new queries, asked by no other block: no side
is answered from what an earlier side's same queries read, as a large store
with varied queries is not; in each round
every side runs the whole query set, the sides' order rotating from round to
round so drift hits all alike, ``--warmup`` untimed queries per side first:

- the floor: ``embed``, the query text embedded alone by the embedder the
  query uses (``Resources.embedder``); ``vector_leg`` (``search.descend`` on a
  batch carrying the query's vector) and ``fulltext_leg`` (``search.fulltext``),
  each run as the stage runs (``STAGES[name].run(batch, resources)``);
- the whole query (``workers.api.search``), keyword, semantic and hybrid,
  embedded with the audit trail off and on (on: the writer drained inside the
  block's time, ``block_ms_per_query``), and through Redis (unless
  ``--embedded-only``) with a redis-server, an embed worker and a search
  worker with 2 processes started here (``ops.stack``), audit off.

Each whole-query side reports its wall p50 / p95, the p50 of each stage's own
recorded time (``Results.timings``: what the audit row's ``latency_ms`` holds),
of their sum (``stages_sum``) and of the rest (``outside_stages``: wall minus
that sum, per query). After the rounds, a breakdown pass (embedded, audit
off, each mode over the query set once) splits the time outside the stages
further, per query, mean and p50 in ms: ``make_batch`` (validating the query,
``workers.api``), each stage task's wall in the eager canvas (Celery's
``task_prerun`` to ``task_postrun``) against the stage's recorded time, and,
timed again on the same messages, what the task adds around the stage:
``validate`` (the message into a ``Batch``, as ``workers.tasks`` does it;
a batch an earlier stage handed on as it is, ``HandedOn``, is only unwrapped),
``serialise`` (its output to JSON; 0 when it hands its batch on) and, for the
last stage, ``audit_emit``
(the audit row built and logged, sent when on: ``workers.audit.emit``);
``task_other`` (the task's wall less its recorded time and those: Celery's
tracer around the task, and the stage's own work outside its recorded time);
``decode`` (the answer into ``Results``) and ``canvas`` (the wall minus all
of the task walls, ``make_batch`` and ``decode``: Celery's canvas and eager
machinery). The means add up to the mean wall; the p50s do not.

JSON (``--out``) keys: ``store``, ``queries``, ``rounds``, ``load_before``,
``load_after``, ``load_per_round``, ``floor`` (``embed``, ``vector_leg``,
``fulltext_leg``: ``p50_ms``, ``p95_ms``, ``p99_ms``, ``max_ms``, ``n``), ``embedded`` (``audit_off``
and ``audit_on``, each by mode), ``broker`` (by mode; null with
``--embedded-only``), ``breakdown`` (by mode), ``ratios``
(``hybrid_over_embed_p50``: the embedded hybrid p50, audit off, over the
embedding p50; ``hybrid_minus_embed_p50_ms``; ``keyword_over_fulltext_leg_p50``;
``semantic_minus_embed_p50_ms``; ``audit_on_over_off_p50`` and
``audit_on_over_off_block`` by mode; ``broker_extra_ms_p50`` by mode). Figures
only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from ops.bench import embedded_demo, emit

MODES = ("keyword", "semantic", "hybrid")
FLOOR = ("embed", "vector_leg", "fulltext_leg")
RECORDED_BY = {"fuse": ("fuse", "recency")}  # the timings a stage task records, where not its own name


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def _pct(values: list[float]) -> dict:
    a = np.asarray(values, dtype=float)
    return {"p50_ms": round(float(np.median(a)), 3), "p95_ms": round(float(np.percentile(a, 95)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3), "max_ms": round(float(a.max()), 3), "n": len(a)}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Floor:
    """The floor sides: the embedder alone, each leg alone as its stage runs it."""

    def __init__(self, queries: list[dict]) -> None:
        from pipeline.stages.registry import STAGES
        from workers import resources
        from workers.api import _batch

        self.res = resources.current()
        self.stages = STAGES
        self.keyword = [_batch([(q["text"], {"namespace": q.get("namespace"), "mode": "keyword"})]) for q in queries]
        self.semantic = [_batch([(q["text"], {"namespace": q.get("namespace"), "mode": "semantic"})]) for q in queries]
        vectors = self.res.embedder().embed([q["text"] for q in queries])
        for batch, vec in zip(self.semantic, vectors):
            batch.states[0].query.vector = vec.tolist()

    def embed(self, i: int, text: str) -> float:
        embedder = self.res.embedder()
        t0 = time.perf_counter()
        embedder.embed([text])
        return time.perf_counter() - t0

    def vector_leg(self, i: int, text: str) -> float:
        batch = self.semantic[i].model_copy(deep=True)  # the stage consumes the vector
        t0 = time.perf_counter()
        self.stages["search.descend"].run(batch, self.res)
        return time.perf_counter() - t0

    def fulltext_leg(self, i: int, text: str) -> float:
        batch = self.keyword[i].model_copy(deep=True)
        t0 = time.perf_counter()
        self.stages["search.fulltext"].run(batch, self.res)
        return time.perf_counter() - t0


def _whole(queries: list[dict], mode: str, out: dict, search) -> None:
    """The query set once in ``mode``; each query's wall, recorded stages and the rest into ``out``."""
    for q in queries:
        t0 = time.perf_counter()
        r = search(q["text"], namespace=q.get("namespace"), mode=mode, origin="eval")  # benchmark traffic
        wall = _ms(time.perf_counter() - t0)
        out["wall"].append(wall)
        for stage, ms in r.timings.items():
            out["stages"].setdefault(stage, []).append(ms)
        out["stages_sum"].append(sum(r.timings.values()))
        out["outside_stages"].append(wall - sum(r.timings.values()))
        out["total_ms"].append(r.total_ms)


def _new() -> dict:
    return {"wall": [], "stages": {}, "stages_sum": [], "outside_stages": [], "total_ms": [], "block_s": []}


def _summary(acc: dict, n_queries: int) -> dict:
    out = _pct(acc["wall"])
    out["stages_p50_ms"] = {s: round(statistics.median(v), 3) for s, v in sorted(acc["stages"].items())}
    out["stages_sum_p50_ms"] = round(statistics.median(acc["stages_sum"]), 3)
    out["outside_stages_p50_ms"] = round(statistics.median(acc["outside_stages"]), 3)
    out["total_ms_p50"] = round(statistics.median(acc["total_ms"]), 3)
    out["block_ms_per_query"] = round(_ms(statistics.median(acc["block_s"])) / n_queries, 3)
    return out


def _breakdown(queries: list[dict], mode: str) -> dict:
    """Embedded, audit off: one pass of ``mode`` with every stage task timed (Celery's
    signals), then the tasks' own additions timed again on the same messages."""
    from celery import signals

    from pipeline.contracts import Batch
    from workers import audit
    from workers.api import _batch, _decode, search
    from workers.app import get_app
    from workers.tasks import LAST, HandedOn, _in

    app = get_app()
    tasks: list[tuple[str, float, object, object]] = []  # (name, wall s, message, returned)
    started: dict[str, tuple[float, object]] = {}

    def pre(task_id=None, task=None, args=None, **_):
        started[task_id] = (time.perf_counter(), args[0] if args else None)

    def post(task_id=None, task=None, retval=None, **_):
        t0, message = started.pop(task_id)
        tasks.append((task.name, time.perf_counter() - t0, message, retval))

    rows: list[dict[str, float]] = []
    signals.task_prerun.connect(pre, weak=False)
    signals.task_postrun.connect(post, weak=False)
    try:
        for q in queries:
            tasks.clear()
            t0 = time.perf_counter()
            r = search(q["text"], namespace=q.get("namespace"), mode=mode, origin="eval")
            wall = time.perf_counter() - t0
            row: dict[str, float] = {"wall": _ms(wall)}
            for stage, ms in r.timings.items():
                row[f"recorded.{stage}"] = ms
            row["recorded_sum"] = sum(r.timings.values())
            t = time.perf_counter()
            _batch([(q["text"], {"namespace": q.get("namespace"), "mode": mode, "origin": "eval"})])
            row["make_batch"] = _ms(time.perf_counter() - t)
            walls = 0.0
            final = None
            for name, secs, message, returned in list(tasks):
                stage = name.rpartition(".")[2]
                row[f"task.{stage}"] = _ms(secs)
                walls += secs
                t = time.perf_counter()
                if isinstance(message, list):
                    [_in(m, name) for m in message]
                else:
                    _in(message, name)
                row[f"validate.{stage}"] = _ms(time.perf_counter() - t)
                if isinstance(returned, HandedOn):  # handed to the next stage as it is: no JSON made
                    batch = returned.batch
                    row[f"serialise.{stage}"] = 0.0
                else:
                    batch = Batch.model_validate(returned)
                    t = time.perf_counter()
                    batch.model_dump(mode="json")
                    row[f"serialise.{stage}"] = _ms(time.perf_counter() - t)
                if name == LAST:
                    final = returned
                    t = time.perf_counter()
                    audit.emit(app, batch)
                    row["audit_emit"] = _ms(time.perf_counter() - t)
                recorded = sum(r.timings.get(k, 0.0) for k in RECORDED_BY.get(stage, (stage,)))
                row[f"task_other.{stage}"] = (row[f"task.{stage}"] - recorded - row[f"validate.{stage}"]
                                              - row[f"serialise.{stage}"] - (row["audit_emit"] if name == LAST else 0.0))
            row["task_walls"] = _ms(walls)
            t = time.perf_counter()
            _decode(final)
            row["decode"] = _ms(time.perf_counter() - t)
            row["canvas"] = row["wall"] - row["task_walls"] - row["make_batch"] - row["decode"]
            rows.append(row)
    finally:
        signals.task_prerun.disconnect(pre)
        signals.task_postrun.disconnect(post)
    keys = sorted({k for row in rows for k in row})
    return {k: {"mean_ms": round(statistics.fmean(row.get(k, 0.0) for row in rows), 3),
                "p50_ms": round(statistics.median(row.get(k, 0.0) for row in rows), 3)} for k in keys}


SYNTHETIC_QUERIES = 75  # what a synthetic store is asked, by default (the demo has 75)


def synthetic_store(work: Path, n: int, n_queries: int):
    """``--synthetic``: quiet logs, the process pointed at a synthetic lake of ``n``
    memories under ``work`` (built if absent); ``(settings, queries)``, ``n_queries`` of them."""
    import logging

    import workers
    from ops.bench import synth
    from ops.bench.writes import bench_settings, synthetic_lake

    logging.getLogger("dimple").setLevel(logging.WARNING)
    logging.getLogger("celery").setLevel(logging.WARNING)
    settings = bench_settings(synthetic_lake(work, n), direct=False)
    workers.configure(settings)
    texts = synth.queries_from_texts(synth.texts(n), n_queries)
    return settings, [{"text": t} for t in texts]


class Queries:
    """The query blocks the sides ask, each query with its place in ``pool``
    (``i``: the floor's prepared batches). The demo store: every block is the
    same set (``repeat``). A synthetic store: each block is the pool's next
    queries, asked nowhere else, so no side answers from what an earlier
    block read (a large store's candidates are mostly read for the first time)."""

    def __init__(self, pool: list[dict], repeat: bool):
        self.pool = [dict(q, i=i) for i, q in enumerate(pool)]
        self.repeat, self.at = repeat, 0

    def take(self, n: int) -> list[dict]:
        if self.repeat:
            return self.pool[:n]
        block, self.at = self.pool[self.at:self.at + n], self.at + n
        assert len(block) == n, "the pool is smaller than the blocks asked of it"
        return block


def run(work: Path, rounds: int, n_queries: int | None, warmup: int, embedded_only: bool,
        synthetic: int | None = None) -> dict:
    import workers
    from workers import audit
    from workers.api import search

    n_sides = len(FLOOR) + 2 * len(MODES) + (0 if embedded_only else len(MODES))
    if synthetic:
        per = n_queries or SYNTHETIC_QUERIES
        embedded, pool = synthetic_store(work, synthetic, per * (rounds * n_sides + len(MODES)) + warmup * n_sides)
        blocks = Queries(pool, repeat=False)
    else:
        embedded, pool = embedded_demo(work)
        per = min(n_queries or len(pool), len(pool))
        blocks = Queries(pool[:per], repeat=True)
    floor = Floor(blocks.pool)
    off, on = embedded.replace(audit_enabled=False), embedded.replace(audit_enabled=True)
    sides: list[tuple[str, str, object]] = [("floor", f, off) for f in FLOOR]
    sides += [(f"embedded.{a}", m, s) for a, s in (("audit_off", off), ("audit_on", on)) for m in MODES]
    stack = None
    try:
        if not embedded_only:
            from ops.stack import Stack
            from workers.app import app

            stack = Stack(work / "stack")
            stack.start_redis()
            broker = off.replace(broker_url=stack.broker_url)
            workers.configure(broker)  # the pings go through it
            stack.start_query_workers(app, "lat", {"DIMPLE_DATA_DIR": str(embedded.data_dir),
                                                   "DIMPLE_EMBEDDING_MODEL": embedded.embedding_model,
                                                   "DIMPLE_AUDIT_ENABLED": "false"})
            sides += [("broker", m, broker) for m in MODES]
        out: dict = {"store": str(embedded.data_dir), "synthetic": synthetic, "queries": per, "rounds": rounds,
                     "load_before": _load(), "load_per_round": []}
        acc: dict[tuple[str, str], dict] = {(g, m): _new() for g, m, _ in sides}
        floor_lat: dict[str, list[float]] = {f: [] for f in FLOOR}
        for group, what, settings in sides:  # warm-up: model, store, index, workers
            workers.configure(settings)
            if group == "floor":
                for q in blocks.take(warmup):
                    getattr(floor, what)(q["i"], q["text"])
            else:
                _whole(blocks.take(warmup), what, _new(), search)
        for r in range(rounds):
            turn = r % len(sides)
            for group, what, settings in sides[turn:] + sides[:turn]:
                workers.configure(settings)  # also drains the previous side's audit rows
                if group == "floor":
                    for q in blocks.take(per):
                        floor_lat[what].append(_ms(getattr(floor, what)(q["i"], q["text"])))
                    continue
                t0 = time.perf_counter()
                _whole(blocks.take(per), what, acc[(group, what)], search)
                if settings is on:
                    audit.flush(300)  # this block's rows written inside its time
                acc[(group, what)]["block_s"].append(time.perf_counter() - t0)
            out["load_per_round"].append(_load())
        workers.configure(off)
        out["floor"] = {f: _pct(v) for f, v in floor_lat.items()}
        out["embedded"] = {a: {m: _summary(acc[(f"embedded.{a}", m)], per) for m in MODES}
                           for a in ("audit_off", "audit_on")}
        out["broker"] = None if embedded_only else {m: _summary(acc[("broker", m)], per) for m in MODES}
        out["breakdown"] = {m: _breakdown(blocks.take(per), m) for m in MODES}
    finally:
        workers.configure(embedded)
        if stack is not None:
            stack.stop_all()
    out["load_after"] = _load()
    out["ratios"] = _ratios(out)
    return out


def _ratios(out: dict) -> dict:
    emb, e_off, e_on = out["floor"]["embed"]["p50_ms"], out["embedded"]["audit_off"], out["embedded"]["audit_on"]
    ratios = {
        "hybrid_over_embed_p50": round(e_off["hybrid"]["p50_ms"] / emb, 3),
        "hybrid_minus_embed_p50_ms": round(e_off["hybrid"]["p50_ms"] - emb, 3),
        "keyword_over_fulltext_leg_p50": round(e_off["keyword"]["p50_ms"] / out["floor"]["fulltext_leg"]["p50_ms"], 3),
        "semantic_minus_embed_p50_ms": round(e_off["semantic"]["p50_ms"] - emb, 3),
        "audit_on_over_off_p50": {m: round(e_on[m]["p50_ms"] / e_off[m]["p50_ms"], 3) for m in MODES},
        "audit_on_over_off_block": {m: round(e_on[m]["block_ms_per_query"] / e_off[m]["block_ms_per_query"], 3)
                                    for m in MODES},
    }
    if out["broker"] is not None:
        ratios["broker_extra_ms_p50"] = {m: round(out["broker"][m]["p50_ms"] - e_off[m]["p50_ms"], 3) for m in MODES}
    return ratios


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.latency", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/dimple-latency"), help="the demo store's folder")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--queries", type=int, default=0,
                   help=f"the first N demo queries (0: all), or N synthetic ones (0: {SYNTHETIC_QUERIES})")
    p.add_argument("--synthetic", type=int, default=0, metavar="N",
                   help="a synthetic store of N memories under --work instead of the demo store")
    p.add_argument("--warmup", type=int, default=10, help="untimed queries per side before the rounds")
    p.add_argument("--embedded-only", action="store_true", help="skip the broker side")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.queries < 0 or args.warmup < 0 or args.synthetic < 0:
        p.error("--rounds must be at least 1; --queries, --warmup and --synthetic at least 0")
    emit(run(args.work, args.rounds, args.queries or None, args.warmup, args.embedded_only, args.synthetic or None),
         args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
