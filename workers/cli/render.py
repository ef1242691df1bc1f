"""Text for a person: results as a table, errors as one safe line."""

from __future__ import annotations

from pipeline.errors import one_line

__all__ = ["one_line"]


def _leg_rank(result, leg: str) -> str:
    rank = result.ranks.get(leg)
    if rank is None:
        return "-"
    return str(rank)

PREVIEW_CHARS = 80  # as the pipeline's preview


def around(content: str, query: str, width: int = PREVIEW_CHARS) -> str | None:
    """``width`` characters of ``content`` around the longest word of
    ``query`` it holds (case-insensitive), ``…`` marking what is cut; None
    when it holds none. A preview of the start may cut out the very
    identifier a query matched."""
    words = sorted({w.strip(".,;:!?\"'()[]") for w in query.split()}, key=lambda w: (-len(w), w))
    low = content.lower()
    for word in (w for w in words if len(w) >= 3):
        at = low.find(word.lower())
        if at < 0:
            continue
        start = max(0, min(at - (width - len(word)) // 3, len(content) - width))
        text = content[start:start + width].replace("\n", " ")
        return ("…" if start > 0 else "") + text + ("…" if start + width < len(content) else "")
    return None


def format_results(results, focus: str | None = None) -> str:
    """A readable table: rank, fused score, each leg's rank (``fts``: full
    text, ``vec``: vector; ``-``: that leg did not return it), id, namespace,
    preview (with ``focus``, the part of the content around its longest word,
    ``around``), graph marks."""
    lines = []
    if not results.results and results.truncation and results.truncation.left_out:
        t = results.truncation
        lines.append(f"no results for {results.query!r} ({results.mode}): the {t.by} budget (limit {t.limit}) "
                     f"cut all {t.left_out}" + (f" ({t.detail})" if t.detail else ""))
    elif not results.results:
        lines.append(f"no results for {results.query!r} ({results.mode})")
    else:
        width = max(len(r.id) for r in results.results)
        served = {r.id for r in results.results}
        lines.append(f"{'#':>3}  {'score':>8}  {'fts':>4} {'vec':>4}  {'id':<{width}}  {'namespace':<12} preview")
        for r in results.results:
            marks = []
            if r.promoted_above:
                found = "" if r.ranks else " (no leg found it: read for its supersession)"
                where = "placed above it" if r.promoted_above in served else "not in this list (hidden or past the budget)"
                marks.append(f"current version of {r.promoted_above}, {where}{found}")
            if r.superseded_by:
                marks.append("superseded by " + ", ".join(l.id for l in r.superseded_by))
            if r.conflicts:
                marks.append("conflicts " + ", ".join(l.id for l in r.conflicts))
            if r.supported_by:
                marks.append("supported by " + ", ".join(l.id for l in r.supported_by))
            legs = f"{_leg_rank(r, 'fts'):>4} {_leg_rank(r, 'vector'):>4}"
            preview = (around(r.content, focus) if focus else None) or r.preview
            lines.append(f"{r.rank:>3}  {r.score:>8.5f}  {legs}  {r.id:<{width}}  {r.namespace[:12]:<12} {preview}")
            for mark in marks:
                lines.append(f"{'':>3}  {'':>8}  {'':>9}  {'':<{width}}  {'':<12}   ↳ {mark}")
    tail = f"mode {results.mode}, {results.total_ms:.0f} ms"
    if results.hidden_superseded:
        tail += f", {results.hidden_superseded} superseded result(s) hidden for their successors"
    if results.truncated and results.truncation:
        t = results.truncation
        tail += f", truncated by {t.by} (limit {t.limit}, {t.left_out} left out)"
        if t.detail:
            tail += f": {t.detail}"
    lines.append(tail)
    return "\n".join(lines)


def format_explain(row, paths: list[dict], replay: dict | None = None) -> str:
    """``dimple audit explain``'s text: the query and its legs, each result's
    path (``pipeline.audit.explain``), the budget cut, and the replay's verdict
    (``workers.api.replay_row``) when there is one."""
    lines: list[str] = []
    lines.append(f"query {row.query_id} ({row.mode}, hash {row.query_hash} of the {row.hash_of}): {row.query_text!r}")
    legs = row.query_profile.get("legs", {})
    for name, leg in legs.items():
        lines.append(f"  leg {name}: ran={leg['ran']} weight={leg['weight']} hits={leg['hits']} top={leg['top_scores'][:3]}")
    for p in paths:
        if "rrf_contributions" in p:
            fused = "rrf {:.5f} = {}".format(p["rrf"], " + ".join(
                f"{leg} {w:.5f} (rank {p['leg_ranks'][leg]})" for leg, w in p["rrf_contributions"].items())
                or "no leg found it")
        else:  # no per-leg terms: the row keeps ranks, not the scores the normalisation read
            fused = f"{p['fusion']} {p['rrf']:.5f} (" + (", ".join(
                f"{leg} rank {r}" for leg, r in sorted(p["leg_ranks"].items())) or "no leg found it") + ")"
        boost = row.options.get("recency_boost") or 0
        recency = f" x (1 + {boost} x recency {p['recency_factor']:.3f})" if p["recency_factor"] is not None else ""
        above = f"; promoted above {p['promoted_above']}, which it supersedes" if p.get("promoted_above") else ""
        lines.append(f"  #{p['rank']:<3} {p['id']}: {fused}{recency} -> {p['score']:.5f}{above}")
    if row.truncated and row.truncation:
        t = row.truncation
        lines.append(f"  cut by {t['by']} (limit {t['limit']}): {t['left_out']} result(s) left out" + (f"; {t['detail']}" if t.get("detail") else ""))
    if replay is not None:
        logged = f" (run on the workers, logged as query {replay['logged_as']})" if replay.get("logged_as") else ""
        lines.append(f"  replay now: {replay['verdict']}{logged}")
        for line in replay["changes"]:
            lines.append(f"    {line}")
    return "\n".join(lines)


def format_why_not(answer) -> str:
    """``dimple audit explain QUERY_ID --why-not MEMORY_ID``'s text
    (``pipeline.audit.whynot.WhyNot``): the verdict, the stage that dropped the
    memory with its numbers, then what each leg and the fusion did with it."""
    lines = [f"query {answer.query_id}: {answer.query!r}"]
    if answer.stage is None:
        lines.append(f"why not {answer.memory_id}? {answer.summary}")
    else:
        lines.append(f"why not {answer.memory_id}? dropped by {answer.stage} ({answer.reason.value})")
        lines += [f"  {d.stage}: {d.detail}" for d in answer.drops]
    v, f, p = answer.vector, answer.fulltext, answer.placement
    if v is not None and v.status == "not_run":
        lines.append("  vector leg: did not run")
    elif v is not None:
        at = f"rank {v.rank}, cosine {v.cosine:.4f}" if v.rank is not None else v.status.replace("_", " ")
        at = f"below its top {v.top_k}: {at}" if v.status == "below_top_k" else at
        leaf = f", leaf {v.leaf}" if v.leaf else ""
        lines.append(f"  vector leg: {at} (top {v.top_k}, {v.hits} hits{leaf})")
    if f is not None and f.status == "not_run":
        lines.append("  full-text leg: did not run")
    elif f is not None:
        at = f"rank {f.rank}, BM25 {f.bm25:.4f}" if f.rank is not None else f.status.replace("_", " ")
        at = f"below its top {f.top_k}: {at}" if f.status == "below_top_k" else at
        lines.append(f"  full-text leg: {at} (top {f.top_k}, {f.hits} hits)")
    if p is not None:
        cut = f"; cut by {p.cut_by} (limit {p.limit})" if p.cut_by else ""
        lines.append(f"  fused: rank {p.rank}, score {p.score:.5f}; {p.kept} kept{cut}")
    version = f"store version {answer.replayed_version}"
    lines.append(f"  replayed here on {version}: " + ("the same list as logged" if answer.replay_same
                                                      else "a different list than logged"))
    if answer.caveat:
        lines.append(f"  note: {answer.caveat}")
    return "\n".join(lines)


def format_compacted(report) -> str:
    """What ``dimple compact`` did (``maintenance.compact``'s report), in one line."""
    removed = f"; removed {len(report.removed)} file(s) no reader needs" if report.removed else ""
    if not report.ran:
        return f"nothing to compact (store version {report.version}){removed}"
    erased = (f"; {report.forgotten} forget(s) erased from every file and the catalog (older snapshots expired)"
              if report.forgotten else "")
    if report.erase_held_until:
        erased = (f"; the erase waits for files a compaction or a write that died left (they may hold forgotten bytes): "
                  f"the forgets stay listed, erased by the first compaction from {report.erase_held_until} UTC")
    return (f"compacted the lake: {report.base} holds {report.memories} memories{erased}, in "
            f"{report.seconds:.1f}s (store version {report.version}){removed}")


def format_stats(stats: dict, configured_model: str, configured_identity: str) -> str:
    """``dimple stats``' lines (``stats``: what ``--json`` prints; the model the
    settings name, and its identity as a store records it)."""
    lines: list[str] = []
    seg = stats["segments"]
    lines.append(f"store       {stats['path']} (schema {stats['schema_version']}, store version {seg['version']})")
    lines.append(f"deltas      {seg['deltas']} pending ({seg['delta_memories']} memories written, "
                 f"{seg['delta_forgotten']} forgotten), merged into the base by the next compaction")
    lines.append(f"model       {stats['embedding_model']} ({stats['embedding_dim']}-d)")
    if stats["embedding_model"] not in ("unknown", configured_identity):
        lines.append(f"            not the configured {configured_model}: vector queries and writes are refused "
                     "(README: 'Changing the embedding model')")
    lines.append(f"memories    {stats['memories']} in {stats['namespaces']} namespace(s)")
    for ns, n in stats["by_namespace"].items():
        lines.append(f"  {ns:<24} {n}")
    lines.append("types       " + ", ".join(f"{k} {v}" for k, v in stats["by_content_type"].items()))
    lines.append("edges       " + (", ".join(f"{k} {v}" for k, v in stats["edges"].items()) or "none"))
    t = stats["tree"]
    lines.append(f"tree        depth {t['depth']}, {t['leaves']} leaves, largest leaf {t['largest_leaf']}")
    lines.append(f"full-text   {'fresh' if stats['fts']['fresh'] else 'STALE: run dimple reindex'}")
    erase = stats["erase"]
    if erase and erase["waiting"]:
        held = (f"; waits for files a compaction or a write that died left, erased from {erase['held_until']} UTC"
                if erase["held_until"] else "")
        lines.append(f"forgets     {erase['waiting']} waiting to be erased from every file, the oldest of "
                     f"{erase['oldest']} UTC (due from {erase['due_from']} UTC){held}")
    else:
        lines.append("forgets     none waiting to be erased")
    return "\n".join(lines)
