"""``dimple eval``: run judged query sets through the real pipeline (embedded,
or on workers when ``DIMPLE_BROKER_URL`` is set), compare runs, replay the
audit log, sweep settings. The logic is in ``pipeline.evaluation``; this
module wires sources, stores, the search function and the output folder.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import workers
from pipeline import audit
from pipeline import evaluation as ev
from pipeline.contracts import Mode, Origin
from pipeline.datasets.beir import load_beir
from pipeline.datasets.locomo import load_locomo
from pipeline.errors import InputError
from pipeline.evaluation.models import Comparison, RunReport
from pipeline.evaluation.report import modes_lines, safe_name, write_comparison, write_modes, write_replay, write_run
from pipeline.store.lake.follow import reader_for
from pipeline.store.lake.store import copy_latest
from pipeline.store.maintenance import compact
from pipeline.store.tuned import overlay, read_tuned, write_tuned
from pipeline.store.vector import compile_kernels
from workers.api import search_many

from .common import (
    check_namespace,
    cli_settings,
    ingest_file,
    local_settings,
    prepare_search,
    require_store,
    store_exists,
)
from .demo import build_demo_store, demo_settings, load_queries

NO_PROGRESS_HELP = "no progress bar on stderr"
FORCE_HELP = "replace OUT/NAME whole when it already holds output of dimple eval (default: refuse)"
# what dimple eval writes at the top of a folder (run, --mode all, replay, compare and sweep)
_OUTPUTS = ("report.json", "modes.json", "replay.json", "compare.json")


def register(sub) -> None:
    """Add ``eval`` (and its compare / replay / sweep actions) to the ``dimple`` parser."""
    e = sub.add_parser(
        "eval", help="evaluate a judged query set; compare runs; replay the audit log; sweep settings",
        description="dimple eval (--queries FILE --qrels FILE | --beir DIR | --locomo FILE | --demo) --out DIR; "
                    "or dimple eval compare|replay|sweep ...",
    )
    _source_args(e)
    _run_args(e)
    e.set_defaults(func=cmd_eval)
    actions = e.add_subparsers(metavar="ACTION")

    c = actions.add_parser("compare", help="paired significance, gains and losses, rank changes between run folders")
    c.add_argument("runs", nargs="+", type=Path, help="run folders written by dimple eval; the first is the baseline")
    c.add_argument("--out", type=Path, required=True, help="folder the comparison is written to (as OUT/NAME)")
    c.add_argument("--name", help="output folder name (default: compare-<runs>)")
    c.add_argument("--force", action="store_true", help=FORCE_HELP)
    c.add_argument("--metric", default="ndcg@10", choices=ev.METRICS, help="metric of gains and losses")
    c.add_argument("--test", default="fisher", choices=("fisher", "student"),
                   help="paired test: fisher = randomised permutation (default), student = paired t-test")
    c.add_argument("--seed", type=int, default=42, help="seed of the permutation test")
    c.add_argument("--max-p", type=float, default=0.05, help="p-value below which a difference is significant (default 0.05)")
    c.add_argument("-k", type=int, default=10, help="depth of the rank-change statistics")
    c.set_defaults(func=cmd_compare)

    r = actions.add_parser("replay", help="re-run logged queries against the current store and settings")
    r.add_argument("--from-audit", action="store_true", required=True, help="replay rows of retrieval_log")
    r.add_argument("--since", help="ISO time (UTC) or an age such as 30m, 2h, 7d")
    r.add_argument("--limit", type=int, help="at most this many rows (oldest first)")
    r.add_argument("-k", type=int, default=10, help="depth of overlap@k and rank changes")
    r.add_argument("--out", type=Path, required=True, help="folder the replay report is written to (as OUT/NAME)")
    r.add_argument("--name", help="output folder name (default: replay-<time>)")
    r.add_argument("--force", action="store_true", help=FORCE_HELP)
    r.add_argument("--batch-size", type=int, help="queries per canvas (default DIMPLE_QUERY_BATCH_SIZE)")
    r.add_argument("--in-flight", type=int, default=8, help="batches on the workers at once (default 8)")
    r.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)
    r.set_defaults(func=cmd_replay)

    s = actions.add_parser("sweep", help="one run per configuration of a small grid, one report comparing them")
    _source_args(s)
    _run_args(s, with_mode=False)
    s.add_argument("--modes", help="comma list of keyword, semantic, hybrid")
    s.add_argument("--rrf-k", help="comma list of RRF constants, e.g. 10,60")
    s.add_argument("--weights", help="comma list of VECTOR:FTS leg weights, e.g. 1:1,0.5:1")
    s.add_argument("--beam-width", help="comma list of beam widths")
    s.add_argument("--max-leaf-items", help="comma list; each value rebuilds the tree in a temporary copy of the store")
    s.add_argument("--test", default="fisher", choices=("fisher", "student"),
                   help="paired test against the first configuration (default fisher)")
    s.add_argument("--seed", type=int, default=42, help="seed of the permutation test (default 42)")
    s.set_defaults(func=cmd_sweep)


def _source_args(p) -> None:
    g = p.add_argument_group("query set (one of)")
    g.add_argument("--queries", type=Path, help="JSONL queries (id, query, options); needs --qrels; runs on the configured store")
    g.add_argument("--qrels", type=Path, help="TREC (qid iter doc grade) or BEIR TSV (qid doc grade) judgments")
    g.add_argument("--beir", type=Path, help="a BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv), ingested into a store of its own")
    g.add_argument("--locomo", type=Path, help="LoCoMo locomo10.json, ingested into a store of its own")
    g.add_argument("--demo", action="store_true", help="the demo corpus and its judged queries")
    g.add_argument("--store", type=Path, help="data dir of the --beir/--locomo store (default: $DIMPLE_DATA_DIR/<set>)")
    g.add_argument("--strict", action="store_true", help="judgments for unknown queries or unjudged queries are errors, not skips")


def _run_args(p, with_mode: bool = True) -> None:
    p.add_argument("--out", type=Path, help="output folder; the run goes to OUT/NAME")
    p.add_argument("--name", help="run name (default: <set>-<mode>-<time>)")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    if with_mode:
        p.add_argument("--mode", help="keyword | semantic | hybrid for every query (default: each query's own, else "
                                      "hybrid); all: every mode on the same store, one table, and hybrid's paired "
                                      "test against each leg")
        p.add_argument("--test", default="fisher", choices=("fisher", "student"),
                       help="with --mode all: paired test of hybrid against each leg on per-query nDCG@10 "
                            "(fisher = randomised permutation, default; student = paired t-test)")
        p.add_argument("--seed", type=int, default=42, help="with --mode all: seed of the permutation test (default 42)")
        p.add_argument("--max-p", type=float, default=0.05,
                       help="with --mode all: p-value below which a difference is significant (default 0.05)")
    p.add_argument("--supersession", help="annotate | promote | hide for every query (default: each query's own, else promote)")
    p.add_argument("--fusion", help="rrf | convex for every query (default: each query's own, else DIMPLE_FUSION)")
    p.add_argument("--max-units", type=int, default=ev.DEFAULT_MAX_UNITS,
                   help=f"results per query unless a query says (default {ev.DEFAULT_MAX_UNITS}; Recall@50 needs 50)")
    p.add_argument("--batch-size", type=int, help="queries per canvas (default DIMPLE_QUERY_BATCH_SIZE)")
    p.add_argument("--in-flight", type=int, default=8,
                   help="batches on the workers at once, each with its own DIMPLE_TASK_TIMEOUT_S (default 8)")
    p.add_argument("--audit", action="store_true", help="embedded: write retrieval_log rows for the run's queries (off by default)")
    p.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)


def _check_numbers(args) -> None:
    """The numeric options every eval command may take, checked before any work; a
    --max-units that caps some metrics is said."""
    for name in ("batch_size", "in_flight", "max_units", "k"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise InputError("-k" if name == "k" else "--" + name.replace("_", "-"), "must be at least 1")
    max_units = getattr(args, "max_units", None)
    cut = [m for m in ev.METRICS if max_units is not None and ev.metrics.parse_metric(m)[1] > max_units]
    if cut:  # a user's choice, but one that quietly caps those figures
        print(f"dimple: note: --max-units {max_units} serves fewer results than {', '.join(cut)} read; "
              f"those figures count the first {max_units} only", file=sys.stderr)
    max_p = getattr(args, "max_p", None)
    if max_p is not None and not 0 < max_p <= 1:
        raise InputError("--max-p", f"must be a p-value above 0 and at most 1, not {max_p:g}")


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


def claim_folder(folder: Path, force: bool, remove: bool = True) -> Path:
    """``folder`` ready for one run's output: absent or empty, or with
    ``force`` one that dimple eval wrote, removed whole (a reused ``--name``
    mixed runs in one folder); anything else is refused. Called with
    ``remove`` False before any work (refuse early), then again, removing,
    once the run's input has been accepted."""
    if folder.exists() and not folder.is_dir():
        raise InputError("--name", f"{folder} is a file, not a folder: give another --name or --out")
    if not folder.is_dir() or not any(folder.iterdir()):
        return folder
    ours = any((folder / name).is_file() for name in _OUTPUTS) or any(
        (sub / "report.json").is_file() for sub in folder.iterdir() if sub.is_dir())
    if not ours:
        raise InputError("--name", f"{folder} exists and holds files dimple eval did not write: give another "
                                   f"--name or --out (--force replaces only dimple eval's own folders)")
    if not force:
        raise InputError("--name", f"{folder} already holds a run: give another --name, or --force to replace it whole")
    if remove:
        shutil.rmtree(folder)
    return folder


def _need_out(args) -> Path:
    if args.out is None:
        raise InputError("--out", "required: the folder the run is written to")
    return args.out


# -- sources ---------------------------------------------------------------------------------
def load_source(args, settings) -> tuple[ev.QuerySet, Any]:
    """The judged query set named on the command line and the settings whose
    store it runs against (dataset stores are built when absent)."""
    chosen = [n for n in ("queries", "beir", "locomo", "demo") if getattr(args, n)]
    if len(chosen) != 1:
        raise InputError("query set", "give exactly one of --queries FILE --qrels FILE, --beir DIR, --locomo FILE, --demo")
    source = chosen[0]
    if source == "queries":
        if args.qrels is None:
            raise InputError("--qrels", "required with --queries")
        queries = ev.read_queries(args.queries, settings)
        qrels = ev.read_qrels(args.qrels)
        _check_namespaces(args.queries, queries, settings)
        return ev.reconcile(args.queries.stem, queries, qrels, strict=args.strict), settings
    if source == "demo":
        run_settings = local_settings(demo_settings(settings), "eval --demo")
        raw, qrels = load_queries(build_demo_store(run_settings))
        queries = [ev.QuerySpec(q["id"], q["text"], {"namespace": q.get("namespace")} if q.get("namespace") else {})
                   for q in raw]
        return ev.reconcile("demo", queries, qrels, strict=args.strict), run_settings
    if source == "locomo":
        if not args.locomo.is_file():
            raise InputError("--locomo", f"no such file: {args.locomo}")
        try:
            loco = load_locomo(args.locomo)
        except KeyError as exc:
            raise InputError("--locomo", f"not a LoCoMo file: a conversation has no {exc} field") from None
        except (ValueError, TypeError) as exc:
            raise InputError("--locomo", f"not a LoCoMo file: {exc}") from None
        if not loco.records:
            raise InputError("--locomo", "not a LoCoMo file: it holds no conversation turn")
        run_settings = local_settings(settings.apart(args.store or settings.data_dir / "locomo"),
                                      "eval --locomo")
        _ensure_store(run_settings, loco.records, "locomo")
        queries = [ev.QuerySpec(q["id"], q["text"], {"namespace": q["namespace"]}) for q in loco.queries]
        qset = ev.reconcile("locomo", queries, loco.qrels, strict=args.strict)
        qset.loader_skipped = {f"locomo_{k}": v for k, v in loco.skipped.items() if v}
        return qset, run_settings
    records, queries, qrels = load_beir(args.beir)
    run_settings = local_settings(
        settings.apart(args.store or settings.data_dir / "beir" / (args.beir.resolve().name or "beir")),
        "eval --beir")
    _ensure_store(run_settings, records, "beir")
    return ev.reconcile(args.beir.resolve().name, queries, qrels, strict=args.strict), run_settings


def _check_namespaces(path: Path, queries: list[ev.QuerySpec], settings) -> None:
    """A query naming a namespace the store does not hold is refused, as by
    ``dimple search`` (embedded: through a broker the workers' store answers)."""

    asked = {q.options.get("namespace") for q in queries} - {None}
    if not settings.embedded or not asked:
        return
    reader = reader_for(settings)
    try:
        snap = reader.snapshot()
        held = snap.namespaces() if snap is not None else []
    finally:
        reader.close()
    for q in queries:
        try:
            check_namespace(held, q.options.get("namespace"))
        except InputError as exc:
            raise InputError(f"{path.name} query {q.id!r}: namespace", exc.reason) from None


def _ensure_store(settings, records: list[dict], what: str) -> None:
    """Ingest ``records`` into ``settings.data_dir`` unless a store built from
    them is there already. A store built from other records of the set (the
    dataset's files changed since) is brought up to date: new and changed
    records written, records no longer in the set forgotten."""

    path = settings.data_dir / f"{what}-records.jsonl"
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if store_exists(settings):
        if not path.is_file() or path.read_text(encoding="utf-8") == text:
            return  # the same records (or a store this command did not build: used as it is)
        before = {json.loads(line)["id"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
        gone = sorted(before - {r["id"] for r in records})
        print(f"the {what} set changed since its store in {settings.data_dir} was built: updating it "
              f"({len(records)} records, {len(gone)} no longer in the set) ...", file=sys.stderr, flush=True)
        fresh = path.with_name(path.name + ".new")  # the record of what the store holds moves only once it does
        fresh.write_text(text, encoding="utf-8")
        ingest_file(fresh, settings, progress=True, forget=gone)
        fresh.replace(path)
        return
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"building the {what} store in {settings.data_dir} ({len(records)} records) ...", file=sys.stderr, flush=True)
    ingest_file(path, settings, progress=True)


# -- running ----------------------------------------------------------------------------------
def _quiet() -> None:
    for name in ("dimple.search", "sentence_transformers", "transformers"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _progress(total: int, label: str, disabled: bool):
    # lazy: `dimple search` loads this module and must not load tqdm (tests/embedded/test_cli.py) (53 ms of import here)
    from tqdm import tqdm

    return tqdm(total=total, desc=label, unit="q", disable=True if disabled else None, file=sys.stderr)


def _config(settings, defaults: dict[str, Any], batch_size: int, extra: dict | None = None) -> dict[str, Any]:
    return {
        "via": "embedded" if settings.embedded else "broker",
        "defaults": defaults,
        "batch_size": batch_size,
        "rrf_k": settings.rrf_k,
        "fusion": settings.fusion,
        "weights": {"vector": settings.vector_weight, "fts": settings.fts_weight},
        "convex_alpha": settings.convex_alpha,
        "leg_top_k": settings.leg_top_k,
        "tree": settings.tree.model_dump(),
        "fulltext": settings.fulltext.model_dump(),
        "embedding_model": settings.embedding_model,
        "data_dir": str(settings.data_dir),
        **(extra or {}),
    }


def execute(qset: ev.QuerySet, settings, *, name: str, defaults: dict[str, Any], batch_size: int | None,
            progress: bool, extra_config: dict | None = None,
            in_flight: int = 8) -> tuple[RunReport, list[ev.QueryRun]]:
    """Point this process at ``settings``, run the set, score it: (report, per-query runs)."""

    workers.configure(settings)
    if settings.embedded:  # thousands of descents in this process: the compiled loops pay for themselves


        compile_kernels()
        # the store, index and query embedder load before the clock starts, as for one search, so
        # queries/s is the queries' rate (a mode run first paid them all, --mode all's figures said)
        first = qset.queries[0]
        prepare_search(settings, first.text, {**defaults, **first.options})
    size = batch_size or settings.query_batch_size
    with _progress(len(qset.queries), name, not progress) as bar:
        runs, secs = ev.run_queries(search_many, qset.queries, defaults=defaults, batch_size=size,
                                    in_flight=in_flight, progress=bar.update, origin=Origin.eval)
    extra = {"in_flight": in_flight, **(extra_config or {})}
    if settings.embedded:  # the settings the queries ran with: the store's tuned fusion included (dimple tune)
        tuned = read_tuned(settings) if settings.use_tuned else None
        settings = overlay(settings, tuned)
        extra["tuned_version"] = tuned.version if tuned is not None else None
    report = ev.evaluate_run(qset, runs, secs, config=_config(settings, defaults, size, extra), name=name)
    return report, runs


def _run_settings(settings, args):
    """Embedded eval queries write no audit rows unless asked (``--audit``)."""
    return settings if args.audit else settings.replace(audit_enabled=False)


def _defaults(args) -> dict[str, Any]:
    defaults: dict[str, Any] = {"max_units": args.max_units}
    if getattr(args, "mode", None):
        defaults["mode"] = args.mode
    for name in ("supersession", "fusion"):
        if getattr(args, name, None):
            defaults[name] = getattr(args, name)
    return defaults


def _say_skipped(qset: ev.QuerySet) -> None:
    for reason, count in qset.loader_skipped.items():
        print(f"dimple: skipped {reason.replace('_', ' ')}: {count}", file=sys.stderr)
    for reason, ids in qset.skipped.items():
        print(f"dimple: skipped {reason.replace('_', ' ')}: {len(ids)} ({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''})",
              file=sys.stderr)


def cmd_eval(args) -> int:
    out = _need_out(args)
    if args.name:  # before any store is built
        claim_folder(out / safe_name(args.name), args.force, remove=False)
    settings = cli_settings()
    _quiet()
    qset, run_settings = load_source(args, settings)
    _say_skipped(qset)
    run_settings = _run_settings(run_settings, args)
    defaults = _defaults(args)
    if not run_settings.embedded:
        print(f"through the broker: the workers must serve the store in {run_settings.data_dir}", file=sys.stderr)
    name = args.name or f"{qset.name}-{args.mode or 'asked'}-{_stamp()}"
    _check_numbers(args)
    folder = claim_folder(out / safe_name(name), args.force)
    if args.mode == ALL_MODES:
        return _eval_all_modes(args, qset, run_settings, folder, name)
    report, runs = execute(qset, run_settings, name=name, defaults=defaults, batch_size=args.batch_size,
                           progress=not args.no_progress, in_flight=args.in_flight)

    write_run(folder, report, ev.as_run(runs), qset.qrels, runs)
    m = report["metrics"]
    print(f"{name}: {report['answered']}/{report['queries']} queries, {report['queries_per_s']} q/s; "
          + ", ".join(f"{k} {v:.3f}" for k, v in m.items()))
    print(f"written to {folder}")
    return 1 if report["failed"] else 0


ALL_MODES = "all"


def _eval_all_modes(args, qset: ev.QuerySet, run_settings, root: Path, name: str) -> int:
    """``--mode all``: every mode on the same store, one after the other in
    this process, each in its own run folder under ``root`` (``OUT/NAME``), then one
    table and hybrid's paired test against each leg (``modes.json``)."""
    reports: dict[str, RunReport] = {}
    served: dict[str, dict[str, list[str]]] = {}
    versions: dict[str, int | None] = {}
    failed = False
    for mode in (m.value for m in Mode):
        defaults = {**_defaults(args), "mode": mode}
        report, runs = execute(qset, run_settings, name=mode, defaults=defaults, batch_size=args.batch_size,
                               progress=not args.no_progress, in_flight=args.in_flight)
        write_run(root / mode, report, ev.as_run(runs), qset.qrels, runs)
        reports[mode], served[mode] = report, ev.as_run(runs)
        seen = {r.store_version for r in runs if r.error is None}
        versions[mode] = seen.pop() if len(seen) == 1 else None
        failed = failed or bool(report["failed"])
    if len({v for v in versions.values()}) > 1:
        print(f"dimple: the store changed during the run (versions {versions}): the modes did not read the same store",
              file=sys.stderr)
        failed = True
    summary, comparisons = ev.against_legs(reports, served, qset.qrels, stat_test=args.test, seed=args.seed,
                                           max_p=args.max_p, store_versions=versions)
    write_modes(root, summary, comparisons)
    print(f"{name}: {summary['queries']} judged queries, every mode on one store ({run_settings.data_dir}):")
    print("\n".join(modes_lines(summary)))
    print(f"written to {root}")
    return 1 if failed else 0


def load_run_folder(folder: Path) -> tuple[RunReport, dict[str, list[str]], dict[str, dict[str, int]]]:
    """(report, run, qrels) of a folder written by ``dimple eval``."""
    for need in ("report.json", "run.trec", "qrels.trec"):
        if not (folder / need).is_file():
            raise InputError("RUN", f"{folder} is not a run folder (no {need})")
    try:
        report: RunReport = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError("RUN", f"{folder / 'report.json'}: not valid JSON ({exc.msg})") from None
    missing = sorted(set(RunReport.__required_keys__) - set(report)) if isinstance(report, dict) else ["(an object)"]
    if missing:
        raise InputError("RUN", f"{folder / 'report.json'} is not a dimple run report (missing {', '.join(missing)})")
    return report, ev.read_trec_run(folder / "run.trec"), ev.read_qrels(folder / "qrels.trec")


def cmd_compare(args) -> int:
    _check_numbers(args)
    if len(args.runs) < 2:
        raise InputError("RUN", "compare needs at least two run folders")
    loaded = [load_run_folder(f) for f in args.runs]
    qrels = loaded[0][2]
    for folder, (_, _, other) in zip(args.runs[1:], loaded[1:]):
        if other != qrels:
            raise InputError("RUN", f"{folder} was judged with other qrels than {args.runs[0]}")
    folder = claim_folder(args.out / safe_name(args.name or "compare-" + "-vs-".join(r["name"] for r, _, _ in loaded)),
                          args.force, remove=False)
    comparison = ev.compare([r for r, _, _ in loaded], [run for _, run, _ in loaded], qrels, metric=args.metric,
                            stat_test=args.test, seed=args.seed, max_p=args.max_p, k=args.k)
    write_comparison(claim_folder(folder, args.force), comparison)
    _print_comparison(comparison)
    print(f"written to {folder}")
    return 0


def _print_comparison(c: Comparison) -> None:
    for name in c["runs"]:
        print(f"{name}: " + ", ".join(f"{m} {v:.3f}" for m, v in c["metrics"][name].items()))
    for pair in c["pairs"]:
        w, t, l = pair["wins_ties_losses"]
        print(f"{pair['run']} vs {pair['baseline']}: {pair['metric']} {pair['mean_delta']:+.4f} "
              f"(p={pair['p_values'][pair['metric']]}, {c['stat_test']}), wins/ties/losses {w}/{t}/{l}, "
              f"overlap@{pair['rank_changes']['k']} {pair['rank_changes']['mean_overlap']}")


def parse_since(text: str | None, now: datetime | None = None) -> datetime | None:
    """``--since``: an ISO time (naive = UTC) or an age (``45s``, ``30m``, ``2h``, ``7d``); naive UTC out."""
    if text is None:
        return None
    now = now or datetime.now(UTC).replace(tzinfo=None)
    units = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
    if text[-1:] in units and text[:-1].replace(".", "", 1).isdigit():
        try:
            return now - timedelta(**{units[text[-1]]: float(text[:-1])})
        except OverflowError:  # e.g. 1000000d: before year 1
            raise InputError("--since", f"{text!r} reaches back before the year 1") from None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError("--since", f"{text!r} is neither an ISO time nor an age such as 30m, 2h, 7d") from None
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


def cmd_replay(args) -> int:
    settings = cli_settings()
    _quiet()
    _check_numbers(args)
    start = parse_since(args.since)
    if args.limit is not None and args.limit < 1:
        raise InputError("--limit", "must be at least 1")
    folder = claim_folder(args.out / safe_name(args.name or f"replay-{_stamp()}"), args.force, remove=False)
    records = audit.since(audit.log_of(settings), start, args.limit)
    if not records:
        raise InputError("--from-audit", f"no audit rows{' since ' + start.isoformat() if start else ''} in {audit.log_of(settings)}")
    # The replay's own queries are not logged embedded, so they never replay themselves.
    run_settings = settings.replace(audit_enabled=False) if settings.embedded else settings
    workers.configure(run_settings)
    with _progress(len(records), "replay", args.no_progress) as bar:
        report = ev.replay(search_many, records, k=args.k, batch_size=args.batch_size or settings.query_batch_size,
                           in_flight=args.in_flight, progress=bar.update)
    write_replay(claim_folder(folder, args.force), report)
    print(f"replayed {report['replayed']} of {report['rows']} logged queries: {report['changed']} changed, "
          f"{report['unchanged']} unchanged, mean overlap@{report['k']} {report['mean_overlap']}")
    for reason, info in report["skipped"].items():
        print(f"dimple: skipped {reason.replace('_', ' ')}: {info['count']}", file=sys.stderr)
    print(f"written to {folder}")
    return 1 if report["failed"] else 0


def _axes(args) -> dict[str, list[Any]]:
    axes: dict[str, list[Any]] = {}
    if args.modes:
        axes["mode"] = [Mode.parse(m.strip()).value for m in args.modes.split(",")]
    if args.rrf_k:
        axes["rrf_k"] = ev.parse_number_list(args.rrf_k, int, "--rrf-k")
    if args.weights:
        axes["weights"] = ev.parse_weights(args.weights)
    if args.beam_width:
        axes["beam_width"] = ev.parse_number_list(args.beam_width, int, "--beam-width")
    if args.max_leaf_items:
        axes["max_leaf_items"] = ev.parse_number_list(args.max_leaf_items, int, "--max-leaf-items")
    return axes


def tree_copy(settings, max_leaf_items: int, work: Path):
    """Settings on a temporary copy of the published store whose tree is
    rebuilt with ``max_leaf_items``; the user's store is only read."""

    require_store(settings)
    copy = settings.apart(work / f"leaf-{max_leaf_items}").replace(
        tree={**settings.tree.model_dump(), "max_leaf_items": max_leaf_items})
    copy.data_dir.mkdir(parents=True)
    copy_latest(settings, copy)  # the lake at its latest snapshot, into one of the copy's own
    tuned = read_tuned(settings)  # the copy fuses as the store does
    if tuned is not None:
        write_tuned(copy, tuned.settings, tuned.evidence)
    compact(copy, rebuild=True, wait=True)
    return copy


def cmd_sweep(args) -> int:
    out = _need_out(args)
    settings = cli_settings()
    _quiet()
    _check_numbers(args)
    grid = ev.sweep_grid(_axes(args))
    if args.name:  # before any store is built
        claim_folder(out / safe_name(args.name), args.force, remove=False)
    qset, base = load_source(args, settings)
    _say_skipped(qset)
    base = _run_settings(local_settings(base, "sweep", "the workers hold their own settings"), args)
    name = args.name or f"sweep-{qset.name}-{_stamp()}"
    root = claim_folder(out / safe_name(name), args.force)
    reports, runs = [], []
    with tempfile.TemporaryDirectory(prefix="dimple-sweep-") as tmp:
        copies: dict[int, Any] = {}
        for config in grid:
            cfg_settings, defaults = ev.apply_config(base, _defaults(args), config)
            if "max_leaf_items" in config and config["max_leaf_items"] != base.tree.max_leaf_items:
                leaf = config["max_leaf_items"]
                if leaf not in copies:
                    copies[leaf] = tree_copy(base, leaf, Path(tmp))
                cfg_settings = cfg_settings.replace(data_dir=copies[leaf].data_dir)
            cname = ev.config_name(config)
            report, detail = execute(qset, cfg_settings, name=cname, defaults=defaults, batch_size=args.batch_size,
                                     progress=not args.no_progress, extra_config={"sweep": config},
                                     in_flight=args.in_flight)
            write_run(root / safe_name(cname), report, ev.as_run(detail), qset.qrels, detail)
            reports.append(report)
            runs.append(ev.as_run(detail))
            print(f"{cname}: " + ", ".join(f"{k} {v:.3f}" for k, v in report["metrics"].items())
                  + f", {report['queries_per_s']} q/s")

        workers.configure(settings)  # release the temporary stores before they are removed
    if len(reports) > 1:
        comparison = ev.compare(reports, runs, qset.qrels, stat_test=args.test, seed=args.seed)
        write_comparison(root, comparison, title=f"Sweep `{name}`")
    print(f"written to {root}")
    return 0
