"""The query canvas: flat, one chord for the two legs.

    chain(chord(group(chain(embed, descend), fulltext), fuse), augment, scope, budget)

The full-text leg does not wait for the embedding.
"""

from __future__ import annotations

from celery import chain, chord, group

from . import tasks


def query_canvas(batch: dict):
    return chain(
        chord(
            group(chain(tasks.embed.s(batch), tasks.descend.s()), tasks.fulltext.s(batch)),
            tasks.fuse.s(),
        ),
        tasks.augment.s(),
        tasks.scope.s(),
        tasks.budget.s(),
    )
