"""Text for a person: results as a table, errors as one safe line."""

from __future__ import annotations


def one_line(text: str) -> str:
    """An error message as one printable line: line breaks, control and
    bidirectional characters and invalid Unicode (from non-UTF-8 arguments)
    are written as escapes, so a hostile value cannot break or disguise it."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _leg_rank(result, leg: str) -> str:
    rank = result.ranks.get(leg)
    if rank is None:
        return "-"
    uncounted = leg in result.tied_ranks and result.tied_ranks[leg] is None
    return f"({rank})" if uncounted else str(rank)


def format_results(results) -> str:
    """A readable table: rank, fused score, each leg's rank (``fts``: full
    text, ``vec``: vector; ``-``: that leg did not return it; ``(12)``: it
    did, under the full-text floor, and fusion did not count it), id,
    namespace, preview, graph marks."""
    lines = []
    if not results.results:
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
            lines.append(f"{r.rank:>3}  {r.score:>8.5f}  {legs}  {r.id:<{width}}  {r.namespace[:12]:<12} {r.preview}")
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
