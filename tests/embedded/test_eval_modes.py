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


def test_a_reused_name_is_refused_or_with_force_replaced_whole(cli_env, tmp_path, capsys):
    """A second run under the same --name mixed its files with the first's
    (--mode all's folders beside a keyword report.json): refused before any
    work, or with --force the folder is replaced whole."""
    queries, qrels = _queries_and_qrels(tmp_path)
    out = tmp_path / "out"
    args = ["eval", "--queries", str(queries), "--qrels", str(qrels), "--out", str(out), "--no-progress", "--name", "x"]
    assert main([*args, "--mode", "all"]) == 0
    capsys.readouterr()
    assert main([*args, "--mode", "keyword"]) == 2
    err = capsys.readouterr().err
    assert "--name" in err and "--force" in err and "already holds a run" in err and len(err.splitlines()) == 1
    assert (out / "x" / "modes.json").is_file() and not (out / "x" / "report.json").exists()  # left as it was
    assert main([*args, "--mode", "keyword", "--force", "--max-units", "0"]) == 2  # refused input removes nothing
    assert (out / "x" / "modes.json").is_file()
    assert main([*args, "--mode", "keyword", "--force"]) == 0
    assert sorted(p.name for p in (out / "x").iterdir() if p.is_dir()) == []  # no mode folders left over
    assert not (out / "x" / "modes.json").exists()
    assert json.loads((out / "x" / "report.json").read_text())["config"]["defaults"]["mode"] == "keyword"
    # replays and comparisons alike
    replay = ["eval", "replay", "--from-audit", "--out", str(out), "--name", "x", "--no-progress"]
    capsys.readouterr()
    assert main(replay) == 2 and "--force" in capsys.readouterr().err


def test_force_does_not_remove_a_folder_dimple_eval_did_not_write(cli_env, tmp_path, capsys):
    queries, qrels = _queries_and_qrels(tmp_path)
    mine = tmp_path / "out" / "notes"
    mine.mkdir(parents=True)
    (mine / "todo.txt").write_text("keep me", encoding="utf-8")
    assert main(["eval", "--queries", str(queries), "--qrels", str(qrels), "--out", str(tmp_path / "out"),
                 "--name", "notes", "--force", "--no-progress"]) == 2
    assert "did not write" in capsys.readouterr().err
    assert (mine / "todo.txt").read_text(encoding="utf-8") == "keep me"
