"""The shapes of the evaluation reports: what ``evaluate_run``, ``compare`` and
``replay`` return, ``report`` writes as JSON and ``dimple eval`` prints.

They are ``TypedDict``s, not classes: the reports are JSON documents on disk
(``report.json``, ``compare.json``, ``replay.json``) that other tools read,
so the in-memory form is the JSON form, and mypy checks every key a reader
uses against these definitions.
"""

from __future__ import annotations

from typing import Any, TypedDict

# {stage: {"n", "mean", "p50", "p95", "p99", "max"}} in ms
Latency = dict[str, dict[str, float]]


class Skipped(TypedDict):
    count: int
    ids: list[str]


class RunReport(TypedDict):
    """One run of a judged query set (``report.json``)."""

    name: str
    query_set: str
    config: dict[str, Any]
    queries: int
    answered: int
    failed: dict[str, str]  # query id -> error
    skipped: dict[str, Skipped]  # reason -> what was skipped
    seconds: float
    queries_per_s: float | None
    metrics: dict[str, float]  # metric -> mean over judged queries
    per_query: dict[str, dict[str, Any]]  # query id -> text, metrics, first_relevant_rank
    latency_ms: Latency


class RankChanges(TypedDict):
    k: int
    mean_overlap: float
    identical_lists: int
    mean_moved: float
    mean_abs_shift_of_moved: float
    first_relevant_better: int
    first_relevant_worse: int
    first_relevant_same: int


class DeltaRow(TypedDict):
    id: str
    text: str
    delta: float
    before: float
    after: float


class Pair(TypedDict):
    """One run against the baseline."""

    baseline: str
    run: str
    metric: str
    mean_delta: float
    p_values: dict[str, float]
    significant: dict[str, bool]
    gained: list[DeltaRow]
    lost: list[DeltaRow]
    per_query_delta: dict[str, float]
    wins_ties_losses: list[int]
    rank_changes: RankChanges


class Comparison(TypedDict):
    """Runs of the same judged queries, the first the baseline (``compare.json``)."""

    runs: list[str]
    queries: int
    stat_test: str
    seed: int
    max_p: float
    metrics: dict[str, dict[str, float]]  # run -> metric -> mean
    configs: dict[str, dict[str, Any]]
    latency_ms: dict[str, Latency]
    queries_per_s: dict[str, float | None]
    pairs: list[Pair]


class ReplayReport(TypedDict):
    """Logged queries re-run against today's store and settings (``replay.json``)."""

    k: int
    rows: int
    replayed: int
    failed: dict[str, str]
    skipped: dict[str, Skipped]
    seconds: float
    changed: int
    changed_after_writes: int  # changed rows whose store version differs from now
    unchanged: int
    mean_overlap: float | None
    mean_moved: float | None
    changed_queries: list[dict[str, Any]]  # query id, text, before, after and diff_served's fields
    latency_ms: Latency


class LegTest(TypedDict):
    """``hybrid`` against one leg's mode over the same judged queries (``modes.json``)."""

    leg: str
    metric: str
    mean_delta: float  # hybrid - leg, per query, averaged
    p_value: float
    significant: bool
    wins_ties_losses: list[int]  # queries where hybrid is better / equal / worse
    p_values: dict[str, float]  # every metric's


class ModeComparison(TypedDict):
    """Every mode on one store in one run, and hybrid's paired test against each leg (``modes.json``)."""

    modes: list[str]
    queries: int
    store_versions: dict[str, int | None]  # mode -> the store version its queries read (one value: one store)
    stat_test: str
    seed: int
    max_p: float
    metrics: dict[str, dict[str, float]]  # mode -> metric -> mean
    queries_per_s: dict[str, float | None]
    tests: list[LegTest]
