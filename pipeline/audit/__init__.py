"""The audit trail: one ``retrieval_log`` row per query (``record``), written off the query path
(``writer``: a lake commit a batch), read back (``reader``), kept when writes run out of retries (``letters``),
explained or replayed (``explain``) and purged of a forgotten memory (``purge``);
in the lake (``lake``: ``log_of``); an ``audit.duckdb`` of the segment store of earlier versions
is carried into it by ``dimple migrate`` (``carry``).
Why a memory was not returned (``whynot``) is imported on its own: it runs the
query's stages, which nothing else here needs.
"""

from pipeline.audit.explain import diff_served, explain, replay_options
from pipeline.audit.lake import LakeLog, log_of
from pipeline.audit.letters import dead_letter, dead_letters, retry_dead_letters, scan_dead_letters
from pipeline.audit.purge import PurgeReport, purge
from pipeline.audit.reader import count, find, get, since, tail
from pipeline.audit.record import COLUMNS, JSON_COLUMNS, AuditRecord, build_record, log_line
from pipeline.audit.writer import write_record, write_records

__all__ = [
    "LakeLog",
    "log_of",
    "AuditRecord",
    "build_record",
    "log_line",
    "COLUMNS",
    "JSON_COLUMNS",
    "write_records",
    "write_record",
    "tail",
    "get",
    "find",
    "since",
    "count",
    "dead_letter",
    "dead_letters",
    "retry_dead_letters",
    "scan_dead_letters",
    "explain",
    "replay_options",
    "diff_served",
    "purge",
    "PurgeReport",
]
