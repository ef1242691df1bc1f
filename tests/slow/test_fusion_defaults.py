"""Issue 16's default hybrid through the real embedded pipeline and model:
on the demo set it is at least the better leg (nDCG@10 and R@10; measured
0.723 / 0.831 against semantic 0.702 / 0.785), and on each generated probe
set (``pipeline.datasets.probes``, as ``dimple eval --beir`` ingests them) it
is at least the seed's fixed 0.4:1 weights, at least itself without the
full-text tie rule (``fts_tie_tolerance`` 0) and at least itself without the
full-text floor (``fts_floor`` 0); on the held-out probe sets
(``probes.HELD_OUT``, never used to choose a default) and on ``entities`` and
``long_short`` it is at least the better leg (BENCHMARKS.md, "Fusion
defaults (issue 16)", its second to fourth rounds); so it is on
``ops/bench/data/docs_qa``, a shipped held-out set of long passages with
hand-written questions (measured 0.873 / 0.964 against full text 0.841 /
0.941 and vector 0.838 / 0.964)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pipeline.datasets import probes
from workers.settings import WorkerSettings

METRICS = ("ndcg@10", "recall@10")


def _source(settings, **which):
    from workers.cli.eval import load_source

    args = argparse.Namespace(queries=None, qrels=None, beir=None, locomo=None, demo=False, store=None, strict=False)
    for key, value in which.items():
        setattr(args, key, value)
    return load_source(args, settings)


def _figures(qset, settings, defaults):
    from workers.cli.eval import execute

    report, _ = execute(qset, settings.replace(audit_enabled=False), name="run",
                        defaults={"max_units": 10, **defaults}, batch_size=64, progress=False)
    return report["metrics"]


def test_demo_hybrid_is_at_least_the_better_leg(tmp_path):
    qset, settings = _source(WorkerSettings(data_dir=tmp_path, _env_file=None), demo=True)
    figures = {mode: _figures(qset, settings, {"mode": mode}) for mode in ("keyword", "semantic", "hybrid")}
    print(figures)
    for m in METRICS:
        assert figures["hybrid"][m] >= max(figures["keyword"][m], figures["semantic"][m]), m


@pytest.mark.parametrize("name", sorted(probes.SETS))
def test_probe_set_default_is_at_least_the_fixed_weights(tmp_path, name):
    folder = probes.write_beir(probes.SETS[name](probes.SEED), tmp_path / "sets")
    qset, settings = _source(WorkerSettings(data_dir=tmp_path / "data", _env_file=None), beir=folder)
    now = _figures(qset, settings, {"mode": "hybrid"})
    before = _figures(qset, settings.replace(fusion_weights="fixed", vector_weight=0.4, fts_weight=1.0,
                                             fts_tie_tolerance=0.0, fts_floor=0.0), {"mode": "hybrid"})
    no_ties = _figures(qset, settings.replace(fts_tie_tolerance=0.0), {"mode": "hybrid"})
    no_floor = _figures(qset, settings.replace(fts_floor=0.0), {"mode": "hybrid"})
    print(name, now, before, no_ties, no_floor)
    for m in METRICS:
        assert now[m] >= before[m], m
        assert now[m] >= no_ties[m], m
        assert now[m] >= no_floor[m], m


DOCS_QA = Path(__file__).resolve().parents[2] / "ops" / "bench" / "data" / "docs_qa"


@pytest.mark.parametrize("name", probes.HELD_OUT + ("entities", "long_short", "docs_qa"))
def test_default_is_at_least_the_better_leg(tmp_path, name):
    if name == "docs_qa":
        folder = DOCS_QA
    else:
        folder = probes.write_beir(probes.SETS[name](probes.SEED), tmp_path / "sets")
    qset, settings = _source(WorkerSettings(data_dir=tmp_path / "data", _env_file=None), beir=folder)
    figures = {mode: _figures(qset, settings, {"mode": mode}) for mode in ("keyword", "semantic", "hybrid")}
    print(name, figures)
    for m in METRICS:
        assert figures["hybrid"][m] >= max(figures["keyword"][m], figures["semantic"][m]), m
