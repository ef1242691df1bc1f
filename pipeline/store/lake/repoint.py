"""A lake whose files were moved (a restored backup, a data dir copied to
another host, a shared volume mounted elsewhere): ``repoint`` records the
settings' data path (``store.data_path``, by default ``<data dir>/lake``) as
the lake's, after checking that every file the catalog lists is there.
``dimple repoint`` runs it.

DuckLake records the data path in its catalog and refuses another one at
``ATTACH`` (``catalog.attach``: a clear error naming ``store.data_path``);
the files' own paths are relative to it, so once the files are in place,
recording the new path is the whole move. Files of every snapshot still
kept (time travel) are checked, not only the latest's; a lake whose files
are not all there is left as it was. Paths on object storage (``s3://``)
are not checked: they cannot be listed without the storage's credentials
here, and the report says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import StoreError
from pipeline.settings import Settings
from pipeline.store.lake.catalog import META, attach, one

# Every data and delete file the catalog lists (those of snapshots still kept
# included), with the schema's and table's paths it is relative to.
_FILES = f"""
WITH schemas AS (SELECT schema_id, any_value(path) AS path, bool_and(path_is_relative::BOOLEAN) AS rel
                 FROM {META}.ducklake_schema GROUP BY schema_id),
     tables AS (SELECT table_id, any_value(schema_id) AS schema_id, any_value(path) AS path,
                       bool_and(path_is_relative::BOOLEAN) AS rel FROM {META}.ducklake_table GROUP BY table_id),
     files AS (SELECT table_id, path, path_is_relative::BOOLEAN AS rel FROM {META}.ducklake_data_file
               UNION ALL SELECT table_id, path, path_is_relative::BOOLEAN FROM {META}.ducklake_delete_file)
SELECT DISTINCT s.path, s.rel, t.path, t.rel, f.path, f.rel
FROM files f JOIN tables t USING (table_id) JOIN schemas s USING (schema_id)
"""


@dataclass
class Repointed:
    """What ``repoint`` did: the data path the catalog held and the one it
    holds now, how many files it checked (``checked`` False: on object
    storage, not checked), and whether anything changed."""

    old: str
    new: str
    files: int
    checked: bool
    changed: bool


def _resolve(data_path: str, schema: str, schema_rel: bool, table: str, table_rel: bool,
             file: str, file_rel: bool) -> str:
    if not file_rel:
        return file
    table_dir = table if not table_rel else (schema if not schema_rel else data_path + schema) + table
    return table_dir + file


def repoint(settings: Settings) -> Repointed:
    """Record ``settings``' data path as the lake's, once every file is found
    there; a ``StoreError`` naming ``store.data_path`` otherwise (nothing changed)."""
    con, _, data_path = attach(settings, override=True)
    try:
        row = one(con.execute(f"SELECT value FROM {META}.ducklake_metadata WHERE key = 'data_path'"))
        old, new = (str(row[0]) if row else ""), str(data_path) + os.sep
        if old == new:
            return Repointed(old, new, 0, False, False)
        paths = [_resolve(new, *r) for r in con.execute(_FILES).fetchall()]
        outside = [p for p in paths if not p.startswith(new)]
        if outside:
            raise StoreError(f"store.data_path: {len(outside)} of the lake's files are recorded by a path of their "
                             f"own, not under the data path (e.g. {outside[0]}): they cannot be moved by repointing; "
                             "nothing changed")
        checked = "://" not in new
        missing = [p for p in paths if checked and not Path(p).is_file()]
        if missing:
            raise StoreError(f"store.data_path: {len(missing)} of the lake's {len(paths)} files are not under {new} "
                             f"(e.g. {missing[0]}): copy the whole lake folder there first; nothing changed")
        con.execute(f"UPDATE {META}.ducklake_metadata SET value = ? WHERE key = 'data_path'", [new])
        return Repointed(old, new, len(paths), checked, True)
    finally:
        con.close()
