"""The benchmarks' command lines still run, at a tiny size (figures meaningless):
``ops.bench.fulltext``, ``ops.bench.vector``, ``ops.bench.audit``,
``ops.bench.worker_start``, ``ops.bench.fusion``, ``ops.bench.latency`` and
``ops.bench.writes`` as their module docstrings give them. bm25s,
PyStemmer and FAISS are the ``bench`` extra, not test dependencies: the sides
that need them are skipped without."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ops.bench import synth


def _has(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    from workers.settings import WorkerSettings

    folder = tmp_path_factory.mktemp("bench")
    settings = WorkerSettings(data_dir=folder, _env_file=None)
    synth.build_store(folder / "store.duckdb", 1500, settings, dim=32, log=lambda *_: None)
    return folder


@pytest.mark.slow
def test_fulltext_bench_runs(tiny_store, tmp_path, capsys):
    from ops.bench import fulltext

    with_bm25s = _has("bm25s", "Stemmer", "numba")
    out = tmp_path / "fts.json"
    args = ["--store", str(tiny_store), "--queries", "12", "--rounds", "2", "--ref-queries", "4", "--warmup", "2",
            "--out", str(out)] + ([] if with_bm25s else ["--no-bm25s"])
    assert fulltext.main(args) == 0
    report = json.loads(out.read_text())
    assert report["n"] == 1500 and report["match_bm25"]["identical_top10"] == 4
    assert len(report["loadavg_before"]) == 3 and len(report["loadavg_after"]) == 3
    if with_bm25s:
        assert report["bm25s_config"]["backend"] == "numba"
        assert report["baseline"] in ("bm25s", "bm25s_serial") and "faster" in report["verdict"].lower()
        assert report["bm25s"]["top10_overlap_with_ours"] > 0.5  # the same texts, ranked alike


@pytest.mark.slow
@pytest.mark.skipif(not _has("faiss"), reason="faiss-cpu is the bench extra")
def test_vector_bench_runs(tiny_store, tmp_path):
    from ops.bench import vector

    out = tmp_path / "vec.json"
    assert vector.main(["--store", str(tiny_store), "--queries", "10", "--rounds", "1", "--warmup", "2",
                        "--beams", "4,16", "--nlists", "12,24", "--faiss-cache", str(tmp_path / "faiss"),
                        "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["faiss"]) == {"12", "24"}
    for f in report["faiss"].values():
        probes = [int(p) for p in f["curve"]]
        assert probes[0] == 1 and probes == sorted(probes)  # measured points, from nprobe 1 up
        assert all("p50_ms" in c and 0 <= c["recall10"] <= 1 for c in f["curve"].values())
    assert len(report["comparisons"]) == 4 and all(c["verdict"] for c in report["comparisons"])
    assert report["faiss"]["12"]["build_s"] is not None  # trained in this run
    again = tmp_path / "again.json"
    assert vector.main(["--store", str(tiny_store), "--queries", "5", "--rounds", "1", "--warmup", "1",
                        "--beams", "4", "--nlists", "12", "--faiss-cache", str(tmp_path / "faiss"),
                        "--out", str(again)]) == 0
    assert json.loads(again.read_text())["faiss"]["12"]["build_s"] is None  # read from the cache


@pytest.mark.slow
def test_audit_bench_runs(tmp_path):
    from ops.bench import audit

    out = tmp_path / "audit.json"
    assert audit.main(["--n", "4", "--rounds", "2", "--warmup", "2", "--work", str(tmp_path / "work"),
                       "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    (mode,) = report["modes"].values()  # hybrid unless told
    for side in ("off", "on", "broken"):
        assert len(mode[side]["block_ms_per_query"]) == 2 and mode[side]["all_drained"]
    assert mode["orders"][0] != mode["orders"][1]  # the blocks' order rotates
    assert report["dead_letters_from_broken_side"] == 2 + 2 * 4  # warm-up and both rounds, every row


@pytest.mark.slow
def test_worker_start_bench_runs(tmp_path):
    from ops.bench import worker_start

    out = tmp_path / "start.json"
    assert worker_start.main(["--rounds", "1", "--batch", "65", "--out", str(out)]) == 0
    (one,) = json.loads(out.read_text())["rounds"]
    assert set(one) == {"ready_s", "pool_rss_mib", "first_write_ms", "second_write_ms", "batch_write_s",
                        "pool_rss_after_mib"}
    assert all(v > 0 for v in one.values())


@pytest.mark.slow
def test_fusion_bench_caches_a_beir_folder_and_a_probe_set(tmp_path):
    """``cache --beir`` (the shipped ``docs_qa``) and ``cache --probe``, then
    ``evaluate`` over both: a process of its own, as the cache configures the
    workers module and ``DIMPLE_DATA_DIR`` for the set's store."""
    root = Path(__file__).resolve().parents[2]
    bench = [sys.executable, "-m", "ops.bench.fusion"]
    for which in (["--beir", str(root / "ops" / "bench" / "data" / "docs_qa")], ["--probe", "identifiers"]):
        out = tmp_path / f"{which[0][2:]}.json"
        subprocess.run([*bench, "cache", *which, "--limit", "5", "--data-dir", str(tmp_path / "data"),
                        "--out", str(out)], cwd=root, check=True, timeout=600)
        cache = json.loads(out.read_text())
        assert len(cache["queries"]) == 5 and all(q["vector"] and q["qrels"] for q in cache["queries"])
    md = tmp_path / "fusion.md"
    subprocess.run([*bench, "evaluate", str(tmp_path / "beir.json"), str(tmp_path / "probe.json"), "--md", str(md)],
                   cwd=root, check=True, timeout=600)
    header = md.read_text().splitlines()[0]
    assert "docs_qa nDCG@10" in header and "identifiers nDCG@10" in header


@pytest.fixture(scope="module")
def latency_work(tmp_path_factory):
    return tmp_path_factory.mktemp("latency")  # the demo store, built by the first run


def _latency_report(work, tmp_path, *extra: str) -> dict:
    from ops.bench import latency

    out = tmp_path / "latency.json"
    assert latency.main(["--work", str(work), "--rounds", "2", "--queries", "3", "--warmup", "1",
                         "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def _stages_by_mode(side: dict) -> None:
    """Each mode's recorded stages are its canvas's: keyword never embeds, semantic never runs full text."""
    assert {"fulltext", "fuse", "augment", "budget"} <= set(side["keyword"]["stages_p50_ms"])
    assert not {"embed", "descend"} & set(side["keyword"]["stages_p50_ms"])
    assert {"embed", "descend"} <= set(side["semantic"]["stages_p50_ms"])
    assert "fulltext" not in side["semantic"]["stages_p50_ms"]
    assert {"embed", "descend", "fulltext"} <= set(side["hybrid"]["stages_p50_ms"])
    for figures in side.values():
        assert figures["n"] == 2 * 3 and figures["p95_ms"] >= figures["p50_ms"] > 0
        assert figures["outside_stages_p50_ms"] >= 0  # the wall holds every stage


@pytest.mark.slow
def test_latency_bench_runs_embedded(latency_work, tmp_path):
    report = _latency_report(latency_work, tmp_path, "--embedded-only")
    assert set(report) == {"store", "synthetic", "queries", "rounds", "load_before", "load_after", "load_per_round",
                           "floor", "embedded", "broker", "breakdown", "ratios"}
    assert report["queries"] == 3 and report["broker"] is None and report["synthetic"] is None
    assert len(report["load_before"]) == 3 and len(report["load_per_round"]) == 2
    assert set(report["floor"]) == {"embed", "vector_leg", "fulltext_leg"}
    assert all(f["n"] == 2 * 3 and f["p50_ms"] > 0 for f in report["floor"].values())
    for audit in ("audit_off", "audit_on"):
        _stages_by_mode(report["embedded"][audit])
    keyword, hybrid = report["breakdown"]["keyword"], report["breakdown"]["hybrid"]
    assert "task.embed" not in keyword and {"task.embed", "task.fulltext", "validate.fuse", "audit_emit"} <= set(hybrid)
    assert set(report["ratios"]) == {"hybrid_over_embed_p50", "hybrid_minus_embed_p50_ms",
                                     "keyword_over_fulltext_leg_p50", "semantic_minus_embed_p50_ms",
                                     "audit_on_over_off_p50", "audit_on_over_off_block"}
    # a ratio of two p50s over 3 queries x 2 rounds: its value is the bench's to report, not this test's
    assert report["ratios"]["hybrid_over_embed_p50"] > 0


@pytest.mark.slow
def test_latency_bench_runs_on_a_synthetic_store(tmp_path):
    """``--synthetic N``: a synthetic lake of N memories (hash embedder), each side asked its own queries."""
    report = _latency_report(tmp_path / "work", tmp_path, "--embedded-only", "--synthetic", "600")
    assert report["synthetic"] == 600 and report["store"].endswith("lake-store-600") and report["queries"] == 3
    _stages_by_mode(report["embedded"]["audit_off"])
    assert report["floor"]["embed"]["n"] == 2 * 3


@pytest.mark.slow
def test_latency_bench_runs_through_redis(latency_work, tmp_path):
    report = _latency_report(latency_work, tmp_path)
    _stages_by_mode(report["broker"])
    assert set(report["ratios"]["broker_extra_ms_p50"]) == {"keyword", "semantic", "hybrid"}


@pytest.mark.slow
def test_writes_bench_writes_to_the_lake(tmp_path):
    """``ops.bench.writes``: the synthetic store migrated into a lake, a
    memory written there seen by another process, and a batch."""
    from ops.bench import writes

    out = tmp_path / "writes.json"
    assert writes.main(["--sizes", "600", "--no-pending", "--baseline-parts", "none", "--repeat", "2",
                        "--work", str(tmp_path / "work"), "--out", str(out)]) == 0
    side = json.loads(out.read_text())["600"]["lake"]
    # another process may see the commit before the writer's call returns (its post-commit
    # work), so visibility is bounded below by nothing but the write's start
    one = side["one_memory"]
    assert one["visible_s"] > 0 and one["ack_s"] > 0 and one["visible_after_ack_s"] >= 0
    assert one["writes"] == 2 and len(one["visible_each_s"]) == 2
    assert side["batch_1000_s"] > 0


@pytest.mark.slow
def test_the_blas_bench_compares_one_thread_with_the_default_idle_and_busy():
    """``ops.bench.embed --blas``: both sides, both hosts, and no spinning process left behind."""
    done = subprocess.run([sys.executable, "-m", "ops.bench.embed", "--blas", "--rounds", "2", "--queries", "3",
                           "--batch", "2"], capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(done.stdout)
    for host in ("idle", "busy"):
        sides = {k: v for k, v in report[host].items() if k != "ratios_one_over_default"}
        assert len(sides) == 2 and "one thread" in sides
        for figures in sides.values():
            assert figures["single_p95_ms"] >= figures["single_p50_ms"] > 0 and figures["batch_queries_per_s"] > 0
        assert set(report[host]["ratios_one_over_default"]) == {"single_p50_time", "single_p95_time",
                                                                "batch_throughput"}
    spinning = subprocess.run(["pgrep", "-f", "while True: pass"], capture_output=True, text=True)
    assert spinning.stdout.strip() == ""
