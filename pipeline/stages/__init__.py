"""The seed's query stages. Each module here declares one stage (its task
name and ``run(batch, resources)``, ``pipeline.stages.stage``) and holds all
of its behaviour: embed, descend (the vector leg), fulltext (the BM25 leg),
fuse (RRF or convex fusion, with its helper ``fuse.recency``), augment
(graph context, with ``augment.supersede``), scope, budget.
``pipeline.stages.registry`` lists them. The indexes the legs search live in
the store (``pipeline.store.vector``, ``pipeline.store.fulltext``); stages
hold no SQL.
"""
