"""``ops.bench.fusion_bm25`` on constructed caches: BM25 variants are read
one folder each and refused when mixed or over other sets, the references
(the legs) are the settings' variant's, and leaving one set out can choose
another variant's (k1, b) with the alpha."""

from __future__ import annotations

import json

import pytest

from ops.bench import fusion_bm25
from pipeline.settings import FulltextSettings

NOW = {"k1": FulltextSettings().k1, "b": FulltextSettings().b}
OTHER = {"k1": NOW["k1"] + 0.5, "b": 0.75}


def _cache(name: str, bm25: dict, fts_finds: bool) -> dict:
    # the relevant d1 is the vector leg's 3rd; the full-text leg puts it 1st (fts_finds) or leaves it out
    fts = [["d1", 9.0], ["d5", 1.0]] if fts_finds else [["d5", 9.0], ["d6", 1.0]]
    return {"set": name, "n_docs": 100, "bm25": bm25, "queries": [
        {"id": "q1", "text": "a", "qrels": {"d1": 1}, "terms": [["x", 3]],
         "vector": [["d2", 0.9], ["d3", 0.8], ["d1", 0.7]], "fts": fts}]}


def _write(folder, caches):
    folder.mkdir()
    for c in caches:
        (folder / f"{c['set']}.json").write_text(json.dumps(c), encoding="utf-8")
    return folder


def test_variants_are_read_per_folder_and_refused_when_mixed_or_over_other_sets(tmp_path):
    now = _write(tmp_path / "now", [_cache(s, NOW, False) for s in "abc"])
    other = _write(tmp_path / "other", [_cache(s, OTHER, True) for s in "abc"])
    variants = fusion_bm25.load([now, other])
    assert sorted(variants) == sorted([fusion_bm25.variant(NOW), fusion_bm25.variant(OTHER)])
    mixed = _write(tmp_path / "mixed", [_cache("a", NOW, False), _cache("b", OTHER, False)])
    with pytest.raises(SystemExit, match="one BM25 variant"):
        fusion_bm25.load([mixed])
    again = _write(tmp_path / "again", [_cache(s, OTHER, False) for s in "abc"])
    with pytest.raises(SystemExit, match="hold the same BM25 variant"):
        fusion_bm25.load([now, other, again])  # one would silently replace the other
    fewer = _write(tmp_path / "fewer", [_cache(s, {"k1": 2.0, "b": 0.1}, False) for s in "ab"])
    with pytest.raises(SystemExit, match="different sets"):
        fusion_bm25.load([now, fewer])


def test_the_references_are_the_settings_variant_and_another_variant_can_be_chosen(tmp_path):
    now = _write(tmp_path / "now", [_cache(s, NOW, False) for s in "abc"])
    other = _write(tmp_path / "other", [_cache(s, OTHER, True) for s in "abc"])
    result = fusion_bm25.joint(fusion_bm25.load([now, other]), fusion_bm25.variant(NOW))
    t = result["table"]
    assert t["fts only"]["a"]["recall@10"] == 0.0  # the settings' full-text leg misses d1
    assert result["keyword"][fusion_bm25.variant(OTHER)]["a"]["ndcg@10"] == 1.0  # the other finds it first
    theirs = f"{fusion_bm25.variant(OTHER)} · convex a=0.1"
    assert result["family"][theirs] == "convex+bm25"
    assert result["family"][f"{fusion_bm25.variant(NOW)} · convex a=0.1"] == "convex"
    only_now = fusion_bm25.leave_one_out(result, ("convex",))
    both = fusion_bm25.leave_one_out(result, ("convex", "convex+bm25"))
    assert only_now["final"].startswith(fusion_bm25.variant(NOW))
    assert both["final"].startswith(fusion_bm25.variant(OTHER)) and both["left_out_mean"] > only_now["left_out_mean"]
    with pytest.raises(SystemExit, match="no cache of the settings' BM25"):
        fusion_bm25.joint(fusion_bm25.load([other]), fusion_bm25.variant(NOW))
