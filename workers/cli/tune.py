"""``dimple tune``: choose the store's fusion settings from the user's own
judged queries (``pipeline.evaluation.tune``: legs once, every configuration
re-fused, k-fold cross-validation, the paired test) and, with ``--apply``,
store them (``pipeline.store.tuned``) when the expected gain is significant.
Runs embedded, in this process, on the store in ``DIMPLE_DATA_DIR``; workers
serving that data dir use stored settings from their next query on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import workers
from pipeline import evaluation as ev
from pipeline.errors import InputError, StoreError
from pipeline.evaluation import tune
from pipeline.store.tuned import read_tuned, where, write_tuned
from pipeline.store.vector import compile_kernels
from workers import resources

from .common import cli_settings, local_settings, prepare_search, require_store
from .eval import _check_namespaces, _quiet, _say_skipped

# ``--apply`` refused: the cross-validated gain is not significant (or not a gain)
EXIT_NOT_SIGNIFICANT = 3


def register(sub) -> None:
    """Add ``tune`` to the ``dimple`` parser."""
    t = sub.add_parser(
        "tune", help="choose the store's fusion settings from your judged queries (cross-validated); --apply stores them",
        description="dimple tune QUERIES QRELS [--folds K] [--metric ndcg@10] [--apply]; dimple tune --show | --reset",
    )
    t.add_argument("queries", nargs="?", type=Path, metavar="QUERIES",
                   help=f"JSONL queries (id, query, options), at least {tune.MIN_QUERIES} judged")
    t.add_argument("qrels", nargs="?", type=Path, metavar="QRELS",
                   help="TREC (qid iter doc grade) or BEIR TSV (qid doc grade) judgments")
    t.add_argument("--folds", type=int, default=tune.DEFAULT_FOLDS,
                   help=f"folds of the cross-validation (default {tune.DEFAULT_FOLDS})")
    t.add_argument("--metric", default="ndcg@10", choices=ev.METRICS, help="the figure tuned (default ndcg@10)")
    t.add_argument("--seed", type=int, default=tune.DEFAULT_SEED,
                   help=f"seed of the folds and of the permutation test (default {tune.DEFAULT_SEED})")
    t.add_argument("--max-p", type=float, default=tune.MAX_P,
                   help=f"--apply stores the choice only when p is below this (default {tune.MAX_P})")
    t.add_argument("--apply", action="store_true",
                   help=f"store the choice when the gain is significant (else exit {EXIT_NOT_SIGNIFICANT}, nothing stored)")
    t.add_argument("--strict", action="store_true", help="judgments for unknown queries or unjudged queries are errors")
    t.add_argument("--show", action="store_true", help="print the store's tuned settings and exit")
    t.add_argument("--reset", action="store_true", help="remove the store's tuned settings: the environment's apply again")
    t.set_defaults(func=cmd_tune)


def cmd_tune(args) -> int:
    settings = cli_settings()
    if args.show or args.reset:
        if args.queries is not None or args.apply:
            raise InputError("--show" if args.show else "--reset", "takes no QUERIES, QRELS or --apply")
        return _reset(settings) if args.reset else _show(settings)
    if args.queries is None or args.qrels is None:
        raise InputError("QUERIES" if args.queries is None else "QRELS", "required: dimple tune QUERIES QRELS")
    if not 0 < args.max_p <= 1:
        raise InputError("--max-p", f"must be a p-value above 0 and at most 1, not {args.max_p:g}")
    settings = local_settings(settings, "tune", "it tunes the store in this data dir; the workers read what --apply stores")
    _quiet()
    require_store(settings)
    queries = ev.read_queries(args.queries, settings)
    _check_namespaces(args.queries, queries, settings)
    qset = ev.reconcile(args.queries.stem, queries, ev.read_qrels(args.qrels), strict=args.strict)
    _say_skipped(qset)
    ids = tune.check_queries(qset, args.folds)

    workers.configure(settings.replace(audit_enabled=False))
    res = resources.current()
    effective = res.settings()  # the environment's, with the store's tuned values over them
    compile_kernels()
    defaults = {"max_units": ev.DEFAULT_MAX_UNITS}
    first = qset.queries[0]
    prepare_search(effective, first.text, {**defaults, **first.options})
    current = tune.current_config(effective)
    configs = [current, *(c for c in tune.GRID if c != current)]
    runs = tune.fused_runs(qset, effective, res, res.snapshot(), configs, defaults=defaults,
                           batch_size=effective.query_batch_size)
    result = tune.cross_validate(runs, current, ids, qset.qrels, metric=args.metric, k=args.folds, seed=args.seed)
    print("\n".join(_table(qset.name, result, settings.data_dir)))
    significant = result.significant(args.max_p)
    verdict = (f"significant (p < {args.max_p:g})" if significant
               else f"not significant (needs a gain with p < {args.max_p:g})")
    if not args.apply:
        print(f"{verdict}; --apply would {'store ' + result.chosen.name if significant else 'store nothing'}")
        return 0
    if not significant:
        print(f"dimple: tune: nothing applied: expected {args.metric} gain {result.gain:+.4f} with p={result.p_value:g} "
              f"is not significant (p < {args.max_p:g} needed); the store keeps {current.name}", file=sys.stderr)
        return EXIT_NOT_SIGNIFICANT
    if result.chosen == current:
        print(f"nothing to change: {current.name} is already the best on all queries")
        return 0
    stored = write_tuned(settings, result.chosen.tuned(), {**result.evidence(args.max_p), "query_set": qset.name})
    assert stored is not None
    print(f"applied: {result.chosen.name} (tuned version {stored.version}, {where(settings)}); every process "
          f"serving this store uses it from its next query ('dimple tune --reset' undoes it)")
    return 0


def _table(name: str, r: tune.TuneResult, data_dir: Path) -> list[str]:
    lines = [f"tune {name}: {r.queries} judged queries, {len(r.folds)} folds (seed {r.seed}), {r.metric}, "
             f"store {data_dir}",
             f"{'fold':<5} {'queries':>7}  {'chosen on the other folds':<26} {'held-out':>8} {'current':>8}"]
    for f in r.folds:
        lines.append(f"{f.index:<5} {f.queries:>7}  {f.chosen.name:<26} {f.held_out_mean:>8.4f} {f.current_mean:>8.4f}")
    lines.append(f"{'all':<5} {r.queries:>7}  {'':<26} {r.held_out_mean:>8.4f} {r.current_mean:>8.4f}  "
                 f"gain {r.gain:+.4f}, p={r.p_value:g} (paired, fisher)")
    lines.append(f"chosen on all queries: {r.chosen.name} ({r.metric} {r.chosen_mean:.4f}); current: {r.current.name}")
    return lines


def _show(settings) -> int:
    tuned = read_tuned(settings)
    if tuned is None:
        print(f"no tuned settings in {where(settings)}: fusion={settings.fusion}, convex_alpha={settings.convex_alpha:g}, "
              f"rrf_k={settings.rrf_k} from the environment")
        return 0
    print(json.dumps(tuned.model_dump(mode="json"), indent=2))
    if not settings.use_tuned:
        print("dimple: DIMPLE_USE_TUNED=false: this process does not use them", file=sys.stderr)
    return 0


def _reset(settings) -> int:
    try:
        had: str | None = f"tuned settings version {version}" if (version := _version(settings)) else None
    except StoreError:  # what this dimple cannot read is removed too (its error advises --reset)
        had = "tuned settings this dimple cannot read"
    write_tuned(settings, None)
    print(f"removed {had} from {where(settings)}" if had is not None
          else f"no tuned settings in {where(settings)}: nothing to remove")
    return 0


def _version(settings) -> int | None:
    tuned = read_tuned(settings)
    return tuned.version if tuned is not None else None
