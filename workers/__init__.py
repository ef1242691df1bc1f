"""Celery side of dimple: the app, thin tasks, the canvas, the API and the CLI."""


def configure(settings) -> None:
    """Use ``settings`` in this process: the store, the model and the broker."""
    from . import resources
    from .app import reconfigure

    resources.configure(settings)
    reconfigure(settings)
