"""The query canvas: flat, one chord for the two legs.

    chain(chord(group(chain(embed, descend), fulltext), fuse), augment, scope, budget)

The full-text leg does not wait for the embedding, and a batch that needs no
embedding (queries given with their vectors) leaves ``search.embed`` out, so
it never waits on the ``embed`` queue. A leg no query of the batch wants
(``Batch.legs``: the vector leg of a keyword batch, the full-text leg of a
semantic one) is left out too: the chord's header is then the other leg
alone, and fusion records the missing leg as not run, as the leg's own stage
would have. The order is the one ``pipeline.stages.registry`` declares (and
``run_local`` runs in-process, every leg).

With ``expires`` (an ISO-8601 time, the query's deadline) every stage's
message carries it: a worker discards a stage it receives after then instead
of running it (Celery marks it revoked, acknowledges it, and the canvas stops
there), so a query its caller gave up on never runs later, audit row included.
"""

from __future__ import annotations

from uuid import uuid4

from celery import Celery, chain, chord, group

from pipeline.contracts import LEGS
from pipeline.stages.registry import AFTER_FUSION, FULLTEXT_LEG, FUSION, VECTOR_LEG

from .tasks import stage_task_id


def query_canvas(app: Celery, batch: dict, expires: str | None = None, canvas_id: str | None = None, *,
                 embed: bool = True, legs: tuple[str, ...] = LEGS):
    """The canvas for ``batch``; its last stage's task id is ``canvas_id`` (new
    by default) and every other stage's derives from it (``tasks.stage_task_id``),
    so a stage delivered again after its query was answered is not run again.
    ``embed=False`` (``Batch.needs_embedding`` false) leaves ``search.embed`` out;
    ``legs`` (``Batch.legs``) names the legs that run."""
    cid = canvas_id or str(uuid4())
    vector_leg = VECTOR_LEG if embed else VECTOR_LEG[1:]  # (search.embed, search.descend): descend alone

    def sig(name: str, *args):
        options = {"task_id": stage_task_id(cid, name)} | ({"expires": expires} if expires else {})
        return app.tasks[name].s(*args).set(**options)

    def steps(sigs: list):
        # in the shape ``chain(*sigs)`` folds to, built as it stands: no
        # signature cloned on the way (``_fold_chain`` clones each step but
        # the last, and merges the stages after fusion into the chord's body
        # one ``|`` at a time: ~0.2 ms of a query, ``ops.bench.latency``)
        return chain(sigs, app=app)

    def leg(names: tuple[str, ...]):
        first, *rest = names
        sigs = [sig(first, batch)] + [sig(n) for n in rest]
        return steps(sigs) if rest else sigs[0]

    header = [leg(names) for name, names in (("vector", vector_leg), ("fts", FULLTEXT_LEG)) if name in legs]
    # chain(chord(group(*header), fuse), augment, scope, budget), as Celery folds it:
    # one chord whose body is the stages from fusion on
    body = steps([sig(FUSION), *(sig(name) for name in AFTER_FUSION)])
    return steps([chord(group(*header), body)])
