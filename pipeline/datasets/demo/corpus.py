"""Assembly: build the world for a seed, number the memories, order the queries; the public functions."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.datasets.demo import tables as T
from pipeline.datasets.demo.everyday import build_code_everyday, build_messages_everyday
from pipeline.datasets.demo.planted import build_chain, build_conflict, build_incident, build_supports
from pipeline.datasets.demo.queries import ident_queries, topical_from_tags
from pipeline.datasets.demo.world import World, iso


@dataclass
class _Built:
    records: list[dict[str, Any]]
    queries: list[dict[str, Any]]
    qrels: dict[str, dict[str, int]]


def _build(seed: int) -> _Built:
    w = World(random.Random(seed))
    for chain in T.CHAINS:
        build_chain(w, chain)
    for conflict in T.CONFLICTS:
        build_conflict(w, conflict)
    for incident in T.INCIDENTS:
        build_incident(w, incident)
    build_supports(w)
    build_code_everyday(w)
    build_messages_everyday(w)

    # Ids follow creation time within a namespace, like an agent that appends.
    ids: dict[int, str] = {}
    for namespace, prefix in (("code", "code"), ("messages", "msg")):
        ordered = sorted((d for d in w.drafts if d.namespace == namespace), key=lambda d: (d.when, d.key))
        for n, d in enumerate(ordered, start=1):
            ids[d.key] = f"{prefix}-{n:04d}"
    records = [
        {
            "id": ids[d.key],
            "namespace": d.namespace,
            "content": d.content,
            "content_type": d.content_type,
            "created_at": iso(d.when),
            "topics": d.topics,
            "concepts": d.concepts,
            "supersedes": sorted(ids[k] for k in d.supersedes),
            "conflicts": sorted(ids[k] for k in d.conflicts),
            "supported_by": sorted(ids[k] for k in d.supported_by),
            "metadata": d.metadata,
        }
        for d in sorted(w.drafts, key=lambda d: ids[d.key])
    ]

    specs = (
        ident_queries(w, 13)
        + w.paraphrases
        + w.rng.sample(w.optional_paraphrases, 7)
        + w.topical
        + topical_from_tags(w)
    )
    w.rng.shuffle(specs)
    queries: list[dict[str, Any]] = []
    qrels: dict[str, dict[str, int]] = {}
    for n, spec in enumerate(specs, start=1):
        qid = f"q{n:03d}"
        queries.append({"id": qid, "text": spec.text, "namespace": spec.namespace, "kind": spec.kind})
        qrels[qid] = {ids[k]: g for k, g in sorted(spec.judged.items(), key=lambda kv: ids[kv[0]])}
    return _Built(records, queries, qrels)


def generate_corpus(seed: int = 7) -> list[dict[str, Any]]:
    """The demo memories for ``seed``: ingest records sorted by id.

    Same seed, same records (byte for byte once serialised). Ids are
    ``code-NNNN`` / ``msg-NNNN`` in creation order; every edge points to a
    record in the list; chain members are strictly newer than what they
    supersede; all timestamps lie in 2025-01-01..2025-09-30 UTC.
    """
    return _build(seed).records


def generate_queries(
    corpus: list[dict[str, Any]], seed: int = 7
) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """Queries and graded judgments (1 relevant, 2 best answer) for the corpus of ``seed``.

    Judgments come from what the generator planted, not from searching. The
    corpus must be ``generate_corpus(seed)`` (judged ids are checked against it);
    a mismatch raises ``ValueError`` rather than returning judgments that
    silently point at the wrong memories.
    """
    built = _build(seed)
    given = {r.get("id"): r.get("content") for r in corpus}
    expected = {r["id"]: r["content"] for r in built.records}
    for judged in built.qrels.values():
        for memory_id in judged:
            if given.get(memory_id) != expected[memory_id]:
                raise ValueError(f"corpus does not match seed {seed}: memory {memory_id!r} differs or is missing")
    return built.queries, built.qrels


def _jsonl(rows: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_demo(directory: Path, seed: int = 7) -> dict[str, Path]:
    """Write ``memories.jsonl``, ``queries.jsonl`` and ``qrels.tsv`` into ``directory``.

    Creates the directory. ``qrels.tsv`` is header-free TREC qrels:
    ``query_id<TAB>0<TAB>doc_id<TAB>grade``. Output is deterministic for a seed.
    Returns the three paths keyed ``memories``, ``queries``, ``qrels``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    built = _build(seed)
    paths = {
        "memories": directory / "memories.jsonl",
        "queries": directory / "queries.jsonl",
        "qrels": directory / "qrels.tsv",
    }
    paths["memories"].write_text(_jsonl(built.records), encoding="utf-8")
    paths["queries"].write_text(_jsonl(built.queries), encoding="utf-8")
    paths["qrels"].write_text(
        "".join(f"{qid}\t0\t{doc}\t{grade}\n" for qid, judged in built.qrels.items() for doc, grade in judged.items()),
        encoding="utf-8",
    )
    return paths
