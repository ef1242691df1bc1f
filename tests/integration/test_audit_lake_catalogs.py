"""Audit rows from three processes at once into a PostgreSQL-catalogued lake
(the catalog several hosts share): every row once, each row sent by all three
inserted by one (``audit_head`` serialises the batches; DuckLake refuses the
second commit that deleted its row, which starts again and finds the ids).
The SQLite catalog's case runs in ``tests/embedded/test_audit_engines.py``."""

from __future__ import annotations

import pytest

from pipeline.settings import StoreSettings
from tests.embedded.test_audit_engines import writers_at_once
from tests.integration.test_lake_catalogs import pg_catalog, postgres  # noqa: F401 (fixtures)
from workers.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_three_processes_write_audit_rows_at_once_to_a_postgres_catalog_each_once(tmp_path, pg_catalog):  # noqa: F811
    settings = WorkerSettings(data_dir=tmp_path / "host", embedding_model="hash-64", _env_file=None,
                              store=StoreSettings(engine="lake", catalog=f"postgres:{pg_catalog}",
                                                  data_path=tmp_path / "shared"))
    writers_at_once(settings, tmp_path, ("a", "b", "c"))
