"""Batch evaluation: query sets and judgments (``queries``), runs (``runs``), metrics
and paired tests (``metrics``), TREC files (``trec``), paired comparisons (``compare``), audit-log replay
(``replay``), sweeps (``sweep``) and written reports (``report``).
"""

from pipeline.evaluation.compare import against_legs, compare
from pipeline.evaluation.metrics import METRICS, paired_p_value, score
from pipeline.evaluation.queries import (
    OPTION_FIELDS,
    QuerySet,
    QuerySpec,
    json_line,
    read_qrels,
    read_queries,
    reconcile,
)
from pipeline.evaluation.replay import replay
from pipeline.evaluation.runs import (
    DEFAULT_MAX_UNITS,
    QueryRun,
    SearchMany,
    as_run,
    evaluate_run,
    first_relevant,
    latency,
    percentiles,
    run_queries,
)
from pipeline.evaluation.sweep import (
    SWEEP_AXES,
    apply_config,
    config_name,
    parse_number_list,
    parse_weights,
    sweep_grid,
)
from pipeline.evaluation.trec import qrels_lines, read_trec_run, trec_id, trec_lines

__all__ = [
    "OPTION_FIELDS",
    "QuerySpec",
    "QuerySet",
    "json_line",
    "read_queries",
    "read_qrels",
    "reconcile",
    "DEFAULT_MAX_UNITS",
    "SearchMany",
    "QueryRun",
    "run_queries",
    "as_run",
    "percentiles",
    "latency",
    "evaluate_run",
    "first_relevant",
    "METRICS",
    "paired_p_value",
    "score",
    "trec_id",
    "trec_lines",
    "qrels_lines",
    "read_trec_run",
    "compare",
    "against_legs",
    "replay",
    "SWEEP_AXES",
    "sweep_grid",
    "config_name",
    "apply_config",
    "parse_number_list",
    "parse_weights",
]
