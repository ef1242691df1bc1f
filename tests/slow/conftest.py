"""The LoCoMo store, ingested once per session with the real model and shared
by every slow test that needs it (needs ../shared/data/locomo)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.datasets.locomo import load_locomo
from workers.settings import WorkerSettings

LOCOMO = Path(__file__).resolve().parents[3] / "shared" / "data" / "locomo" / "locomo10.json"


@pytest.fixture(scope="session")
def locomo_store(tmp_path_factory):
    """(settings of a store holding every LoCoMo turn, the loaded LocomoSet)."""
    if not LOCOMO.is_file():
        pytest.skip("LoCoMo data not present (../shared/data/locomo)")
    from workers.cli.common import ingest_file

    loco = load_locomo(LOCOMO)
    work = tmp_path_factory.mktemp("locomo")
    path = work / "locomo.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in loco.records), encoding="utf-8")
    settings = WorkerSettings(data_dir=work / "data", _env_file=None)
    ingest_file(path, settings, progress=False)
    return settings, loco


@pytest.fixture(scope="session")
def locomo_queries(locomo_store):
    """(the 1,536 scored LoCoMo questions as a query set, the store's settings with audit off)."""
    from pipeline import evaluation as ev

    settings, loco = locomo_store
    queries = [ev.QuerySpec(q["id"], q["text"], {"namespace": q["namespace"]}) for q in loco.queries]
    return ev.reconcile("locomo", queries, loco.qrels), settings.replace(audit_enabled=False)


@pytest.fixture(scope="session")
def locomo_embedded_run(locomo_queries):
    """``dimple eval`` of LoCoMo in ``mode`` (hybrid: the report and its runs,
    computed once per session), embedded, default settings (but ``fusion``
    when given), max_units 50."""
    from workers.cli.eval import execute

    qset, quiet = locomo_queries
    done: dict[tuple, tuple] = {}

    def run(mode: str = "hybrid", fusion: str | None = None) -> tuple:
        key = (mode, fusion)
        if key not in done:
            asks = {"mode": mode, "max_units": 50, **({"fusion": fusion} if fusion else {})}
            done[key] = execute(qset, quiet, name=f"{mode}-{fusion or 'default'}", defaults=asks,
                                batch_size=64, progress=False)
        return done[key]

    return run
