"""dimple eval on LoCoMo: all 1,536 scored questions embedded, then through
Redis with two real workers (embed; search with 2 processes); the broker run
completes and its figures equal the embedded run's (slow tier + integration)."""

from __future__ import annotations

import pytest

from pipeline import evaluation as ev

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_locomo_eval_through_the_broker_equals_embedded(locomo_store, locomo_queries, locomo_embedded_run,
                                                        tmp_path):
    import workers
    from ops.stack import Stack, redis_binary
    from pipeline.evaluation.report import write_run
    from workers.app import app
    from workers.cli.eval import execute

    settings, _ = locomo_store
    qset, quiet = locomo_queries
    assert len(qset.queries) == 1536 and not qset.skipped
    defaults = {"mode": "hybrid", "max_units": 50}

    embedded, emb_runs = locomo_embedded_run("hybrid")

    redis_binary()
    stack = Stack(tmp_path / "stack")
    stack.start_redis()
    env = {"DIMPLE_DATA_DIR": str(settings.data_dir), "DIMPLE_AUDIT_ENABLED": "false"}
    try:
        broker_settings = quiet.replace(broker_url=stack.broker_url)
        workers.configure(broker_settings)  # the pings go through it
        stack.start_query_workers(app, "e", env, timeout=180)
        broker, broker_runs = execute(qset, broker_settings, name="broker", defaults=defaults, batch_size=64,
                                      progress=False)
    finally:
        workers.configure(settings)
        stack.stop_all()

    assert broker["config"]["via"] == "broker" and embedded["config"]["via"] == "embedded"
    assert broker["answered"] == broker["queries"] == 1536 and broker["failed"] == {}
    assert broker["metrics"] == pytest.approx(embedded["metrics"], abs=1e-9)
    # A query embedded in a worker process can differ from this process's
    # vector in the last bits (torch threads), which may swap near-ties deep
    # in a list without moving a figure; measured: 1,522 of 1,536 identical.
    same = sum(a.ranked == b.ranked for a, b in zip(emb_runs, broker_runs))
    assert same >= 0.98 * 1536, f"only {same} of 1536 result lists identical"
    # the written broker run reads back to the same figures (ranx over run.trec)
    paths = write_run(tmp_path / "broker", broker, ev.as_run(broker_runs), qset.qrels, broker_runs)
    means, _ = ev.score(ev.read_trec_run(paths["run"]), ev.read_qrels(paths["qrels"]))
    assert means == pytest.approx(embedded["metrics"], abs=1e-6)
    print(f"\nembedded {embedded['queries_per_s']} q/s, broker {broker['queries_per_s']} q/s, "
          f"identical lists {same}/1536, nDCG@10 {broker['metrics']['ndcg@10']:.4f}")
