"""``dimple eval --mode all`` end to end on the in-process pipeline: every
mode on the same store in one run, one table, hybrid's paired test against
each leg, and each mode's figures equal to a run of that mode on its own."""

from __future__ import annotations

import json

from pipeline.contracts import Mode
from tests.embedded.test_evaluation import TOPICS, _queries_and_qrels, cli_env  # noqa: F401  (fixture)
from workers.cli import main


def test_mode_all_runs_every_mode_on_one_store_with_the_paired_test(cli_env, tmp_path, capsys):
    queries, qrels = _queries_and_qrels(tmp_path)
    out = tmp_path / "out"
    args = ["eval", "--queries", str(queries), "--qrels", str(qrels), "--out", str(out), "--no-progress"]
    assert main([*args, "--name", "every", "--mode", "all"]) == 0
    printed = capsys.readouterr().out
    root = out / "every"
    summary = json.loads((root / "modes.json").read_text())
    modes = [m.value for m in Mode]
    assert summary["modes"] == modes
    assert summary["queries"] == len(TOPICS)
    # one store: every mode's queries read the same store version
    versions = set(summary["store_versions"].values())
    assert len(versions) == 1 and None not in versions
    for mode in modes:
        report = json.loads((root / mode / "report.json").read_text())
        assert report["answered"] == len(TOPICS) and report["config"]["defaults"]["mode"] == mode
        assert summary["metrics"][mode] == report["metrics"]
        # the same figures as that mode run on its own
        assert main([*args, "--name", f"alone-{mode}", "--mode", mode]) == 0
        alone = json.loads((out / f"alone-{mode}" / "report.json").read_text())
        assert alone["metrics"] == report["metrics"], mode
    capsys.readouterr()
    tests = {t["leg"]: t for t in summary["tests"]}
    assert set(tests) == {"keyword", "semantic"}
    for leg, t in tests.items():
        assert 0.0 <= t["p_value"] <= 1.0
        assert t["significant"] == (t["p_value"] < summary["max_p"])
        hybrid, other = summary["metrics"]["hybrid"]["ndcg@10"], summary["metrics"][leg]["ndcg@10"]
        assert abs(t["mean_delta"] - (hybrid - other)) < 1e-5
        compared = json.loads((root / f"hybrid-vs-{leg}" / "compare.json").read_text())
        assert compared["runs"] == [leg, "hybrid"]
    for mode in modes:
        assert f"  {mode} " in printed
    assert "hybrid - keyword" in printed and "hybrid - semantic" in printed and "p=" in printed
    assert (root / "modes.md").is_file()
