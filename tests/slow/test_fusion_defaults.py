"""The default hybrid (convex fusion, chosen leaving one real judged set out
in turn: BENCHMARKS.md, "Fusion defaults chosen leave one set out (issue
31)") through the real embedded pipeline and model, on generated and shipped
sets, which test its behaviour and chose nothing: on the demo set, on the
held-out probe sets (``probes.HELD_OUT``), on ``entities`` and
``long_short`` and on ``ops/bench/data/docs_qa`` (long passages with
hand-written questions) its R@10 is at least the better leg's, and so is its
nDCG@10 but where the vector leg leads by far: there the default's measured
shortfall (``SHORTFALL``, 2026-12-06, BM25 k1 1.2 and b 0.3 with alpha 0.45:
howto -0.055, projects -0.005, entities -0.007; BENCHMARKS.md, "On the
generated sets") is all it may lose. Issue
16's comparisons against its own rules (per-query weights, tie groups, floor)
went with the rules."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pipeline.datasets import probes
from workers.settings import WorkerSettings

METRICS = ("ndcg@10", "recall@10")
# nDCG@10 the default may lose to the better (vector) leg, as measured with it (convex, alpha 0.45): on these
# sets the vector leg leads full text by 0.02 to 0.33, and the chosen alpha gives full text more than half the weight
SHORTFALL = {"howto": 0.06, "projects": 0.01, "entities": 0.01}


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
        slack = SHORTFALL.get(name, 0.0) if m == "ndcg@10" else 0.0
        assert figures["hybrid"][m] >= max(figures["keyword"][m], figures["semantic"][m]) - slack, m
