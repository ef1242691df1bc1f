"""Makes the segment stores ``dimple migrate`` is tested on (tests/segment_stores.py).

The segment store (a ``MANIFEST`` over a base and delta files) was written by
dimple up to commit ``dfe842b``; later versions only read it, to migrate it.
These stores were written by that commit's own write path, compaction and
CLI, so the migrate is tested on what users' data dirs hold. Run from a
checkout of that commit (its ``pipeline``, ``workers`` and ``tests``)::

    git worktree add /tmp/dimple-segments dfe842b
    cd /tmp/dimple-segments && ../main/.venv/bin/python <this file> <this folder>

Each store is one ``NAME.tar.gz`` of its data dir, with ``fixture.json`` beside
the store's files: what was written (every content each id had, the live and
forgotten ids) and, for the CLI's store, what a search answered.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import tempfile
from pathlib import Path


def _tar(data_dir: Path, out: Path, facts: dict) -> None:
    (data_dir / "fixture.json").write_text(json.dumps(facts, sort_keys=True, indent=1), encoding="utf-8")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=9) as tar:
        for path in sorted(data_dir.rglob("*")):
            if path.is_file() and not path.name.endswith(".lock"):
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(data_dir)))
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
    out.write_bytes(buf.getvalue())
    print(f"{out.name}: {len(buf.getvalue()):,} bytes")


def main(out: Path) -> None:
    from pipeline.store.compact import compact
    from pipeline.store.writes import parse_records, write
    from tests.unit.test_lake_derive import History, _settings

    root = Path(tempfile.mkdtemp(prefix="segment-stores-"))

    def history_store(name: str, seed: int, first: int, before: int, after: int) -> None:
        """A first batch (straight into a base), ``before`` random writes, a compaction, ``after`` more."""
        seg = _settings(root, name)
        history = History(seed)
        texts: dict[str, list[str]] = {}

        def send(op: str, arg) -> None:
            if op == "forget":
                write(seg, forget=list(arg))
                return
            write(seg, parse_records(arg, seg))
            for rec in arg:
                texts.setdefault(rec["id"], []).append(rec["content"])

        send("remember", history.batch(first))
        for op, arg in history.writes(before):
            send(op, arg)
        compact(seg, wait=True)
        for op, arg in history.writes(after):
            send(op, arg)
        _tar(seg.data_dir, out / f"{name}.tar.gz", {"texts": texts, "live": sorted(history.live),
                                                     "forgotten": sorted(history.forgotten)})

    history_store("history-29", 29, 120, 12, 10)
    history_store("history-7", 7, 40, 6, 4)

    # six notes; then, as if run with the segment engine after a migrate, two more writes; then one forget
    seg = _settings(root, "six")
    write(seg, parse_records([{"id": f"r{i}", "namespace": "n", "content": f"note {i} about redis"}
                              for i in range(6)], seg))
    _tar(seg.data_dir, out / "six.tar.gz", {})
    write(seg, parse_records([{"id": "r6", "namespace": "n", "content": "a new note about redis"},
                              {"id": "r2", "namespace": "n", "content": "note 2, replaced"}], seg))
    write(seg, forget=["r1"])
    _tar(seg.data_dir, out / "six-written-again.tar.gz", {})
    write(seg, forget=["r3"])
    _tar(seg.data_dir, out / "six-forgot-again.tar.gz", {})

    seg = _settings(root, "all-forgotten")
    write(seg, parse_records([{"id": "a", "namespace": "n", "content": "to be forgotten"}], seg))
    write(seg, forget=["a"])
    _tar(seg.data_dir, out / "all-forgotten.tar.gz", {})

    seg = _settings(root, "twelve")  # tests lay it out as before segments (one store.duckdb)
    write(seg, parse_records([{"id": f"o{i}", "namespace": "n", "content": f"old note {i} about redis"}
                              for i in range(12)], seg))
    _tar(seg.data_dir, out / "twelve.tar.gz", {})

    # through the CLI, with the settings tests.conftest.store_settings gives it
    from tests.conftest import store_settings

    cli = store_settings(root / "cli", "segments")
    os.environ.update({"DIMPLE_DATA_DIR": str(cli.data_dir), "DIMPLE_EMBEDDING_MODEL": cli.embedding_model,
                       "DIMPLE_STORE__ENGINE": "segments"})
    import workers
    from workers import audit, resources
    from workers.cli import main as dimple
    from workers.settings import get_settings

    get_settings.cache_clear()
    workers.configure(get_settings())
    records = [{"id": f"m{i}", "namespace": "alpha", "content": f"note {i} about billing and the deploy window",
                **({"supersedes": [f"m{i - 1}"]} if i % 5 == 4 else {})} for i in range(30)]
    source = root / "m.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert dimple(["ingest", str(source)]) == 0
    assert dimple(["forget", "m7"]) == 0
    real = sys.stdout
    sys.stdout = captured = io.StringIO()
    try:
        assert dimple(["search", "deploy window billing", "--json"]) == 0
    finally:
        sys.stdout = real
    answered = [r["id"] for r in json.loads(captured.getvalue())["results"]]
    audit.flush()
    resources.current().close_store()
    _tar(cli.data_dir, out / "cli.tar.gz", {"records": records, "searched": "deploy window billing",
                                            "answered": answered})


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
