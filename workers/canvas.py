"""The query canvas: flat, one chord for the two legs.

    chain(chord(group(chain(embed, descend), fulltext), fuse), augment, scope, budget)

The full-text leg does not wait for the embedding. The order is the one
``pipeline.stages.registry`` declares (and ``run_local`` runs in-process).
"""

from __future__ import annotations

from celery import chain, chord, group

from pipeline.stages.registry import AFTER_FUSION, FULLTEXT_LEG, FUSION, VECTOR_LEG

from .tasks import STAGE_TASKS


def _leg(names: tuple[str, ...], batch: dict):
    first, *rest = names
    sigs = [STAGE_TASKS[first].s(batch)] + [STAGE_TASKS[n].s() for n in rest]
    return chain(*sigs) if rest else sigs[0]


def query_canvas(batch: dict):
    return chain(
        chord(group(_leg(VECTOR_LEG, batch), _leg(FULLTEXT_LEG, batch)), STAGE_TASKS[FUSION].s()),
        *(STAGE_TASKS[name].s() for name in AFTER_FUSION),
    )
