"""What a one-memory write costs on the lake (``pipeline.store.lake``), and how
soon another process sees it, on each catalog.

    python -m ops.bench.lake_latency --writes 40 --out /tmp/b/lake_latency.json
    python -m ops.bench.lake_latency --postgres 'host=127.0.0.1 user=postgres' --writes 40

For each catalog (the default SQLite file; PostgreSQL when ``--postgres``
names a server, in a database made for the run and dropped after), a fresh
lake gets ``--writes`` one-memory commits, ``--gap-ms`` apart, while a second
process (its own lake connection, warm) asks for ``latest_snapshot()`` every
``--poll-ms`` and notes when it first sees each snapshot. Commit: the ``commit`` call's
wall time. Visible: from the call's start to the other process's first
sighting (the clocks are one machine's), so it includes the commit and at
most one poll. The poll's own duration is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ops.bench import postgres_lake


def _reader(settings_json: str, out: str, stop: str, poll_ms: str) -> None:
    from pipeline.settings import Settings
    from tests.lakes import open_lake

    seen: dict[int, float] = {}
    polls: list[float] = []
    with open_lake(Settings.model_validate_json(settings_json)) as lake:
        Path(out + ".ready").touch()
        while not Path(stop).exists():
            t0 = time.time()
            snap = lake.latest_snapshot()
            t1 = time.time()
            polls.append(t1 - t0)
            seen.setdefault(snap, t1)
            time.sleep(max(0.0, float(poll_ms) / 1000 - (t1 - t0)))
    Path(out).write_text(json.dumps({"seen": seen, "polls": polls}))


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def measure(settings, writes: int, gap_ms: float, poll_ms: float, scratch: Path, log=print) -> dict:
    from pipeline.store.lake import LakeWrite
    from tests.lakes import memory, open_lake

    out, stop = scratch / f"seen-{uuid.uuid4().hex}.json", scratch / f"stop-{uuid.uuid4().hex}"
    with open_lake(settings) as lake:
        reader = subprocess.Popen([sys.executable, "-m", "ops.bench.lake_latency", "--reader",
                                   settings.model_dump_json(), str(out), str(stop), str(poll_ms)])
        while not Path(str(out) + ".ready").exists():
            time.sleep(0.01)
        time.sleep(0.5)
        started, commits, snaps = [], [], []
        for i in range(writes):
            t0 = time.time()
            done = lake.commit(LakeWrite([memory(f"m-{i}", f"memory number {i} for the latency run")]))
            commits.append(time.time() - t0)
            started.append(t0)
            snaps.append(done.snapshot)
            time.sleep(gap_ms / 1000)
        time.sleep(1.0)
        stop.touch()
        reader.wait(timeout=60)
    data = json.loads(out.read_text())
    seen = {int(k): v for k, v in data["seen"].items()}
    visible = [seen[s] - t0 for s, t0 in zip(snaps, started) if s in seen]
    row = {"writes": writes, "commit_p50_ms": 1000 * statistics.median(commits),
           "commit_p90_ms": 1000 * _pct(commits, 0.9), "visible_p50_ms": 1000 * statistics.median(visible),
           "visible_p90_ms": 1000 * _pct(visible, 0.9), "seen": len(visible),
           "poll_p50_ms": 1000 * statistics.median(data["polls"]), "poll_max_ms": 1000 * max(data["polls"]),
           "poll_every_ms": poll_ms}
    log(json.dumps(row))
    return row


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--reader"]:
        _reader(*argv[1:5])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=40)
    parser.add_argument("--gap-ms", type=float, default=100.0)
    parser.add_argument("--poll-ms", type=float, default=50.0, help="how often the other process asks for the "
                                                                    "latest snapshot (0: as fast as it can)")
    parser.add_argument("--postgres", help="a conninfo without dbname, e.g. 'host=127.0.0.1 user=postgres'")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from pipeline.settings import Settings

    rows: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        settings = Settings(data_dir=scratch / "sqlite", _env_file=None)
        rows["sqlite"] = measure(settings, args.writes, args.gap_ms, args.poll_ms, scratch)
        if args.postgres:
            with postgres_lake(args.postgres, scratch) as settings:
                rows["postgres"] = measure(settings, args.writes, args.gap_ms, args.poll_ms, scratch)
    rows["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(json.dumps(rows, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
