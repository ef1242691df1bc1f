"""Celery side of dimple: the app, thin tasks, the canvas, the API and the CLI."""


def configure(settings) -> None:
    """Use ``settings`` in this process: the store, the model and the broker.

    Pending embedded audit rows are written first, under the settings they
    were made with."""
    from . import audit, resources
    from .app import reconfigure

    audit.flush()
    resources.configure(settings)
    reconfigure(settings)
