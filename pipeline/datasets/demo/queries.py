"""Query specs judged from the corpus itself: identifier look-ups and tag-based topical questions."""

from __future__ import annotations

from pipeline.datasets.demo import tables as T
from pipeline.datasets.demo.world import QuerySpec, World


def topical_from_tags(w: World) -> list[QuerySpec]:
    out = []
    for text, namespace, required in T.TOPICAL:
        judged = {
            d.key: d.grade
            for d in w.drafts
            if (namespace is None or d.namespace == namespace)
            and all(value in getattr(d, fld) for fld, value in required)
        }
        if judged:
            out.append(QuerySpec(text, namespace, "topical", judged))
    return out


def ident_queries(w: World, n_extra: int) -> list[QuerySpec]:
    """Every error code, plus ``n_extra`` other identifiers drawn at random."""
    holders: dict[str, list[int]] = {}
    for d in w.drafts:
        for value in d.idents:
            holders.setdefault(value, []).append(d.key)
    errors = [i for i in w.idents if i.kind == "error"]
    others = [i for i in w.idents if i.kind != "error"]
    chosen = errors + w.rng.sample(others, min(n_extra, len(others)))
    out = []
    seen: set[str] = set()
    for ident in chosen:
        if ident.value in seen:
            continue
        seen.add(ident.value)
        judged = {k: 1 for k in holders[ident.value]}
        judged[ident.primary] = 2
        text = w.rng.choice(T.IDENTIFIER_QUESTIONS[ident.kind]).format(x=ident.value)
        # Identifiers are unique corpus-wide, so some queries leave the namespace open.
        namespace = None if w.rng.random() < 0.3 else ident.namespace
        out.append(QuerySpec(text, namespace, "identifier", judged))
    return out
