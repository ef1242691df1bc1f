"""The seed's query stages, one file per stage, named as the task: embed, descend (the vector leg),
fulltext (the BM25 leg), fuse (RRF), recency, augment (graph context), scope, budget.
"""
