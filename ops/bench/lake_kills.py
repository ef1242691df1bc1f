"""The lake's durability goal: "PostgreSQL catalog: 0 acknowledged writes lost
over 40 kills".

    python -m ops.bench.lake_kills --kills 40 --out /tmp/b/lake_kills.json
    python -m ops.bench.lake_kills --postgres 'host=127.0.0.1 user=postgres' --kills 40

A writer process doing what the ``ingest`` worker does (``tests/kills.py``,
``kill_writer``: batches of new memories, replacements and forgets, one write
id each, default settings but the hash embedder) is SIGKILLed ``--kills``
times, each after a random 0.05-1.5 s of writing (seeded by ``--seed``). After
each kill the next writer, a fresh process, opens the store, reads every id
ever written, and delivers again the write in flight at the kill (twice) and
an acknowledged write a later one overwrote, as the broker would. The lake's
catalog is a PostgreSQL database made for the run and dropped after (the
server: ``--postgres``, a conninfo without dbname, else the one
``tests.lakes.find_postgres`` finds). Printed: kills, acknowledged writes,
lost (acknowledged writes not read back as written: must be 0), forgets undone (must be 0), kills that
caught a write in flight and how many of those had landed, writes delivered
again, seconds, and the load average before and after. Exit status 1 when
anything acknowledged was lost or undone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path

WINDOW = (0.05, 1.5)  # as tests/slow/test_lake_kill.py: a kill lands anywhere in the first few writes


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run(kills: int, seed: int, scratch: Path, postgres: str | None) -> dict:
    from pipeline.settings import StoreSettings
    from tests.kills import kill_writer, settings_for
    from tests.lakes import Postgres, find_postgres

    load = _load()
    server = Postgres(f"dbname=postgres {postgres}", postgres) if postgres else find_postgres(scratch / "pg-server")
    conninfo = server.create_database()
    try:
        store = StoreSettings(catalog=f"postgres:{conninfo}", data_path=scratch / "pg-data")
        report = kill_writer(settings_for(scratch / "lake", store), kills, random.Random(seed), window=WINDOW,
                             strict=False, log=print)
    finally:
        server.drop_database(conninfo)
        if server.proc is not None:
            server.proc.terminate()
            server.proc.wait(timeout=30)
    return report.as_dict() | {"load_before": load, "load_after": _load()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=40)
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--postgres", help="a conninfo without dbname, e.g. 'host=127.0.0.1 user=postgres' "
                                           "(default: the server tests.lakes.find_postgres finds)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        row = rows["lake_postgres"] = run(args.kills, args.seed, Path(tmp), args.postgres)
        print(f"lake: {row['kills']} kills, {row['acknowledged']} acknowledged writes, lost {row['lost']}, "
              f"forgets undone {row['back']}, in flight at a kill {row['in_flight']} (landed {row['landed']}), "
              f"delivered again {row['redelivered']}, {row['seconds']:.0f} s, load {row['load_before']} -> "
              f"{row['load_after']}", flush=True)
    print(json.dumps(rows, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))
    return 1 if any(r["lost"] or r["back"] or r["problems"] for r in rows.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
