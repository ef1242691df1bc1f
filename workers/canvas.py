"""The query canvas: flat, one chord for the two legs.

    chain(chord(group(chain(embed, descend), fulltext), fuse), augment, scope, budget)

The full-text leg does not wait for the embedding. The order is the one
``pipeline.stages.registry`` declares (and ``run_local`` runs in-process).

With ``expires`` (an ISO-8601 time, the query's deadline) every stage's
message carries it: a worker discards a stage it receives after then instead
of running it (Celery marks it revoked, acknowledges it, and the canvas stops
there), so a query its caller gave up on never runs later, audit row included.
"""

from __future__ import annotations

from celery import chain, chord, group

from pipeline.stages.registry import AFTER_FUSION, FULLTEXT_LEG, FUSION, VECTOR_LEG

from .tasks import STAGE_TASKS


def _sig(name: str, *args, expires: str | None):
    sig = STAGE_TASKS[name].s(*args)
    return sig.set(expires=expires) if expires else sig


def _leg(names: tuple[str, ...], batch: dict, expires: str | None):
    first, *rest = names
    sigs = [_sig(first, batch, expires=expires)] + [_sig(n, expires=expires) for n in rest]
    return chain(*sigs) if rest else sigs[0]


def query_canvas(batch: dict, expires: str | None = None):
    return chain(
        chord(group(_leg(VECTOR_LEG, batch, expires), _leg(FULLTEXT_LEG, batch, expires)),
              _sig(FUSION, expires=expires)),
        *(_sig(name, expires=expires) for name in AFTER_FUSION),
    )
