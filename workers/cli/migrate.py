"""``dimple migrate``: the data dir's segment store copied into the lake
(``pipeline.store.lake.migrate``); ``dimple repoint``: a lake whose files were
moved takes the data path it is now at (``pipeline.store.lake.repoint``)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from pipeline import audit
from pipeline.audit.carry import carry
from pipeline.settings import mask_url
from pipeline.store import segments
from pipeline.store.lake.migrate import BATCH_SIZE, BatchDone, migrate
from pipeline.store.lake.repoint import repoint
from pipeline.store.tuned import TUNED, carry_file

from .common import cli_settings


def register(sub) -> None:
    """Add ``migrate`` to the ``dimple`` parser."""
    s = sub.add_parser("migrate", help="copy the segment store of the data dir (the store of earlier versions) "
                                       "into the lake, with its audit rows and tuned settings; its files stay "
                                       "until you remove them")
    s.add_argument("--batch-size", type=int, default=BATCH_SIZE, metavar="N",
                   help=f"memories per lake commit (default {BATCH_SIZE}); a migrate that stopped resumes at the "
                        "size it began with")
    s.add_argument("--json", action="store_true", help="print the report as JSON (no progress lines)")
    s.set_defaults(func=cmd_migrate)
    r = sub.add_parser("repoint", help="the lake's files were moved (a restored backup, another mount point): "
                                       "record DIMPLE_STORE__DATA_PATH (default: <data dir>/lake) as its data path, "
                                       "once every file the catalog lists is found there")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.set_defaults(func=cmd_repoint)


def cmd_repoint(args) -> int:
    done = repoint(cli_settings())
    if args.json:
        print(json.dumps(asdict(done)))
    elif not done.changed:
        print(f"the lake's data path is already {done.new}; nothing to do")
    else:
        how = f"{done.files} files found there" if done.checked else "its files not checked (object storage)"
        print(f"the lake's data path is now {done.new} (was {done.old}); {how}")
    return 0


def cmd_migrate(args) -> int:
    settings = cli_settings()

    def progress(done: BatchDone) -> None:
        print(f"batch {done.index}/{done.total}: {done.memories} memories, lake snapshot {done.snapshot}",
              file=sys.stderr, flush=True)

    report = migrate(settings, batch_size=args.batch_size, on_batch=None if args.json else progress)
    # what the segment store kept beside its memories: exactly once by query id, and only tuned
    # settings the lake does not have yet, so a second migrate carries nothing twice
    rows, added = carry(settings.audit_path, audit.log_of(settings))
    tuned = carry_file(settings)
    if args.json:
        print(json.dumps({**asdict(report), "audit_rows": rows, "audit_rows_added": added,
                          "tuned": None if tuned is None else tuned.model_dump(mode="json")}, default=str))
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
              f"{mask_url(report.marker.catalog if report.marker else settings.lake_catalog)}: snapshot {report.snapshot}, "
              f"{report.seconds:.1f}s")
    if rows:
        print(f"audit: {added} of the {rows} rows of {settings.audit_path} written into the lake's retrieval_log "
              f"({rows - added} were there already)")
    if tuned is not None:
        print(f"tuned settings: {TUNED}'s ({', '.join(f'{k} {v}' for k, v in tuned.settings.changes().items())}) "
              "are the lake's now")
    held = [name for name in (*segments.STORE_FILES, TUNED) if (settings.data_dir / name).exists()]
    if settings.audit_path.parent == settings.data_dir:
        held += [name for name in (settings.audit_path.name, settings.audit_path.name + ".wal")
                 if (settings.data_dir / name).exists()]
    if held:
        print(f"the segment store stays in {settings.data_dir} ({', '.join(held)}); once the lake answers as you "
              f"expect, remove it: cd {settings.data_dir} && rm -r {' '.join(held)}")
    return 0
