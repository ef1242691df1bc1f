"""The ``dimple`` command line.

A user's mistake ends with one line on stderr and exit code 2; no stack trace.
"""

from __future__ import annotations

import argparse
import errno
import gc
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipeline import audit
from pipeline.audit.letters import drain_outbox
from pipeline.contracts import parse_leg_weights
from pipeline.embedders import model_identity
from pipeline.errors import AuditWriteError, DimpleError, IngestValidationError, InputError, problems
from pipeline.store.fulltext import query_terms
from pipeline.store.lake import erase as erasing
from pipeline.store.lake.follow import Follower, reader_for
from pipeline.store.maintenance import compact
from pipeline.store.reembed import reembed
from pipeline.store.stats import store_stats
from pipeline.store.tuned import overlay, read_tuned
from workers import resources
from workers.api import audit_row, explain, explain_miss, forget, replay_row, search
from workers.app import QUEUES, get_app
from workers.audit import flush as flush_audit
from workers.supervise import supervise

from .common import (
    cli_settings,
    ingest_file,
    ingest_via_broker,
    log_level,
    need_broker,
    no_store,
    prepare_search,
    require_store,
    setup_logging,
    snapshot_or_time,
)
from .demo import run_demo
from .eval import register as register_eval
from .mcp import register as register_mcp
from .migrate import register as register_migrate
from .render import format_compacted, format_explain, format_results, format_stats, format_why_not, one_line
from .tune import register as register_tune

EXIT_USER = 2
# stdout closed by its reader (``dimple stats | head``): 128 + SIGPIPE, the
# status a shell reports for a tool the signal ends, so pipefail sees it too
EXIT_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status (0, 1, 2 for a user's mistake, 130, 141)."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except BrokenPipeError:
        _drop_stdout()
        return EXIT_PIPE


def _drop_stdout() -> None:
    """Point stdout at devnull so nothing (buffered output at exit) writes to the
    closed pipe again (the Python docs' recipe for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (stdout replaced in-process)
        pass


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    args.own_process = argv is None  # the command line of this process, not a call from Python
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USER

    try:
        if getattr(args, "operator_log", False):  # worker, flower: DIMPLE_LOG_LEVEL
            setup_logging(log_level(args.verbose, cli_settings().log_level))
        else:
            setup_logging(log_level(args.verbose))
        return int(args.func(args) or 0)
    except IngestValidationError as exc:  # a line per error, each printable (``LineError``s escaped)
        print(f"dimple: {exc}", file=sys.stderr)
        return EXIT_USER
    except DimpleError as exc:
        print(f"dimple: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USER
    except ValidationError as exc:  # settings from the environment
        where, msg, _ = problems(exc)[0]
        print(f"dimple: error: setting {one_line(where)}: {one_line(msg.removeprefix('Value error, '))}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("dimple: interrupted", file=sys.stderr)
        return 130


class _Parser(argparse.ArgumentParser):
    """A bad argument is a user error like any other: one line, exit code 2 (no usage dump)."""

    def error(self, message: str):
        where = self.prog.removeprefix("dimple").strip()
        self.exit(EXIT_USER, f"dimple: error: {where + ': ' if where else ''}{one_line(message)}\n")


QUERY_ID_HELP = "a query id, or a unique prefix of one (at least 4 characters), as 'dimple audit tail' shows"
VERBOSE_HELP = "show INFO log lines (the per-query dimple.search line, model loading); -vv for DEBUG"


def subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers of ``parser``'s subcommands, one level down."""
    return [
        child
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for child in dict.fromkeys(action.choices.values())
    ]


def all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every parser below it."""
    return [parser] + [p for child in subparsers(parser) for p in all_parsers(child)]


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dimple", description="Hybrid retrieval for AI-agent memory.")
    p.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    sub = p.add_subparsers(metavar="COMMAND")

    s = sub.add_parser("ingest", help="ingest a JSONL file of memories")
    s.add_argument("file", type=Path, help="JSONL, one memory per line (id, namespace, content, ...); - reads standard input")
    s.add_argument("--skip-invalid", action="store_true", help="write the valid lines, report the rest")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.add_argument("--via-broker", action="store_true",
                   help="validate here, then send batches to the ingest queue (edges must point into the store or to "
                        "lines of the same batch or an earlier one)")
    s.set_defaults(func=cmd_ingest)

    s = sub.add_parser("forget", help="forget memories by id: gone from results and links at once, from every file within DIMPLE_STORE__ERASE_WITHIN")
    s.add_argument("ids", nargs="+", metavar="ID", help="memory ids to forget")
    s.add_argument("--reason", help="why: checked, and carried in the ingest.forget message (Flower shows it); the store keeps no reason, which could name what was forgotten")
    s.set_defaults(func=cmd_forget)

    s = sub.add_parser("compact", help="compact the lake now: a new base at the latest snapshot, and the erase of the forgets due")
    s.add_argument("--erase", action="store_true",
                   help="erase every forgotten memory now, however recent the forget (not only those due within "
                        "DIMPLE_STORE__ERASE_WITHIN); like every erase, it cuts time travel back to now")
    s.set_defaults(func=cmd_compact)

    s = sub.add_parser("reindex", help="rebuild the topic tree and the full-text index from scratch")
    s.set_defaults(func=cmd_reindex)

    s = sub.add_parser("reembed", help="embed every memory again with the configured DIMPLE_EMBEDDING_MODEL "
                                       "(after changing it; writes go on meanwhile)")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.set_defaults(func=cmd_reembed)

    s = sub.add_parser("stats", help="what the store holds")
    s.add_argument("--json", action="store_true", help="print the figures as JSON")
    s.set_defaults(func=cmd_stats)

    s = sub.add_parser("config", help="print the effective settings (secrets masked)")
    s.set_defaults(func=cmd_config)

    s = sub.add_parser("search", help="search the store")
    s.add_argument("query", help="the query text")
    s.add_argument("--namespace", help="search this namespace only ('dimple stats' lists them)")
    s.add_argument("--topic", action="append", default=[], help="topic key (repeatable)")
    s.add_argument("--content-type", action="append", default=[], help="content type (repeatable)")
    s.add_argument("--concept", action="append", default=[], help="concept filter (repeatable)")
    s.add_argument("--mode", default="hybrid", help="keyword | semantic | hybrid (default hybrid)")
    s.add_argument("--weights", metavar="VECTOR:FTS",
                   help="fixed leg weights, e.g. 0.5:1 (default in hybrid: per query, vector 1 and full text "
                        "DIMPLE_LEXICAL_MATCH_SCALE x m^DIMPLE_LEXICAL_MATCH_POWER, m = how well the best full-text "
                        "hit matches the query; DIMPLE_FUSION_WEIGHTS=fixed uses DIMPLE_VECTOR_WEIGHT:DIMPLE_FTS_WEIGHT)")
    s.add_argument("--top-k", type=int, metavar="N", help="candidates each leg hands to fusion (default DIMPLE_LEG_TOP_K)")
    s.add_argument("--max-units", type=int, metavar="N", help="at most N results (default DIMPLE_BUDGET__MAX_UNITS)")
    s.add_argument("--max-chars", type=int, metavar="N", help="at most N characters of content in all (default: no limit)")
    s.add_argument("--max-ms", type=int, metavar="MS", help="deadline in milliseconds; legs still running are cut (default: none)")
    s.add_argument("--recency-boost", type=float, default=0.0, help="weight of recency in the final score (default 0: off)")
    s.add_argument("--now", help="ISO time that recency is measured from (default: the query's start)")
    s.add_argument("--supersession",
                   help="a superseded result: annotate (link only), promote (its newest in-scope successor "
                        "directly above it; default), hide (the successor in its place)")
    s.add_argument("--fusion", help="rrf (weighted reciprocal rank fusion) | convex (weighted sum of min-max "
                                    "normalised scores) (default DIMPLE_FUSION, rrf)")
    s.add_argument("--min-version", type=int, metavar="V",
                   help="read-your-writes: answer from store version V or later (the `version` a write printed), "
                        "waiting at most DIMPLE_STORE__MIN_VERSION_WAIT_MS")
    s.add_argument("--as-of", type=snapshot_or_time, metavar="S|TIME",
                   help="lake engine: answer as the store was at snapshot S (a write's version) or at an "
                        "ISO 8601 TIME (UTC unless it says otherwise), memories forgotten since left out")
    s.add_argument("--json", action="store_true", help="print the results, legs and timings as JSON")
    s.set_defaults(func=cmd_search)

    s = sub.add_parser("audit", help="the retrieval log: tail, show, explain, failed, retry, purge")
    asub = s.add_subparsers(metavar="ACTION")
    a = asub.add_parser("tail", help="the last N rows")
    a.add_argument("-n", type=int, default=10, help="how many rows (default 10)")
    a.add_argument("--json", action="store_true", help="one JSON row per line")
    a.set_defaults(func=cmd_audit_tail)
    a = asub.add_parser("show", help="one row in full (JSON)")
    a.add_argument("query_id", help=QUERY_ID_HELP)
    a.set_defaults(func=cmd_audit_show)
    a = asub.add_parser("explain", help="why each result was served, and whether a re-run gives the same list")
    a.add_argument("query_id", help=QUERY_ID_HELP)
    a.add_argument("--no-replay", action="store_true", help="do not re-run the query")
    a.add_argument("--why-not", metavar="MEMORY_ID", help="why this memory was not returned: the stage that dropped "
                                                          "it and the numbers behind it (the query replayed here, "
                                                          "stage by stage)")
    a.add_argument("--json", action="store_true", help="print the explanation as JSON")
    a.set_defaults(func=cmd_audit_explain)
    a = asub.add_parser("failed", help="rows whose writes ran out of retries (dead letters)")
    a.set_defaults(func=cmd_audit_failed)
    a = asub.add_parser("retry", help="write the dead letters now (once each), and outbox rows whose message was lost")
    a.set_defaults(func=cmd_audit_retry)
    a = asub.add_parser("purge", help="delete every row holding a (forgotten) memory's id or a text, and rewrite the log")
    a.add_argument("ids", nargs="*", metavar="ID", help="memory ids: rows that served them go")
    a.add_argument("--text", action="append", default=[], help="rows whose query text (or any field) holds it go "
                                                               "(ignoring case; repeatable)")
    a.set_defaults(func=cmd_audit_purge)
    s.set_defaults(func=lambda args, parser=s: (parser.print_help(), EXIT_USER)[1])

    s = sub.add_parser("worker", help="start a Celery worker (all queues unless named)")
    s.add_argument("--queues", default=",".join(("embed", "search", "audit", "ingest")),
                   help="comma list of embed, search, audit, ingest")
    s.add_argument("--concurrency", type=int, help="processes (default: DIMPLE_WORKER_CONCURRENCY or one per core)")
    s.add_argument("--name", default=None, help="node name (default: dimple-<queues>@%%h)")
    s.add_argument("--no-restart", action="store_true",
                   help="run the worker in this process; by default it runs as a child that is started "
                        "again whenever it dies (workers/supervise.py)")
    s.set_defaults(func=cmd_worker, operator_log=True)

    s = sub.add_parser("flower", help="start Flower with basic auth (DIMPLE_FLOWER_USER / DIMPLE_FLOWER_PASSWORD)")
    s.add_argument("--insecure", action="store_true", help="allow starting without authentication")
    s.set_defaults(func=cmd_flower, operator_log=True)

    s = sub.add_parser("demo", help="build the demo store, run its queries, show results and quality")
    s.add_argument("--rebuild", action="store_true", help="rebuild the demo store even if present")
    s.set_defaults(func=cmd_demo)


    register_eval(sub)
    register_tune(sub)
    register_mcp(sub)
    register_migrate(sub)
    # -v works before or after the subcommand: each subcommand takes it too
    # (suppressed when absent, so it never resets a -v given before it)
    for child in all_parsers(p)[1:]:
        child.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=VERBOSE_HELP)
    return p


# -- ingest / reindex / stats / config --------------------------------------------
def cmd_ingest(args) -> int:
    settings = cli_settings()
    if args.via_broker:
        failed = 0
        for batch in ingest_via_broker(args.file, settings, skip_invalid=args.skip_invalid):
            if args.json:
                print(json.dumps(batch))
            elif batch["ok"]:
                print(f"lines {batch['first_line']}-{batch['first_line'] + batch['lines'] - 1}: "
                      f"{batch['inserted']} new, {batch['updated']} updated, {batch['unchanged']} unchanged, "
                      f"store version {batch['version']}")
            else:
                failed += 1
                print(f"lines {batch['first_line']}-{batch['first_line'] + batch['lines'] - 1}: rejected", file=sys.stderr)
                for err in batch["errors"]:
                    print(f"  {one_line(str(err))}", file=sys.stderr)
                if "not_sent" in batch:
                    print(f"nothing after it was sent ({batch['not_sent']}); ingest upserts by id: fix the lines "
                          "and send the file again", file=sys.stderr)
        return EXIT_USER if failed else 0
    report = ingest_file(args.file, settings, skip_invalid=args.skip_invalid, progress=not args.json)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        written = report.inserted + report.updated
        print(
            f"ingested {'standard input' if str(args.file) == '-' else args.file}: {report.inserted} new, {report.updated} updated, {report.unchanged} unchanged, "
            f"{report.embedded} embedded in {report.seconds['total']:.1f}s; "
            + (f"store version {report.version}" if written
               else f"nothing to write, store version {report.version} kept" if report.version
               else "nothing to write: no store was created")
        )
        for line in report.skipped:
            print(f"skipped {line}")
    return 0


def cmd_forget(args) -> int:
    settings = cli_settings()
    if settings.embedded:
        require_store(settings)
    report = forget(args.ids, reason=args.reason)
    print(f"forgot {report.forgotten} memor{'y' if report.forgotten == 1 else 'ies'} (store version {report.version})"
          + (f"; not in the store: {', '.join(report.not_found)}" if report.not_found else ""))
    return 0


def cmd_compact(args) -> int:
    settings = cli_settings()
    require_store(settings)
    report = compact(settings, wait=True, erase=args.erase)
    print(format_compacted(report))
    return 0


def cmd_reindex(args) -> int:
    settings = cli_settings()
    require_store(settings)
    t0 = time.perf_counter()
    report = compact(settings, rebuild=True, wait=True)
    print(f"reindexed: a new base with every namespace clustered again and the index rebuilt in "
          f"{time.perf_counter() - t0:.1f}s (store version {report.version})")
    return 0


def cmd_reembed(args) -> int:
    settings = cli_settings()
    require_store(settings)
    report = reembed(settings, progress=not args.json)
    if args.json:
        print(json.dumps(asdict(report)))
        return 0
    was_model, was_dim = report.previous
    print(f"re-embedded {report.memories} memories with {report.model} ({report.dim}-d; was {was_model}, "
          f"{was_dim}-d) in {report.seconds['total']:.1f}s ({report.seconds['embed']:.1f}s embedding), "
          f"store version {report.version}")
    return 0


def cmd_stats(args) -> int:
    settings = cli_settings()
    require_store(settings)
    reader = reader_for(settings)  # the base and its deltas as one consistent snapshot
    try:
        snap = reader.snapshot()
        if snap is None or snap.store is None:
            raise no_store(settings)
        stats = store_stats(snap.store, snap.overlay)
        deltas = list(snap.deltas.values())
        stats["segments"] = {"version": snap.version, "deltas": len(deltas),
                             "delta_memories": sum(len(d.memories) for d in deltas),
                             "delta_forgotten": sum(len(d.forget) for d in deltas)}
        stats["erase"] = _erase_stats(reader.lake, settings)
    finally:
        reader.close()
    if args.json:
        print(json.dumps(stats, indent=2, default=str))
        return 0
    print(format_stats(stats, settings.embedding_model, model_identity(settings.embedding_model)))
    return 0


def _erase_stats(source, settings) -> dict | None:
    """The forgets waiting to be erased, for ``dimple stats`` (times ISO 8601, UTC)."""
    state = source.erase_state() if isinstance(source, Follower) else None
    if state is None:
        return None

    def iso(at: datetime | None) -> str | None:
        return at.isoformat(timespec="seconds") if at is not None else None

    due_from = erasing.due_from(state.oldest, settings.store.erase_within) if state.oldest is not None else None
    return {"waiting": state.waiting, "oldest": iso(state.oldest), "due_from": iso(due_from),
            "held_until": iso(state.held_until)}


def cmd_config(args) -> int:
    settings = cli_settings()
    settings = overlay(settings, read_tuned(settings))  # as the store's queries run (dimple tune)
    print(json.dumps(settings.masked(), indent=2, default=str))
    return 0


# -- search ------------------------------------------------------------------------
def search_options(args) -> dict[str, Any]:
    options: dict[str, Any] = {
        "namespace": args.namespace,
        "topics": args.topic,
        "content_type": args.content_type,
        "concepts": args.concept,
        "mode": args.mode,
        "recency_boost": args.recency_boost,
    }
    for name in ("top_k", "max_units", "max_chars", "max_ms", "now", "supersession", "fusion", "min_version", "as_of"):
        value = getattr(args, name)
        if value is not None:
            options[name] = value
    if args.weights is not None:
        vector, fts = parse_leg_weights(args.weights, "--weights")
        options["weights"] = {"vector": vector, "fts": fts}
    return options


def one_query_process() -> None:
    """Set up a ``dimple search`` process of its own (never a ``main`` called
    from Python) for its one query, before anything binds a DuckDB parameter:

    - no pandas: DuckDB imports it on the first bound parameter (0.4 s here,
      more on a busy machine) only to recognise pandas values among
      parameters, which a search never binds; marked absent, it is skipped;
    - one BLAS thread: one query's matrices are small, and on a small, busy
      machine one thread embeds it several times faster than one per core
      (pipeline/minilm.py);
    - no cyclic garbage collection: the process ends after its query, and a
      full collection after loading (``workers.resources._Frozen``, what a
      serving process does) would cost it ~65 ms for nothing.
    """
    sys.modules.setdefault("pandas", None)  # type: ignore[arg-type]
    gc.disable()

    from pipeline.minilm import limit_blas_threads  # numpy with it

    limit_blas_threads(1)


def cmd_search(args) -> int:
    settings = cli_settings()
    options = search_options(args)
    if getattr(args, "own_process", False):
        one_query_process()
    prepare_search(settings, args.query, options)  # start-up and model loading stay off the query's clock

    results = search(args.query, **options)
    if args.json:
        print(results.model_dump_json(indent=2))
    else:
        print(format_results(results))
        if not results.results and results.legs.get("fts", {}).get("ran") and settings.embedded \
                and not _query_terms(settings, args.query):
            print(f"hint: every word of {args.query!r} is a stopword (DIMPLE_FULLTEXT__STOPWORDS="
                  f"{settings.fulltext.stopwords}), which the full-text leg leaves out; the vector leg "
                  "(--mode hybrid or semantic) still reads it", file=sys.stderr)
    return 0


def _query_terms(settings, text: str) -> list[str]:
    """The terms the full-text leg searches for ``text`` (its tokenizer,
    stopwords and stemmer), read from this process's store."""
    with resources.current().view() as view:
        if view is None or view.cursor is None:
            return [text]  # no index to ask: no hint
        return query_terms(view.cursor, text, settings.fulltext)


# -- audit ---------------------------------------------------------------------------
def cmd_audit_tail(args) -> int:
    if args.n < 1:
        raise InputError("-n", "must be at least 1")
    settings = cli_settings()
    rows = audit.tail(audit.log_of(settings), args.n)
    for row in rows:
        if args.json:
            print(row.model_dump_json())
        else:
            cut = f" truncated by {row.truncation['by']}" if row.truncated and row.truncation else ""
            text = (row.query_text or "<text not stored>")[:60]
            print(f"{row.logged_at:%Y-%m-%d %H:%M:%S} {row.query_id} {row.mode:<8} {row.result_count:>3} results "
                  f"{row.total_ms:>8.1f} ms{cut}  {text!r}")
    return 0


def cmd_audit_show(args) -> int:
    print(audit_row(args.query_id).model_dump_json(indent=2))
    return 0


def cmd_audit_explain(args) -> int:
    if args.why_not is not None:
        if args.no_replay:
            raise InputError("--no-replay", "--why-not replays the query: leave --no-replay out")
        try:
            answer = explain_miss(args.query_id, args.why_not)
        except InputError as exc:
            if exc.field != "memory_id":
                raise
            raise InputError("--why-not", exc.reason) from None
        print(answer.model_dump_json(indent=2) if args.json else format_why_not(answer))
        return 0
    if args.json:
        print(json.dumps(explain(args.query_id, replay=not args.no_replay), indent=2, default=str))
        return 0
    row = audit_row(args.query_id)
    print(format_explain(row, audit.explain(row), None if args.no_replay else replay_row(row)))
    return 0


def cmd_audit_failed(args) -> int:
    settings = cli_settings()
    letters, unreadable = audit.scan_dead_letters(settings.dead_letter_dir)
    for _, error, row in letters:
        print(f"{row.query_id} {row.logged_at:%Y-%m-%d %H:%M:%S} {error}")
    for path, where in unreadable:
        print(f"{path.name}: not an audit row ({where}); 'dimple audit retry' moves it to invalid/")
    print(f"{len(letters)} audit row(s) waiting in {settings.dead_letter_dir}"
          + (f", {len(unreadable)} file(s) that are not audit rows" if unreadable else ""))
    return 0


def cmd_audit_retry(args) -> int:
    settings = cli_settings()
    written, present, errors = audit.retry_dead_letters(settings.dead_letter_dir, audit.log_of(settings))
    try:  # rows whose message was lost and no audit worker has written yet
        files, rows = drain_outbox(settings.audit_outbox_dir, settings.dead_letter_dir,
                                   lambda records: audit.write_records(audit.log_of(settings), records),
                                   older_than_s=settings.audit_outbox_after_s)
    except AuditWriteError as exc:
        errors.append(f"outbox: {exc}")
        files = rows = 0
    if files:
        print(f"written {rows} row(s) from {files} outbox file(s)")
    print(f"written {written}, already present {present}, still failing {len(errors)}")
    for e in errors:
        print(f"  {e}", file=sys.stderr)
    return 1 if errors else 0


def cmd_audit_purge(args) -> int:
    settings = cli_settings()
    flush_audit()  # rows this process still holds go in first, and its writer lets go of the log
    log = audit.log_of(settings)
    done = audit.purge(log, settings.audit_outbox_dir, settings.dead_letter_dir, args.ids, args.text)
    afresh = " (their bytes leave the lake's files at its next erase)" if isinstance(log, audit.LakeLog) \
        else " (the file written afresh)"
    print(f"purged {done.rows} audit row(s) from {log}" + (afresh if done.rows else "")
          + f", {done.outbox_rows} from the outbox, {done.dead_letters} dead letter(s)")
    return 0


# -- worker / flower -------------------------------------------------------------------
def worker_argv(settings, queues: str, concurrency: int | None, name: str | None,
                loglevel: str | None = None) -> list[str]:
    wanted = [q.strip() for q in queues.split(",") if q.strip()]
    unknown = sorted(set(wanted) - set(QUEUES))
    if unknown or not wanted:
        raise InputError("--queues", f"unknown queue(s) {unknown}; valid: {', '.join(QUEUES)}")
    # no gossip or mingle: dimple needs neither (leases and expiry, not revokes, keep stages from
    # running twice or late), and Celery's gossip failed to restart after a Redis restart
    argv = ["worker", "-Q", ",".join(wanted), "-E", "--without-gossip", "--without-mingle",
            "--loglevel", loglevel or settings.log_level, "-n", name or f"dimple-{'-'.join(wanted)}@%h"]
    if concurrency is not None and concurrency < 0:  # Celery refuses it at each start: a restart loop
        raise InputError("--concurrency", "must be 0 (one process per core) or more")
    processes = concurrency if concurrency is not None else settings.worker_concurrency
    if processes:
        argv += ["-c", str(processes)]
    return argv


def cmd_worker(args) -> int:
    settings = cli_settings()
    need_broker(settings)
    level = logging.getLevelName(logging.getLogger().level)  # DIMPLE_LOG_LEVEL, or lower with -v
    argv = worker_argv(settings, args.queues, args.concurrency, args.name, level)  # refuses bad queues first
    if not args.no_restart:
        child = [sys.executable, "-m", "workers.cli", *(["-v"] * (args.verbose or 0)), "worker", "--no-restart",
                 "--queues", args.queues, *(["--concurrency", str(args.concurrency)] if args.concurrency else []),
                 *(["--name", args.name] if args.name else [])]
        return supervise(child)

    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Celery's own warning is eight lines on every start; one says the same
        warnings.filterwarnings("ignore", message="You're running the worker with superuser privileges")
        logging.getLogger("dimple.worker").warning(
            "running as root: run workers as an unprivileged user (SECURITY.md, 'Operator duties')")
    get_app().worker_main(argv)
    return 0


def flower_argv(settings, insecure: bool) -> list[str]:
    """Flower's arguments; refuses to run without basic auth unless told to."""
    user, password = settings.flower_user, settings.flower_password.get_secret_value()
    argv = ["flower", f"--address={settings.flower_address}", f"--port={settings.flower_port}"]
    if user and password:
        if ":" in user:
            raise InputError("DIMPLE_FLOWER_USER", "must not contain ':'")
        return argv + [f"--basic_auth={user}:{password}"]
    if not insecure:
        raise InputError(
            "DIMPLE_FLOWER_USER/DIMPLE_FLOWER_PASSWORD",
            "Flower needs credentials (its UI is open to anyone otherwise); set both, or pass --insecure",
        )
    return argv


def cmd_flower(args) -> int:
    settings = cli_settings()
    need_broker(settings)
    argv = flower_argv(settings, args.insecure)
    try:
        get_app().start(argv)
    except OSError as exc:
        where = f"{settings.flower_address}:{settings.flower_port}"
        if exc.errno == errno.EADDRINUSE:
            raise InputError("DIMPLE_FLOWER_PORT", f"{where} is in use (another Flower?): stop it, or choose "
                             "another port") from None
        if exc.errno in (errno.EACCES, errno.EADDRNOTAVAIL):
            raise InputError("DIMPLE_FLOWER_ADDRESS/DIMPLE_FLOWER_PORT",
                             f"cannot listen on {where}: {exc.strerror}") from None
        raise
    return 0


# -- demo ----------------------------------------------------------------------------
def cmd_demo(args) -> int:
    return run_demo(cli_settings(), rebuild=args.rebuild)

