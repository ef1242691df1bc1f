"""The store on DuckLake (issue 34; docs/LAKE.md): a SQL catalog (SQLite in
the data dir, or PostgreSQL for several hosts) holds the metadata and commits
transactions; the data lies in Parquet files under the data path.

``Lake`` (``store``) opens one from settings; ``records`` holds what a write
carries and a read returns; ``catalog`` attaches (extensions from their
packages' files, offline) and creates the record tables; ``commit`` writes,
``read`` reads at a snapshot and lists changes, ``erase`` forgets for good;
``derive`` builds what the query path reads (a base for a snapshot, the
snapshots since as deltas over it); ``follow`` is what a process's ``Reader``
reads (docs/LAKE.md).
"""

from pipeline.store.lake.records import Changes, Committed, LakeMemory, LakeWrite, TableChanges
from pipeline.store.lake.store import Lake, LakeInfo

__all__ = ["Changes", "Committed", "Lake", "LakeInfo", "LakeMemory", "LakeWrite", "TableChanges"]
