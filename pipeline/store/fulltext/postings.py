"""The base's full-text postings in process memory, scored with numpy.

The FTS extension builds the index and ``pipeline.store.fulltext.index``
derives one posting list per term (``fts_postings``); a base never changes,
so a query process reads those lists once, with the base (in the background
after a compaction, like the vector index), and a query then costs its terms'
postings in numpy, with no SQL on its path: terms come from ``QueryTerms``
(the index's own tokenizer rule and stemmer, cached), scope codes and dead
memories are masks, and the top ``limit`` an ``argpartition``.

Layout (per base of N memories with P postings and V terms): ``docid`` int32
and ``tf`` int32 per posting, CSR by term id (``start``, int64 per term);
length, namespace and content-type codes per memory (int32 each); the ids
by docid (Python strings, as the vector index holds them); the term
dictionary (a dict). At 100k synthetic memories about 8 MB of postings and
10 MB of ids and terms; the figure per million is in BENCHMARKS.md. The
arrays are what the host cache (``pipeline.store.hostcache``) writes once
per host and every process memory-maps (``read_parts``, ``from_parts``); the
ids and the term dictionary stay per process.

Scores are BM25 as ``pipeline.store.fulltext.bm25`` gives it, formula for
formula, float64, ties by docid (the rank of the memory id), so
rankings equal the SQL path's and ``match_bm25``'s.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from pipeline.contracts import Scope
from pipeline.settings import FulltextSettings
from pipeline.store.fulltext.bm25 import bm25
from pipeline.store.fulltext.terms import QueryTerms


@dataclass
class Postings:
    """One base's posting lists and per-memory columns (see the module doc)."""

    terms: dict[str, int]  # term -> termid
    start: np.ndarray  # int64, postings of termid t are [start[t], start[t + 1])
    docid: np.ndarray  # int32
    tf: np.ndarray  # int32
    df: np.ndarray  # int32 by termid
    lens: np.ndarray  # float64 by docid
    ns: np.ndarray  # int32 by docid
    ct: np.ndarray  # int32 by docid
    ids: list[str]  # by docid
    labels: dict[tuple[str, str], int]  # (kind, label) -> code
    num_docs: int
    total_len: int
    _local: threading.local = field(default_factory=threading.local, repr=False)
    # the base's query rule per settings: its stopwords read once, its stems cached
    _rules: dict[tuple[str, str, str], QueryTerms | None] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, con, chunk: int = 2_000_000) -> Postings:
        """The postings of the base ``con`` reads (``read_parts``)."""
        return cls.from_parts(*read_parts(con, chunk))

    @classmethod
    def from_parts(cls, arrays: dict[str, np.ndarray], lists: dict[str, list]) -> Postings:
        """The postings from what ``read_parts`` gives (or the host cache holds:
        ``pipeline.store.hostcache``); the arrays are used as they are."""
        lens = arrays["lens"]
        return cls(terms=dict(zip(lists["terms"], lists["termids"], strict=True)), start=arrays["start"],
                   docid=arrays["docid"], tf=arrays["tf"], df=arrays["df"], lens=lens, ns=arrays["ns"],
                   ct=arrays["ct"], ids=lists["ids"],
                   labels={(k, lab): int(c) for k, lab, c in lists["labels"]},
                   num_docs=len(lens), total_len=int(lens.sum()))

    @property
    def nbytes(self) -> int:
        """Memory held, arrays and (roughly) the Python strings of ids and terms."""
        arrays = sum(a.nbytes for a in (self.start, self.docid, self.tf, self.df, self.lens, self.ns, self.ct))
        strings = sum(len(s) + 57 for s in self.ids) + sum(len(t) + 57 + 36 for t in self.terms)
        return arrays + strings

    def query_terms(self, con, settings: FulltextSettings) -> QueryTerms | None:
        """This base's ``QueryTerms`` for ``settings`` (``con`` reads its index's
        stopwords the first time), None where only the SQL macro applies."""
        key = (settings.ignore, settings.stemmer, settings.stopwords)
        if key not in self._rules:
            self._rules[key] = QueryTerms.of(con, settings)
        return self._rules[key]

    def termids(self, terms: list[str]) -> dict[str, int]:
        return {t: tid for t in terms if (tid := self.terms.get(t)) is not None}

    def postings(self, termid: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.start[termid], self.start[termid + 1]
        return self.docid[lo:hi], self.tf[lo:hi]

    def dead_per_term(self, termids: list[int], dead: np.ndarray | None) -> dict[int, int]:
        """How many of each term's postings belong to dead memories (``dead``: a mask by docid)."""
        if dead is None:
            return {}
        return {t: int(np.count_nonzero(dead[self.postings(t)[0]])) for t in termids}

    def search(self, termids: dict[str, int], scope: Scope, limit: int, k1: float, b: float, *,
               n: int, avgdl: float, df: dict[str, int] | None = None,
               dead: np.ndarray | None = None) -> list[tuple[str, float]] | None:
        """Top ``limit`` (id, score) of the base for the query terms ``termids``
        within ``scope`` (namespace and content types; None when the scope
        names topics or concepts, which the SQL path filters), with corpus
        statistics ``n``, ``avgdl`` and ``df`` (the base's own when None),
        skipping docids where ``dead`` is set. Ties by docid (= by id)."""
        if scope.topics or scope.concepts:
            return None
        if not termids or not n or limit <= 0:
            return []
        allowed = self._scope_codes(scope)
        if allowed is None:
            return []
        acc = self._accumulator()
        scores, seen = acc.scores, acc.seen
        acc.stamp += 1
        stamp = acc.stamp
        parts = []
        for term, tid in termids.items():
            docs, tf = self.postings(tid)
            if not len(docs):
                continue
            d = df[term] if df is not None else int(self.df[tid])
            scores[docs] += bm25(tf, self.lens[docs], d, n, avgdl, k1, b)
            parts.append(docs[seen[docs] != stamp])
            seen[docs] = stamp
        if not parts:
            return []
        cand = np.concatenate(parts) if len(parts) > 1 else parts[0]
        got = scores[cand]
        scores[cand] = 0.0
        keep = np.ones(len(cand), dtype=bool)
        if dead is not None:
            keep &= ~dead[cand]
        ns_code, ct_codes = allowed
        if ns_code is not None:
            keep &= self.ns[cand] == ns_code
        if ct_codes is not None:
            keep &= np.isin(self.ct[cand], ct_codes)
        if not keep.all():
            cand, got = cand[keep], got[keep]
        if len(cand) > limit:
            # the limit-th best score, then every candidate at least as good
            # (ties at the cut are kept and ordered by docid below)
            cut = np.partition(got, len(got) - limit)[len(got) - limit]
            top = got >= cut
            cand, got = cand[top], got[top]
        order = np.lexsort((cand, -got))[:limit]
        return [(self.ids[c], float(s)) for c, s in zip(cand[order].tolist(), got[order].tolist(), strict=True)]

    def _scope_codes(self, scope: Scope) -> tuple[int | None, np.ndarray | None] | None:
        """(namespace code or None, content-type codes or None); None: nothing can match."""
        ns_code = None
        if scope.namespace is not None:
            ns_code = self.labels.get(("namespace", scope.namespace))
            if ns_code is None:
                return None
        ct_codes = None
        if scope.content_types:
            ct_codes = np.asarray([c for t in scope.content_types
                                   if (c := self.labels.get(("content_type", t))) is not None], dtype=np.int32)
            if not len(ct_codes):
                return None
        return ns_code, ct_codes

    def _accumulator(self) -> _Accumulator:
        acc = getattr(self._local, "acc", None)
        if acc is None:
            acc = self._local.acc = _Accumulator(np.zeros(self.num_docs, dtype=np.float64),
                                                 np.zeros(self.num_docs, dtype=np.int64), 0)
        return acc


def read_parts(con, chunk: int = 2_000_000) -> tuple[dict[str, np.ndarray], dict[str, list]]:
    """Read the base's ``fts_postings``, ``fts_docs``, ``fts_terms`` and
    ``fts_labels``: the postings by ranges of term ids of about ``chunk``
    postings each, with no sort in DuckDB (a query process's DuckDB memory
    limit is small; 32M postings at 1M memories). The arrays (``start``,
    ``docid``, ``tf``, ``df``, and by docid ``lens``, ``ns``, ``ct``) and the
    lists (``terms`` with their ``termids``, ``ids`` by docid, ``labels`` as
    [kind, label, code]) a ``Postings`` is made of."""
    terms = dict(con.execute("SELECT term, termid FROM fts_terms").fetchall())
    listed = con.execute("SELECT termid, df FROM fts_postings").fetchnumpy()
    listed_ids = np.asarray(listed["termid"], dtype=np.int64)
    size = int(max(max(terms.values(), default=-1), listed_ids.max(initial=-1))) + 1
    df = np.zeros(size, dtype=np.int32)
    df[listed_ids] = listed["df"]
    start = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(df, out=start[1:])
    docid = np.empty(int(start[-1]), dtype=np.int32)
    tf = np.empty(int(start[-1]), dtype=np.int32)
    lo = 0
    while lo < size:  # term ids [lo, hi) hold about ``chunk`` postings
        hi = max(int(np.searchsorted(start, start[lo] + chunk, side="right")) - 1, lo + 1)
        got = con.execute(
            "SELECT termid, p.docid AS docid, p.tf AS tf FROM "
            "(SELECT termid, unnest(postings) AS p FROM fts_postings WHERE termid >= ? AND termid < ?)",
            [lo, hi]).fetchnumpy()
        t = np.asarray(got["termid"], dtype=np.int64)
        order = np.argsort(t, kind="stable")
        t = t[order]
        # each term's postings go to its CSR slice, in the order read
        pos = start[t] + (np.arange(len(t)) - np.searchsorted(t, t, side="left"))
        docid[pos] = np.asarray(got["docid"])[order]
        tf[pos] = np.asarray(got["tf"])[order]
        lo = hi
    docs = con.execute("SELECT docid, id, len, ns, ct FROM fts_docs").fetchnumpy()
    by_docid = np.argsort(np.asarray(docs["docid"]), kind="stable")
    labels = [[k, lab, int(c)] for k, lab, c in con.execute("SELECT kind, label, code FROM fts_labels").fetchall()]
    arrays: dict[str, np.ndarray] = {"start": start, "docid": docid, "tf": tf, "df": df,
              "lens": np.asarray(docs["len"], dtype=np.float64)[by_docid],
              "ns": np.asarray(docs["ns"], dtype=np.int32)[by_docid],
              "ct": np.asarray(docs["ct"], dtype=np.int32)[by_docid]}
    return arrays, {"terms": list(terms), "termids": list(terms.values()),
                    "ids": [str(i) for i in np.asarray(docs["id"], dtype=object)[by_docid]], "labels": labels}


@dataclass
class _Accumulator:
    """Per thread: dense scores (zero between queries) and a seen stamp per docid."""

    scores: np.ndarray
    seen: np.ndarray
    stamp: int
