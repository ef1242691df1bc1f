"""A typed error raised on a worker reaches the caller as itself: Celery sends
an error as its class and ``args`` (JSON) and rebuilds it with ``cls(*args)``
on the caller's side (``DimpleResult.get`` re-raises a ``DimpleError`` as it
is; anything it cannot rebuild becomes a ``StageError``)."""

from __future__ import annotations

import pytest
from celery.backends.base import Backend

from pipeline.errors import (
    EvalInputError,
    InputError,
    ModelMismatchError,
    SchemaTooNewError,
    StoreError,
    VersionNotReachedError,
)
from pipeline.store.lake.commit import LinkTargetGone
from workers.app import get_app


@pytest.mark.parametrize("error", [
    InputError("as_of", "no snapshot 12 in the lake (its latest is 9)"),
    ModelMismatchError("embedding_model", "the store holds all-MiniLM-L6-v2 vectors"),
    EvalInputError("queries.jsonl:3: query", "must be a string"),
    VersionNotReachedError(9, 4, 250.0),
    StoreError("store.engine: as_of reads a past snapshot"),
    SchemaTooNewError("store schema 9 is newer than this dimple's 4"),
    LinkTargetGone("message-7", ["m1", "m2"]),
], ids=lambda e: type(e).__name__)
def test_a_typed_error_survives_celerys_json_rebuild(error):
    backend = Backend(app=get_app(), serializer="json")
    got = backend.exception_to_python(backend.prepare_exception(error, serializer="json"))
    assert type(got) is type(error)
    assert str(got) == str(error)
    if isinstance(error, InputError):
        assert isinstance(got, InputError)
        assert (got.field, got.reason) == (error.field, error.reason)


def test_an_input_error_reads_field_colon_reason():
    err = InputError("max_units", "500 is over the limit of 200")
    assert str(err) == "max_units: 500 is over the limit of 200" and err.field == "max_units"
