"""The DuckDB FTS extension's own ``match_bm25``, evaluated over every row:
the reference the full-text leg is checked and benchmarked against (it was
dimple's full-text leg before issue 7; a full scan, ~3 s per query at 1M).

It is given the query's words, ``analyze``d as a memory's text is before
the extension indexes it, less the index's stopwords: the leg drops them
before stemming, as the index does from a memory, where ``match_bm25`` would
stem them and match "at" against "ate" (``pipeline.store.fulltext.QueryTerms``)."""

from __future__ import annotations

import math

from pipeline.contracts import Scope
from pipeline.settings import FulltextSettings
from pipeline.store.fulltext import analyze

REFERENCE_SQL = """
SELECT id, score FROM (
    SELECT m.id, fts_main_memories.match_bm25(m.id, $q, k := $k1, b := $b) AS score
    FROM memories m
    WHERE ($ns IS NULL OR m.namespace = $ns)
      AND (len($types) = 0 OR list_contains($types, m.content_type))
      AND (len($topics) = 0 OR m.id IN (
            SELECT memory_id FROM memory_topics WHERE list_contains($topics, topic_key)))
      AND (len($concepts) = 0 OR m.id IN (
            SELECT memory_id FROM memory_concepts WHERE list_contains($concepts, concept)))
) WHERE score IS NOT NULL
ORDER BY score DESC, id
LIMIT $limit
"""


def match_bm25(con, text: str, scope: Scope, limit: int, settings: FulltextSettings) -> list[tuple[str, float]]:
    """Top ``limit`` (id, score) by the extension's ``match_bm25``, ties by id."""
    if not text.strip():
        return []
    params = {
        "q": without_stopwords(con, analyze(text)), "k1": settings.k1, "b": settings.b, "ns": scope.namespace,
        "types": list(scope.content_types), "topics": list(scope.topics),
        "concepts": list(scope.concepts), "limit": limit,
    }
    return [(r[0], float(r[1])) for r in con.execute(REFERENCE_SQL, params).fetchall()]


def without_stopwords(con, text: str) -> str:
    """``text``'s tokens (the index's ``tokenize`` macro) that are not the index's stopwords."""
    row = con.execute(
        "SELECT coalesce(string_agg(w, ' '), '') FROM (SELECT unnest(fts_main_memories.tokenize($q)) AS w) "
        "WHERE w NOT IN (SELECT sw FROM fts_main_memories.stopwords)", {"q": text}).fetchone()
    return row[0]


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=rel)


def same_ranking(ref: list[tuple[str, float]], got: list[tuple[str, float]], k: int) -> tuple[bool, str]:
    """Whether ``got`` (a top ``k``) is the top ``k`` of ``ref`` (a longer list
    from the reference): equal scores position by position (to 1e-9, the
    last-bit differences of summing in another order), the same ids in the
    same order except among equal scores, where both sides break ties by id
    but a last-bit difference may swap them. Returns (same, why not)."""
    head = ref[:k]
    if len(got) != len(head):
        return False, f"{len(got)} hits, reference {len(head)}"
    for pos, ((rid, rs), (gid, gs)) in enumerate(zip(head, got)):
        if not close(rs, gs):
            return False, f"rank {pos + 1}: score {gs!r} ({gid}), reference {rs!r} ({rid})"
    i = 0
    while i < len(head):
        j = i
        while j + 1 < len(head) and close(head[j + 1][1], head[i][1]):
            j += 1
        got_ids = {g for g, _ in got[i : j + 1]}
        if j + 1 < len(head):
            want = {r for r, _ in head[i : j + 1]}
            if got_ids != want:
                return False, f"ranks {i + 1}-{j + 1}: {sorted(got_ids)} against {sorted(want)}"
        else:  # the run cut by k: any members of the reference's tied run will do
            run = {r for r, s in ref if close(s, head[i][1])}
            if not got_ids <= run:
                return False, f"ranks {i + 1}-{j + 1}: {sorted(got_ids - run)} not tied in the reference"
        i = j + 1
    return True, ""
