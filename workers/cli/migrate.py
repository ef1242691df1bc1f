"""``dimple migrate``: the data dir's segment store copied into the lake (``pipeline.store.lake.migrate``)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from pipeline.store import segments
from pipeline.store.lake.migrate import BATCH_SIZE, BatchDone, migrate

from .common import cli_settings


def register(sub) -> None:
    """Add ``migrate`` to the ``dimple`` parser."""
    s = sub.add_parser("migrate", help="copy the segment store of the data dir into the lake (run with "
                                       "DIMPLE_STORE__ENGINE=lake); the segment store's files stay until you "
                                       "remove them")
    s.add_argument("--batch-size", type=int, default=BATCH_SIZE, metavar="N",
                   help=f"memories per lake commit (default {BATCH_SIZE}); a migrate that stopped resumes at the "
                        "size it began with")
    s.add_argument("--json", action="store_true", help="print the report as JSON (no progress lines)")
    s.set_defaults(func=cmd_migrate)


def cmd_migrate(args) -> int:
    settings = cli_settings()

    def progress(done: BatchDone) -> None:
        print(f"batch {done.index}/{done.total}: {done.memories} memories, lake snapshot {done.snapshot}",
              file=sys.stderr, flush=True)

    report = migrate(settings, batch_size=args.batch_size, on_batch=None if args.json else progress)
    if args.json:
        print(json.dumps(asdict(report), default=str))
        return 0
    if report.already:
        assert report.marker is not None
        print(f"already migrated: {report.memories} memories in {report.batches} batches, lake snapshot "
              f"{report.snapshot}, at {report.marker.migrated_at}; nothing to do")
    elif report.caught_up:
        print(f"caught up: the segment store was written after its migrate; {report.changed} memories written and "
              f"{report.forgotten} forgotten in the lake in {report.batches} batches (of its {report.memories} at "
              f"version {report.segment_version}): snapshot {report.snapshot}, {report.seconds:.1f}s")
    else:
        resumed = (f" ({report.resumed} committed by an earlier run, batches of {report.batch_size} as it began)"
                   if report.resumed else "")
        print(f"migrated {report.memories} memories in {report.batches} batches{resumed} into the lake "
              f"{report.marker.catalog if report.marker else settings.lake_catalog}: snapshot {report.snapshot}, "
              f"{report.seconds:.1f}s")
    held = [name for name in segments.STORE_FILES if (settings.data_dir / name).exists()]
    if held:
        print(f"the segment store stays in {settings.data_dir} ({', '.join(held)}); once the lake answers as you "
              f"expect, remove it: cd {settings.data_dir} && rm -r {' '.join(held)}")
    return 0
