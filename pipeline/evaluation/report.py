"""Writing evaluation outputs: the run folder (TREC run, qrels, JSON report,
Markdown summary, PNG plots). Plots use matplotlib's Agg backend: no display.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pipeline.evaluation.metrics import METRICS
from pipeline.evaluation.models import Comparison, Latency, ModeComparison, ReplayReport, RunReport, Skipped
from pipeline.evaluation.trec import qrels_lines, trec_lines

_NAME = re.compile(r"[^A-Za-z0-9._=,:+-]+")


def safe_name(name: str) -> str:
    """A folder name from a run or configuration name."""
    cleaned = _NAME.sub("_", name).strip("._") or "run"
    return cleaned[:120]


def _plt():
    import matplotlib  # only when a report draws a figure: matplotlib's import costs about a second

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display backend is tried

    return plt


def _save(plt, fig, path: Path) -> Path:
    """Lay out, write (PNG, 100 dpi) and close a figure; its path."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


# -- one run ----------------------------------------------------------------------------------
def write_run(folder: Path, report: RunReport, run: dict[str, list[str]], qrels: dict[str, dict[str, int]],
              runs_detail: list[Any] | None = None) -> dict[str, Path]:
    """``run.trec``, ``qrels.trec``, ``report.json``, ``summary.md`` and plots
    under ``folder`` (created)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "run": folder / "run.trec",
        "qrels": folder / "qrels.trec",
        "report": folder / "report.json",
        "summary": folder / "summary.md",
    }
    paths["run"].write_text("\n".join(trec_lines(run, safe_name(report["name"]))) + "\n", encoding="utf-8")
    paths["qrels"].write_text("\n".join(qrels_lines(qrels)) + "\n", encoding="utf-8")
    _write_json(paths["report"], report)
    paths.update(_run_plots(folder, report, runs_detail or []))
    paths["summary"].write_text(run_summary(report, paths), encoding="utf-8")
    return paths


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _metric_table(rows: dict[str, dict[str, float]]) -> list[str]:
    lines = ["| run | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    for name, m in rows.items():
        lines.append(f"| {name} | " + " | ".join(_fmt(m.get(k)) for k in METRICS) + " |")
    return lines


def _latency_table(latency: Latency) -> list[str]:
    lines = ["| stage | n | mean | p50 | p95 | p99 | max |", "|---|---|---|---|---|---|---|"]
    for stage, p in latency.items():
        lines.append(f"| {stage} | {p.get('n')} | " + " | ".join(_fmt(p.get(k)) for k in ("mean", "p50", "p95", "p99", "max")) + " |")
    return lines


def _skipped_lines(skipped: dict[str, Skipped], failed: dict[str, str]) -> list[str]:
    lines = []
    for reason, info in skipped.items():
        shown = ", ".join(info["ids"][:10]) + (", ..." if len(info["ids"]) > 10 else "")
        lines.append(f"- skipped, {reason.replace('_', ' ')}: {info['count']}" + (f" ({shown})" if shown else ""))
    if failed:
        lines.append(f"- failed: {len(failed)} query(ies), first {next(iter(failed))}: {next(iter(failed.values()))}")
    return lines or ["- nothing skipped, nothing failed"]


def run_summary(report: RunReport, paths: dict[str, Path]) -> str:
    lines = [f"# Evaluation run `{report['name']}`", "",
             f"Query set **{report['query_set']}**: {report['queries']} judged queries, {report['answered']} answered "
             f"in {report['seconds']:.1f} s ({report['queries_per_s']} queries/s).", "",
             "Configuration: `" + json.dumps(report["config"], sort_keys=True, default=str) + "`", "",
             "## Metrics", ""]
    lines += _metric_table({report["name"]: report["metrics"]})
    lines += ["", "## Latency per stage (ms)", "",
              "`embed` and `augment` are batch-wide (each query carries its batch's figure); "
              "`total` is dispatch to results in hand.", ""]
    lines += _latency_table(report["latency_ms"])
    lines += ["", "## Skipped and failed", ""] + _skipped_lines(report["skipped"], report["failed"])
    worst = sorted(report["per_query"].items(), key=lambda kv: (kv[1]["ndcg@10"], kv[0]))[:10]
    lines += ["", "## Lowest nDCG@10", "", "| query | nDCG@10 | first relevant rank | text |", "|---|---|---|---|"]
    lines += [f"| {q} | {v['ndcg@10']:.3f} | {v['first_relevant_rank']} | {v['text'][:80]} |" for q, v in worst]
    lines += ["", "## Files", ""] + [f"- `{p.name}`" for k, p in paths.items() if k != "summary"]
    return "\n".join(lines) + "\n"


def _run_plots(folder: Path, report: RunReport, runs_detail: list[Any]) -> dict[str, Path]:
    plt = _plt()
    out = {}
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(list(report["metrics"]), list(report["metrics"].values()), color="#4c72b0")
    ax.set_ylim(0, 1)
    ax.set_title(f"{report['name']}: metrics")
    out["plot_metrics"] = _save(plt, fig, folder / "metrics.png")

    out["plot_latency"] = folder / "latency.png"
    _latency_plot(out["plot_latency"], {report["name"]: runs_detail}, plt)

    fig, ax = plt.subplots(figsize=(8, 4))
    values = sorted(v["ndcg@10"] for v in report["per_query"].values())
    ax.plot(range(len(values)), values, color="#4c72b0")
    ax.set_xlabel("queries, sorted")
    ax.set_ylabel("nDCG@10")
    ax.set_title(f"{report['name']}: per-query nDCG@10")
    out["plot_per_query"] = _save(plt, fig, folder / "per_query.png")
    return out


def _latency_plot(path: Path, detail: dict[str, list[Any]], plt) -> None:
    """Box plots of per-query latency per stage, one panel per run."""
    fig, axes = plt.subplots(1, max(len(detail), 1), figsize=(min(6 * max(len(detail), 1), 24), 4), squeeze=False)
    for ax, (name, runs) in zip(axes[0], detail.items()):
        stages: dict[str, list[float]] = {}
        for r in runs:
            if getattr(r, "error", None) is None:
                for stage, ms in r.timings.items():
                    stages.setdefault(stage, []).append(ms)
                stages.setdefault("total", []).append(r.total_ms)
        if stages:
            ax.boxplot(list(stages.values()), showfliers=False)
            ax.set_yscale("symlog", linthresh=1)
            ax.set_xticks(range(1, len(stages) + 1), list(stages), rotation=30)
        ax.set_ylabel("ms")
        ax.set_title(name[:40])
    _save(plt, fig, path)


# -- comparisons ------------------------------------------------------------------------------
def write_comparison(folder: Path, comparison: Comparison, title: str = "Comparison") -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"report": folder / "compare.json", "summary": folder / "compare.md"}
    _write_json(paths["report"], comparison)
    plt = _plt()
    names = comparison["runs"]
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(METRICS) * max(len(names), 1) / 2), 4.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [comparison["metrics"][name][m] for m in METRICS]
        ax.bar([j + i * width for j in range(len(METRICS))], values, width, label=name[:40])
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(METRICS))], list(METRICS))
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.set_title("metrics by configuration")
    paths["plot_metrics"] = _save(plt, fig, folder / "metrics_by_run.png")

    if comparison["pairs"]:
        fig, ax = plt.subplots(figsize=(8, 4))
        for pair in comparison["pairs"]:
            deltas = sorted(pair["per_query_delta"].values())
            ax.plot(range(len(deltas)), deltas, label=f"{pair['run'][:40]} - {pair['baseline'][:20]}")
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xlabel("queries, sorted by delta")
        ax.set_ylabel(f"delta {comparison['pairs'][0]['metric']}")
        ax.legend(fontsize=7)
        ax.set_title("per-query delta against the baseline")
        paths["plot_delta"] = _save(plt, fig, folder / "per_query_delta.png")

    fig, ax = plt.subplots(figsize=(8, 4))
    p50 = [comparison["latency_ms"][n].get("total", {}).get("p50", 0) for n in names]
    p95 = [comparison["latency_ms"][n].get("total", {}).get("p95", 0) for n in names]
    ax.bar([i - 0.2 for i in range(len(names))], p50, 0.4, label="p50")
    ax.bar([i + 0.2 for i in range(len(names))], p95, 0.4, label="p95")
    ax.set_xticks(range(len(names)), [n[:25] for n in names], rotation=20, fontsize=7)
    ax.set_ylabel("total ms per query")
    ax.legend()
    ax.set_title("latency by configuration")
    paths["plot_latency"] = _save(plt, fig, folder / "latency_by_run.png")
    paths["summary"].write_text(comparison_summary(comparison, title), encoding="utf-8")
    return paths


def comparison_summary(c: Comparison, title: str) -> str:
    lines = [f"# {title}", "", f"{len(c['runs'])} runs over {c['queries']} judged queries every run answered; "
             f"baseline `{c['runs'][0]}`; paired test `{c['stat_test']}` (seed {c['seed']}), "
             f"marked * where p < {c['max_p']} against the baseline.", ""]
    sig = {p["run"]: p["significant"] for p in c["pairs"]}
    lines += ["| run | " + " | ".join(METRICS) + " | queries/s | p50 ms |", "|---|" + "---|" * (len(METRICS) + 2)]
    for name in c["runs"]:
        cells = [f"{c['metrics'][name][m]:.3f}" + ("*" if sig.get(name, {}).get(m) else "") for m in METRICS]
        p50 = c["latency_ms"].get(name, {}).get("total", {}).get("p50")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {c['queries_per_s'].get(name)} | {p50} |")
    for pair in c["pairs"]:
        rc = pair["rank_changes"]
        w, t, l = pair["wins_ties_losses"]
        lines += ["", f"## `{pair['run']}` against `{pair['baseline']}`", "",
                  f"{pair['metric']}: mean delta {pair['mean_delta']:+.4f}; wins/ties/losses {w}/{t}/{l}; "
                  f"p = {pair['p_values'][pair['metric']]}.", "",
                  f"Rank changes in the top {rc['k']}: mean overlap {rc['mean_overlap']}, identical lists "
                  f"{rc['identical_lists']}, mean moved {rc['mean_moved']} (mean shift {rc['mean_abs_shift_of_moved']}); "
                  f"first relevant rank better {rc['first_relevant_better']}, worse {rc['first_relevant_worse']}, "
                  f"same {rc['first_relevant_same']}.", ""]
        for label, rows in (("Gained most", pair["gained"]), ("Lost most", pair["lost"])):
            lines += [f"{label}:", ""]
            lines += [f"- `{r['id']}` {r['before']:.3f} -> {r['after']:.3f} ({r['delta']:+.3f}) {r['text'][:70]}" for r in rows] or ["- none"]
            lines.append("")
    return "\n".join(lines) + "\n"


# -- every mode on one store ----------------------------------------------------------------
_SHORT = {"ndcg@10": "nDCG@10", "recall@5": "R@5", "recall@10": "R@10", "recall@50": "R@50", "mrr@10": "MRR@10",
          "precision@5": "P@5", "precision@10": "P@10"}


def modes_lines(c: ModeComparison) -> list[str]:
    """``dimple eval --mode all`` as text: one table of every mode, then
    hybrid's paired test against each leg (what the command prints)."""
    head = f"  {'mode':<9} " + " ".join(f"{_SHORT.get(m, m):>7}" for m in METRICS) + f" {'queries/s':>10}"
    lines = [head]
    for mode in c["modes"]:
        qps = c["queries_per_s"].get(mode)
        lines.append(f"  {mode:<9} " + " ".join(f"{c['metrics'][mode][m]:>7.3f}" for m in METRICS)
                     + f" {qps if qps is not None else '-':>10}")
    if c["tests"]:
        t0 = c["tests"][0]
        test = "paired randomisation (Fisher) test" if c["stat_test"] == "fisher" else "paired t-test"
        lines += ["", f"hybrid against each leg: {test} on per-query {_SHORT.get(t0['metric'], t0['metric'])} over "
                      f"{c['queries']} queries (seed {c['seed']}); significant where p < {c['max_p']}:"]
        for t in c["tests"]:
            w, ties, losses = t["wins_ties_losses"]
            verdict = ("significantly " + ("better" if t["mean_delta"] > 0 else "worse")) if t["significant"] \
                else "not significant"
            lines.append(f"  hybrid - {t['leg']:<9} {t['mean_delta']:+.4f}  p={t['p_value']:.4f}  {verdict}  "
                         f"(hybrid better/equal/worse on {w}/{ties}/{losses} queries)")
    return lines


def write_modes(folder: Path, summary: ModeComparison, comparisons: dict[str, Comparison]) -> dict[str, Path]:
    """``modes.json`` and ``modes.md`` under ``folder``, and each leg's full
    comparison with hybrid in ``hybrid-vs-<leg>/`` (``write_comparison``)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"report": folder / "modes.json", "summary": folder / "modes.md"}
    _write_json(paths["report"], summary)
    for leg, comparison in comparisons.items():
        paths[f"compare_{leg}"] = folder / safe_name(f"hybrid-vs-{leg}")
        write_comparison(paths[f"compare_{leg}"], comparison, title=f"hybrid against {leg}")
    versions = sorted({str(v) for v in summary["store_versions"].values()})
    lines = ["# Every mode on one store", "",
             f"{len(summary['modes'])} modes over the same {summary['queries']} judged queries, "
             f"store version {', '.join(versions) or 'unknown'}.", "", "```"]
    lines += modes_lines(summary) + ["```", "", "Run folders: " + ", ".join(f"`{m}/`" for m in summary["modes"])
                                     + "; comparisons: " + ", ".join(f"`hybrid-vs-{leg}/`" for leg in comparisons)]
    paths["summary"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


# -- replay -----------------------------------------------------------------------------------
def write_replay(folder: Path, report: ReplayReport) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"report": folder / "replay.json", "summary": folder / "replay.md"}
    _write_json(paths["report"], report)
    lines = ["# Replay of the audit log", "",
             f"{report['replayed']} of {report['rows']} logged queries re-run against the current store and settings "
             f"({report['seconds']:.1f} s): **{report['changed']} changed**, {report['unchanged']} unchanged; "
             f"mean overlap@{report['k']} {report['mean_overlap']}, mean moved {report['mean_moved']}.", ""]
    for reason, info in report["skipped"].items():
        lines.append(f"- skipped, {reason.replace('_', ' ')}: {info['count']}")
    if report["failed"]:
        lines.append(f"- failed: {len(report['failed'])}")
    lines += ["", "## Changed queries (lowest overlap first)", ""]
    for row in report["changed_queries"][:50]:
        lines.append(f"- `{row['query_id']}` overlap@{report['k']} {row['overlap']:.2f} {row['text'][:70]!r}")
        lines += [f"  - {c}" for c in row["changes"][:10]]
    paths["summary"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.hist([r["overlap"] for r in report["changed_queries"]] or [1.0], bins=20, range=(0, 1))
    ax.set_xlabel(f"overlap@{report['k']} of the changed queries")
    ax.set_ylabel("queries")
    ax.set_title(f"replay: {report['changed']} of {report['replayed']} changed")
    paths["plot_overlap"] = _save(plt, fig, folder / "overlap.png")
    return paths
