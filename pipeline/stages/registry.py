"""The stages in one table, ``STAGES``, and the canvas's shape; no logic of
their own: each stage module declares its ``Stage`` (``pipeline.stages.stage``).

``workers.tasks`` registers each entry as a Celery task; ``run_local`` runs
the same table in the canvas's order and shape without Celery (two legs on
their own copies of the batch, fused), so a unit test exercises the stages as
the workers chain them, with no app, broker or eager mode.
"""

from __future__ import annotations

from pipeline.contracts import Batch
from pipeline.stages import augment, budget, descend, embed, fulltext, fuse, scope
from pipeline.stages.stage import Resources, Stage

__all__ = ["AFTER_FUSION", "FULLTEXT_LEG", "FUSION", "STAGES", "VECTOR_LEG", "Resources", "Stage", "run_local"]

STAGES: dict[str, Stage] = {
    s.name: s
    for s in (embed.STAGE, descend.STAGE, fulltext.STAGE, fuse.STAGE, augment.STAGE, scope.STAGE, budget.STAGE)
}
# The canvas: chain(chord(group(chain(embed, descend), fulltext), fuse), augment, scope, budget)
VECTOR_LEG = ("search.embed", "search.descend")
FULLTEXT_LEG = ("search.fulltext",)
FUSION = "search.fuse"
AFTER_FUSION = ("search.augment", "search.scope", "search.budget")


def run_local(batch: Batch, res: Resources, keep: dict[str, Batch] | None = None) -> Batch:
    """The query canvas in this process, without Celery: each leg gets its own
    copy of the batch, as each gets its own message on the workers. ``keep``
    (a dict) gets a copy of each stage's output under its name, as that stage
    handed it on (``pipeline.audit.whynot`` reads the legs' whole lists there,
    which fusion cuts to their top hits)."""
    def kept(name: str, out: Batch) -> Batch:
        if keep is not None:
            keep[name] = out.model_copy(deep=True)
        return out

    legs = []
    for leg in (VECTOR_LEG, FULLTEXT_LEG):
        part = batch.model_copy(deep=True)
        for name in leg:
            part = kept(name, STAGES[name].run(part, res))
        legs.append(part)
    out = kept(FUSION, STAGES[FUSION].run(legs, res))
    for name in AFTER_FUSION:
        out = kept(name, STAGES[name].run(out, res))
    return out
