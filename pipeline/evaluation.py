"""Batch evaluation: query sets and judgments in, runs, metrics, comparisons
and audit-log replays out.

Everything here takes a *search function* (``search_many``-shaped: a list of
``{"query": ..., **options}`` in, one ``Results`` or exception per query out,
in order), so the same code runs embedded or through the broker and never
imports celery. Metrics are ranx's (Bassani 2022), one definition for
``dimple demo``, ``dimple eval`` and the benchmarks.

A run is ``{query_id: [doc_id, ...]}`` best first; qrels are
``{query_id: {doc_id: grade}}`` with grade > 0 relevant.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from .audit import AuditRecord, diff_served, replay_options
from .contracts import make_query
from .errors import DimpleError, InputError
from .settings import Settings

METRICS = ("ndcg@10", "recall@5", "recall@10", "recall@50", "mrr@10", "precision@5", "precision@10")
# Top-level fields of a query line besides the search options.
_QUERY_FIELDS = {"id", "_id", "query", "text", "options", "metadata"}
_OPTION_FIELDS = {
    "namespace", "topics", "content_type", "concepts", "mode", "weights", "recency_boost", "now",
    "max_units", "max_chars", "max_ms", "top_k",
}
DEFAULT_MAX_UNITS = 100  # Recall@50 needs at least 50 results; the search default is 10

SearchMany = Callable[..., list[Any]]


class EvalInputError(InputError):
    """A bad evaluation input: names the file, line and field."""

    def __init__(self, where: str, reason: str):
        super().__init__(where, reason)


class EvalFailed(DimpleError):
    """Every query of a run failed (broker down, timeouts): nothing to score."""


# -- inputs ------------------------------------------------------------------------------
@dataclass
class QuerySpec:
    """One query to run: its id, text and search options."""

    id: str
    text: str
    options: dict[str, Any] = field(default_factory=dict)

    def ask(self, defaults: dict[str, Any]) -> dict[str, Any]:
        return {"query": self.text, **defaults, **self.options}


@dataclass
class QuerySet:
    """Queries with judgments, and what was left out on the way (by reason)."""

    name: str
    queries: list[QuerySpec]
    qrels: dict[str, dict[str, int]]
    skipped: dict[str, list[str]] = field(default_factory=dict)
    loader_skipped: dict[str, int] = field(default_factory=dict)  # counted by a loader, without ids


def _json_line(path: Path, number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise EvalInputError(f"{path.name} line {number}", f"not valid JSON ({exc.msg} at column {exc.colno})") from None


def read_queries(path: Path, settings: Settings) -> list[QuerySpec]:
    """JSONL queries: ``{"id", "query" (or "text"), options...}`` per line.

    Options sit at the top level or under ``"options"`` (namespace, topics,
    content_type, concepts, mode, weights, recency_boost, now, max_units,
    max_chars, max_ms, top_k) and are validated as a search would validate
    them. Raises ``EvalInputError`` naming the line and field of the first
    problem; blank lines are ignored.
    """
    path = Path(path)
    if not path.is_file():
        raise EvalInputError(str(path), "no such file")
    out: list[QuerySpec] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        row = _json_line(path, number, line)
        if not isinstance(row, dict):
            raise EvalInputError(where, "each line must be a JSON object")
        unknown = sorted(set(row) - _QUERY_FIELDS - _OPTION_FIELDS)
        if unknown:
            raise EvalInputError(f"{where}: {unknown[0]}", "unknown field")
        qid = row.get("id", row.get("_id"))
        if not isinstance(qid, (str, int)) or isinstance(qid, bool) or not str(qid).strip():
            raise EvalInputError(f"{where}: id", "required (a non-empty string)")
        qid = str(qid)
        if any(c.isspace() for c in qid):
            raise EvalInputError(f"{where}: id", f"{qid!r} contains whitespace (TREC files split on it)")
        if qid in seen:
            raise EvalInputError(f"{where}: id", f"duplicate of line {seen[qid]}")
        seen[qid] = number
        text = row.get("query", row.get("text"))
        if not isinstance(row.get("options") or {}, dict):
            raise EvalInputError(f"{where}: options", "must be a JSON object")
        options = dict(row.get("options") or {})
        options.update({k: v for k, v in row.items() if k in _OPTION_FIELDS})
        try:
            make_query(text if text is not None else "", options, settings)
        except InputError as exc:
            name = "query" if exc.field == "query" and text is None else exc.field
            reason = "required" if text is None else exc.reason
            raise EvalInputError(f"{where}: {name}", reason) from None
        out.append(QuerySpec(qid, text, options))
    return out


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """TREC (``qid iter doc grade``) or BEIR TSV (``query-id corpus-id score``,
    header optional) relevance judgments. Raises ``EvalInputError`` naming the
    line and column of the first problem."""
    path = Path(path)
    if not path.is_file():
        raise EvalInputError(str(path), "no such file")
    qrels: dict[str, dict[str, int]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        where = f"{path.name} line {number}"
        if number == 1 and parts[0].lower() in ("query-id", "query_id", "qid"):
            continue  # BEIR header
        if len(parts) == 3:
            qid, doc, grade = parts
        elif len(parts) == 4:
            qid, _, doc, grade = parts
        else:
            raise EvalInputError(where, f"{len(parts)} columns; expected 4 (TREC: qid iter doc grade) or 3 (BEIR: qid doc grade)")
        try:
            value = int(grade) if grade.lstrip("-").isdigit() else int(float(grade))
        except ValueError:
            raise EvalInputError(f"{where}: relevance", f"{grade!r} is not an integer grade") from None
        qrels.setdefault(qid, {})[doc] = value
    return qrels


def reconcile(name: str, queries: list[QuerySpec], qrels: dict[str, dict[str, int]], strict: bool = False) -> QuerySet:
    """Keep the queries that have a relevant judgment; say what was left out.

    Skipped, by reason: ``qrels_for_unknown_queries`` (judgments naming no
    query of the set), ``queries_without_judgments`` and
    ``queries_without_relevant`` (judged, but every grade is 0). With
    ``strict`` the first two are errors. An empty result is always an error.
    """
    ids = {q.id for q in queries}
    unknown = sorted(q for q in qrels if q not in ids)
    unjudged = [q.id for q in queries if q.id not in qrels]
    no_relevant = [q.id for q in queries if q.id in qrels and not any(g > 0 for g in qrels[q.id].values())]
    if strict and unknown:
        raise EvalInputError("qrels", f"{len(unknown)} judged query id(s) not in the query set, first {unknown[0]!r}")
    if strict and unjudged:
        raise EvalInputError("queries", f"{len(unjudged)} query(ies) without judgments, first {unjudged[0]!r}")
    left_out = set(no_relevant)
    kept = [q for q in queries if q.id in qrels and q.id not in left_out]
    if not queries:
        raise EvalInputError("queries", "the query set is empty")
    if not kept:
        raise EvalInputError("qrels", "no query of the set has a relevant judgment: nothing to evaluate")
    skipped = {
        "qrels_for_unknown_queries": unknown,
        "queries_without_judgments": unjudged,
        "queries_without_relevant": no_relevant,
    }
    return QuerySet(name, kept, {q.id: qrels[q.id] for q in kept}, {k: v for k, v in skipped.items() if v})


def load_beir(folder: Path, split: str = "test") -> tuple[list[dict[str, Any]], list[QuerySpec], dict[str, dict[str, int]]]:
    """A BEIR folder: ``corpus.jsonl`` (``_id``, ``title``, ``text``) as ingest
    records in one namespace named after the folder, ``queries.jsonl`` and
    ``qrels/<split>.tsv``."""
    folder = Path(folder)
    for need in ("corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv"):
        if not (folder / need).is_file():
            raise EvalInputError(f"--beir {folder}", f"missing {need}")
    namespace = folder.name or "beir"
    records = []
    corpus = folder / "corpus.jsonl"
    for number, line in enumerate(corpus.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = _json_line(corpus, number, line)
        if not isinstance(row, dict) or not str(row.get("_id", "")).strip():
            raise EvalInputError(f"corpus.jsonl line {number}: _id", "required")
        content = " ".join(p for p in (str(row.get("title") or "").strip(), str(row.get("text") or "").strip()) if p)
        if not content:
            raise EvalInputError(f"corpus.jsonl line {number}: text", "title and text are both empty")
        records.append({"id": str(row["_id"]), "namespace": namespace, "content": content, "content_type": "text"})
    queries = []
    qfile = folder / "queries.jsonl"
    for number, line in enumerate(qfile.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = _json_line(qfile, number, line)
        if not isinstance(row, dict) or not str(row.get("_id", "")).strip():
            raise EvalInputError(f"queries.jsonl line {number}: _id", "required")
        if not str(row.get("text") or "").strip():
            raise EvalInputError(f"queries.jsonl line {number}: text", "required")
        queries.append(QuerySpec(str(row["_id"]), str(row["text"]), {"namespace": namespace}))
    return records, queries, read_qrels(folder / "qrels" / f"{split}.tsv")


# -- running -----------------------------------------------------------------------------
@dataclass
class QueryRun:
    """What one query got: ranked ids with scores, per-stage timings, or its error."""

    id: str
    ranked: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    total_ms: float = 0.0
    mode: str = ""
    error: str | None = None


def run_queries(
    search_many: SearchMany,
    queries: list[QuerySpec],
    *,
    defaults: dict[str, Any] | None = None,
    batch_size: int = 64,
    in_flight: int | None = 8,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[QueryRun], float]:
    """Run every query through ``search_many`` in batches; returns one
    ``QueryRun`` per query (in order) and the wall-clock seconds.

    At most ``in_flight`` batches are on the workers at once, each with its
    own timeout, so a set of any size fits. A batch that fails (timeout,
    broker lost) marks its queries failed instead of ending the run.
    """
    asks = [q.ask(defaults or {}) for q in queries]
    t0 = time.perf_counter()
    answers = search_many(asks, batch_size, return_exceptions=True, progress=progress, in_flight=in_flight)
    secs = time.perf_counter() - t0
    out = []
    for q, res in zip(queries, answers):
        if isinstance(res, Exception):
            out.append(QueryRun(q.id, error=f"{type(res).__name__}: {res}"))
            continue
        out.append(QueryRun(
            q.id, [r.id for r in res.results], [r.score for r in res.results], dict(res.timings), res.total_ms, res.mode
        ))
    return out, secs


def as_run(runs: Iterable[QueryRun]) -> dict[str, list[str]]:
    return {r.id: r.ranked for r in runs if r.error is None}


# -- metrics (ranx) ------------------------------------------------------------------------
def _ranx_run(run: dict[str, list[str]], name: str = "run"):
    from ranx import Run

    # Rank-derived scores (n, n-1, ...): ranx sorts by score, so ties in fused
    # scores must not reorder what was served.
    return Run({q: {d: float(len(docs) - i) for i, d in enumerate(docs)} for q, docs in run.items()}, name=name)


def _ranx_qrels(qrels: dict[str, dict[str, int]]):
    from ranx import Qrels

    return Qrels({q: dict(docs) for q, docs in qrels.items()})


def score(
    run: dict[str, list[str]], qrels: dict[str, dict[str, int]], metrics: Iterable[str] = METRICS
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """ranx's figures: (mean per metric, per query per metric) over the judged
    queries of ``qrels``; a judged query missing from the run scores 0."""
    from ranx import evaluate

    names = list(metrics)
    judged = {q: d for q, d in qrels.items() if any(g > 0 for g in d.values())}
    if not judged:
        return {m: 0.0 for m in names}, {}
    full = {q: run.get(q, []) for q in judged}
    answered = {q: docs for q, docs in full.items() if docs}
    per_query: dict[str, dict[str, float]] = {q: {m: 0.0 for m in names} for q in judged}
    if answered:
        ranx_run = _ranx_run(answered)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            evaluate(_ranx_qrels({q: judged[q] for q in answered}), ranx_run, names, save_results_in_run=True)
        for m in names:
            for q, v in ranx_run.scores[m].items():
                per_query[q][m] = float(v)
    means = {m: float(np.mean([per_query[q][m] for q in judged])) for m in names}
    return means, per_query


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    a = np.asarray(values, dtype=float)
    return {"n": int(a.size), "mean": round(float(a.mean()), 3), "p50": round(float(np.percentile(a, 50)), 3),
            "p95": round(float(np.percentile(a, 95)), 3), "p99": round(float(np.percentile(a, 99)), 3),
            "max": round(float(a.max()), 3)}


def latency(runs: list[QueryRun]) -> dict[str, dict[str, float]]:
    """Percentiles per stage (ms) over answered queries, and of ``total``
    (dispatch to results in hand). ``embed`` and ``augment`` are batch-wide:
    every query of a batch carries its batch's figure."""
    stages: dict[str, list[float]] = {}
    for r in runs:
        if r.error is not None:
            continue
        for stage, ms in r.timings.items():
            stages.setdefault(stage, []).append(ms)
        stages.setdefault("total", []).append(r.total_ms)
    return {stage: percentiles(v) for stage, v in sorted(stages.items())}


# -- one run's report ------------------------------------------------------------------------
def evaluate_run(
    qset: QuerySet,
    runs: list[QueryRun],
    seconds: float,
    *,
    config: dict[str, Any],
    name: str,
) -> dict[str, Any]:
    """The JSON report of one run: overall and per-query metrics, latency,
    throughput, what was skipped and which queries failed."""
    failed = {r.id: r.error for r in runs if r.error is not None}
    answered = [r for r in runs if r.error is None]
    if not answered:
        first = next(iter(failed.values()), "no queries")
        raise EvalFailed(f"every query of run {name!r} failed; first: {first}")
    run = as_run(runs)
    means, per_query = score(run, {q: qset.qrels[q] for q in run}, METRICS)
    by_id = {q.id: q for q in qset.queries}
    return {
        "name": name,
        "query_set": qset.name,
        "config": config,
        "queries": len(qset.queries),
        "answered": len(answered),
        "failed": failed,
        "skipped": {**{k: {"count": n, "ids": []} for k, n in qset.loader_skipped.items()},
                    **{k: {"count": len(v), "ids": v[:50]} for k, v in qset.skipped.items()}},
        "seconds": round(seconds, 3),
        "queries_per_s": round(len(runs) / seconds, 2) if seconds > 0 else None,
        "metrics": {m: round(v, 6) for m, v in means.items()},
        "per_query": {
            q: {"text": by_id[q].text, **{m: round(v, 6) for m, v in per_query[q].items()},
                "first_relevant_rank": first_relevant(run[q], qset.qrels[q])}
            for q in per_query
        },
        "latency_ms": latency(runs),
    }


def first_relevant(ranked: list[str], rels: dict[str, int]) -> int | None:
    for i, d in enumerate(ranked, start=1):
        if rels.get(d, 0) > 0:
            return i
    return None


_TREC_UNSAFE = re.compile(r"[%\s]")


def trec_id(memory_id: str) -> str:
    """A memory id as one TREC column: whitespace and ``%`` percent-encoded
    (UTF-8), so an id with a space cannot split a line. Run and qrels files
    written here encode alike, so they still match each other."""
    return _TREC_UNSAFE.sub(lambda m: urllib.parse.quote(m.group()), memory_id)


def trec_lines(run: dict[str, list[str]], name: str) -> list[str]:
    """TREC run lines ``qid Q0 doc rank score name``; scores are rank-derived so
    any TREC tool reads back the served order exactly."""
    out = []
    for q, docs in run.items():
        out += [f"{q} Q0 {trec_id(d)} {i} {len(docs) - i + 1} {name}" for i, d in enumerate(docs, start=1)]
    return out


def qrels_lines(qrels: dict[str, dict[str, int]]) -> list[str]:
    return [f"{q} 0 {trec_id(d)} {g}" for q, docs in qrels.items() for d, g in docs.items()]


def read_trec_run(path: Path) -> dict[str, list[str]]:
    """A TREC run file back into ``{qid: [doc, ...]}`` (sorted by score, then rank)."""
    rows: dict[str, list[tuple[float, int, str]]] = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 6:
            raise EvalInputError(f"{Path(path).name} line {number}", f"{len(parts)} columns; a TREC run line has 6")
        try:
            rows.setdefault(parts[0], []).append((-float(parts[4]), int(parts[3]), parts[2]))
        except ValueError:
            raise EvalInputError(f"{Path(path).name} line {number}", "rank and score must be numbers") from None
    return {q: [d for _, _, d in sorted(v)] for q, v in rows.items()}


# -- comparisons -------------------------------------------------------------------------------
def compare(
    reports: list[dict[str, Any]],
    runs: list[dict[str, list[str]]],
    qrels: dict[str, dict[str, int]],
    *,
    metric: str = "ndcg@10",
    stat_test: str = "fisher",
    seed: int = 42,
    max_p: float = 0.05,
    top: int = 10,
    k: int = 10,
) -> dict[str, Any]:
    """Compare runs of the same judged queries, the first being the baseline.

    Paired significance with ranx's ``compare`` (``fisher``: randomised
    permutation test with a fixed seed; or ``student``), over the queries every
    run answered; per other run, the queries that gained and lost most on
    ``metric`` and rank-change statistics of the top ``k`` against the baseline
    (``diff_served``: overlap@k, identical lists, moves).
    """
    from ranx import compare as ranx_compare

    names = [r["name"] for r in reports]
    if len(set(names)) != len(names):
        raise InputError("RUN", f"run names must differ: {names}")
    # Scored queries of every report (a query answered with no results has no
    # line in run.trec but is scored 0), as the reports scored them.
    common = sorted(set.intersection(*(set(r["per_query"]) for r in reports)) & set(qrels))
    runs = [{q: run.get(q, []) for q in common} for run in runs]
    if not common:
        raise InputError("RUN", "the runs share no judged query")
    metrics = list(METRICS)
    import numba

    threads = numba.get_num_threads()
    # ranx's permutation test seeds numba's RNG, which is per thread: one
    # thread makes the p-values reproducible for a given seed.
    numba.set_num_threads(1)
    try:
        _seed_numba_threads(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = ranx_compare(
                _ranx_qrels({q: qrels[q] for q in common}),
                [_ranx_run({q: run[q] for q in common if run[q]}, name) for run, name in zip(runs, names)],
                metrics=metrics, stat_test=stat_test, max_p=max_p, random_seed=seed, make_comparable=True,
            )
    finally:
        numba.set_num_threads(threads)
    table = report.to_dict()
    base_scores = reports[0]["per_query"]
    pairs = []
    for other, run in zip(reports[1:], runs[1:]):
        deltas = sorted(
            ((q, other["per_query"][q][metric] - base_scores[q][metric]) for q in common),
            key=lambda x: (x[1], x[0]),
        )
        diffs = [diff_served(runs[0][q], run[q], k) for q in common]
        firsts = [(first_relevant(runs[0][q], qrels[q]), first_relevant(run[q], qrels[q])) for q in common]
        better = sum(1 for a, b in firsts if b is not None and (a is None or b < a))
        worse = sum(1 for a, b in firsts if a is not None and (b is None or b > a))
        pairs.append({
            "baseline": names[0],
            "run": other["name"],
            "metric": metric,
            "mean_delta": round(float(np.mean([d for _, d in deltas])), 6),
            "p_values": {m: table[other["name"]]["comparisons"][names[0]][m] for m in metrics},
            "significant": {m: table[other["name"]]["comparisons"][names[0]][m] < max_p for m in metrics},
            "gained": [_delta_row(q, d, reports[0], other, metric)
                       for q, d in sorted(deltas, key=lambda x: (-x[1], x[0]))[:top] if d > 0],
            "lost": [_delta_row(q, d, reports[0], other, metric) for q, d in deltas[:top] if d < 0],
            "per_query_delta": {q: round(d, 6) for q, d in deltas},
            "wins_ties_losses": [sum(1 for _, d in deltas if d > 0), sum(1 for _, d in deltas if d == 0),
                                 sum(1 for _, d in deltas if d < 0)],
            "rank_changes": {
                "k": k,
                "mean_overlap": round(float(np.mean([d["overlap"] for d in diffs])), 4),
                "identical_lists": sum(1 for d in diffs if d["same"]),
                "mean_moved": round(float(np.mean([d["moved"] for d in diffs])), 3),
                "mean_abs_shift_of_moved": round(float(np.mean([d["mean_abs_shift"] for d in diffs if d["moved"]] or [0.0])), 3),
                "first_relevant_better": better,
                "first_relevant_worse": worse,
                "first_relevant_same": len(common) - better - worse,
            },
        })
    return {
        "runs": names,
        "queries": len(common),
        "stat_test": stat_test,
        "seed": seed,
        "max_p": max_p,
        "metrics": {n: {m: round(float(table[n]["scores"][m]), 6) for m in metrics} for n in names},
        "configs": {r["name"]: r.get("config", {}) for r in reports},
        "latency_ms": {r["name"]: r.get("latency_ms", {}) for r in reports},
        "queries_per_s": {r["name"]: r.get("queries_per_s") for r in reports},
        "pairs": pairs,
    }


def _seed_numba_threads(seed: int) -> None:
    """Seed numba's RNG in the thread(s) that run ranx's parallel permutations
    (ranx seeds only the calling thread's, so its p-values vary run to run)."""
    global _numba_seeder
    if _numba_seeder is None:
        from numba import njit, prange

        @njit(parallel=True)
        def seeder(value):  # pragma: no cover - compiled
            for _ in prange(1):
                np.random.seed(value)

        _numba_seeder = seeder
    _numba_seeder(seed)


_numba_seeder = None


def _delta_row(q: str, delta: float, base: dict, other: dict, metric: str) -> dict[str, Any]:
    return {"id": q, "text": base["per_query"][q].get("text", ""), "delta": round(delta, 6),
            "before": base["per_query"][q][metric], "after": other["per_query"][q][metric]}


# -- replay of the audit log ------------------------------------------------------------------
def replay(
    search_many: SearchMany,
    records: list[AuditRecord],
    *,
    k: int = 10,
    batch_size: int = 64,
    in_flight: int | None = 8,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Re-run logged queries with their recorded options against the current
    store and settings; per query, ``diff_served`` of what was served then
    against what is served now (top ``k``). Rows without query text are
    skipped (and counted)."""
    usable = [r for r in records if r.query_text is not None]
    skipped = [r.query_id for r in records if r.query_text is None]
    if not usable:
        raise EvalInputError("audit log", f"no replayable rows ({len(records)} row(s), {len(skipped)} without query text)")
    specs = [QuerySpec(r.query_id, r.query_text or "", replay_options(r)) for r in usable]
    runs, secs = run_queries(search_many, specs, batch_size=batch_size, in_flight=in_flight, progress=progress)
    rows = []
    for record, now in zip(usable, runs):
        before = [s["id"] for s in record.sources]
        if now.error is not None:
            rows.append({"query_id": record.query_id, "text": record.query_text, "error": now.error})
            continue
        diff = diff_served(before, now.ranked, k)
        rows.append({"query_id": record.query_id, "text": record.query_text, "logged_at": record.logged_at.isoformat(),
                     "mode": record.requested_mode, "before": before[:k], "after": now.ranked[:k], **diff})
    done = [r for r in rows if "error" not in r]
    changed = sorted((r for r in done if not r["same"]), key=lambda r: (r["overlap"], r["query_id"]))
    return {
        "k": k,
        "rows": len(records),
        "replayed": len(done),
        "failed": {r["query_id"]: r["error"] for r in rows if "error" in r},
        "skipped": {"no_query_text": {"count": len(skipped), "ids": skipped[:50]}} if skipped else {},
        "seconds": round(secs, 3),
        "changed": len(changed),
        "unchanged": len(done) - len(changed),
        "mean_overlap": round(float(np.mean([r["overlap"] for r in done])), 4) if done else None,
        "mean_moved": round(float(np.mean([r["moved"] for r in done])), 3) if done else None,
        "changed_queries": changed,
        "latency_ms": latency(runs),
    }


# -- sweeps ------------------------------------------------------------------------------------
SWEEP_AXES = ("mode", "rrf_k", "weights", "beam_width", "max_leaf_items")


def sweep_grid(axes: dict[str, list[Any]], limit: int = 64) -> list[dict[str, Any]]:
    """The product of the given axes (each a non-empty list), in order."""
    import itertools

    unknown = sorted(set(axes) - set(SWEEP_AXES))
    if unknown:
        raise InputError("sweep", f"unknown axis {unknown[0]!r}; valid: {', '.join(SWEEP_AXES)}")
    names = [a for a in SWEEP_AXES if axes.get(a)]
    grid = [dict(zip(names, values)) for values in itertools.product(*(axes[a] for a in names))]
    if len(grid) > limit:
        raise InputError("sweep", f"{len(grid)} configurations, over the limit of {limit}")
    return grid or [{}]


def config_name(config: dict[str, Any]) -> str:
    if not config:
        return "defaults"
    parts = []
    for key, value in config.items():
        if key == "weights":
            value = f"{value[0]:g}:{value[1]:g}"
        parts.append(f"{key}={value}")
    return ",".join(parts)


def apply_config(settings: Settings, defaults: dict[str, Any], config: dict[str, Any]) -> tuple[Settings, dict[str, Any]]:
    """Settings (validated copy) and per-query defaults for one sweep configuration."""
    changes: dict[str, Any] = {}
    tree = {}
    if "rrf_k" in config:
        changes["rrf_k"] = config["rrf_k"]
    if "weights" in config:
        changes["vector_weight"], changes["fts_weight"] = config["weights"]
    if "beam_width" in config:
        tree["beam_width"] = config["beam_width"]
    if "max_leaf_items" in config:
        tree["max_leaf_items"] = config["max_leaf_items"]
    if tree:
        changes["tree"] = {**settings.tree.model_dump(), **tree}
    asks = dict(defaults)
    if "mode" in config:
        asks["mode"] = config["mode"]
    return (settings.replace(**changes) if changes else settings), asks


def parse_number_list(text: str, kind: type, name: str) -> list[Any]:
    out = []
    for part in text.split(","):
        try:
            out.append(kind(part.strip()))
        except ValueError:
            raise InputError(name, f"{part.strip()!r} is not a {kind.__name__}") from None
    return out


def parse_weights(text: str) -> list[tuple[float, float]]:
    """``"1:1,0.5:1"`` -> ``[(1.0, 1.0), (0.5, 1.0)]`` (vector:fts)."""
    out = []
    for part in text.split(","):
        try:
            vector, fts = (float(x) for x in part.split(":"))
        except ValueError:
            raise InputError("--weights", f"{part!r} is not VECTOR:FTS (e.g. 0.5:1)") from None
        if vector < 0 or fts < 0 or vector + fts == 0 or math.isnan(vector + fts):
            raise InputError("--weights", f"{part!r}: weights are >= 0 and not both 0")
        out.append((vector, fts))
    return out
