"""Celery side of dimple: the app, thin tasks, the canvas, the resources of a worker process;
the Python API (``workers.api``) and the command line (``workers.cli``) on top."""


def configure(settings) -> None:
    """Use ``settings`` in this process: the store, the model and the broker.

    Pending embedded audit rows are written first, under the settings they
    were made with."""
    # here, not at the top: importing any workers module runs this file first, and would load the app,
    # its tasks and the pipeline with it
    from . import audit, resources
    from .app import reconfigure

    audit.flush()
    resources.current().configure(settings)
    reconfigure(settings)
