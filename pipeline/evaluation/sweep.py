"""Parameter sweeps: the product of mode, RRF k, leg weights, beam width and
leaf size, each configuration as settings plus per-query defaults.
"""

from __future__ import annotations

import itertools
from typing import Any

from pipeline.contracts import parse_leg_weights
from pipeline.errors import InputError
from pipeline.settings import Settings

# -- sweeps ------------------------------------------------------------------------------------
SWEEP_AXES = ("mode", "rrf_k", "weights", "beam_width", "max_leaf_items")


def sweep_grid(axes: dict[str, list[Any]], limit: int = 64) -> list[dict[str, Any]]:
    """The product of the given axes (each a non-empty list), in order."""
    unknown = sorted(set(axes) - set(SWEEP_AXES))
    if unknown:
        raise InputError("sweep", f"unknown axis {unknown[0]!r}; valid: {', '.join(SWEEP_AXES)}")
    for axis, values in axes.items():
        repeated = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if repeated is not None:  # two configurations of one name: the second run would overwrite the first
            flag = "--modes" if axis == "mode" else "--" + axis.replace("_", "-")
            raise InputError(flag, f"{repeated!r} is given twice")
    names = [a for a in SWEEP_AXES if axes.get(a)]
    grid = [dict(zip(names, values)) for values in itertools.product(*(axes[a] for a in names))]
    if len(grid) > limit:
        raise InputError("sweep", f"{len(grid)} configurations, over the limit of {limit}")
    return grid or [{}]


def config_name(config: dict[str, Any]) -> str:
    if not config:
        return "defaults"
    parts = []
    for key, value in config.items():
        if key == "weights":
            value = f"{value[0]:g}:{value[1]:g}"
        parts.append(f"{key}={value}")
    return ",".join(parts)


def apply_config(settings: Settings, defaults: dict[str, Any], config: dict[str, Any]) -> tuple[Settings, dict[str, Any]]:
    """Settings (validated copy) and per-query defaults for one sweep
    configuration; one that sets fusion (RRF k, weights) turns the store's
    tuned fusion settings off (``use_tuned``), so it is what runs."""
    changes: dict[str, Any] = {}
    tree = {}
    if "rrf_k" in config:  # an RRF k axis is RRF: under convex fusion k would change nothing
        changes["rrf_k"], changes["fusion"] = config["rrf_k"], "rrf"
    if "weights" in config:
        changes["vector_weight"], changes["fts_weight"] = config["weights"]
        if changes.get("fusion", settings.fusion) == "convex":  # convex weights are shares: the vector leg's is alpha
            vector, fts = config["weights"]
            changes["convex_alpha"] = vector / (vector + fts)
    if "beam_width" in config:
        tree["beam_width"] = config["beam_width"]
    if "max_leaf_items" in config:
        tree["max_leaf_items"] = config["max_leaf_items"]
    if tree:
        changes["tree"] = {**settings.tree.model_dump(), **tree}
    if "rrf_k" in config or "weights" in config:  # the configuration runs, not the store's tuned fusion (dimple tune)
        changes["use_tuned"] = False
    asks = dict(defaults)
    if "mode" in config:
        asks["mode"] = config["mode"]
    return (settings.replace(**changes) if changes else settings), asks


def parse_number_list(text: str, kind: type, name: str) -> list[Any]:
    out = []
    for part in text.split(","):
        try:
            out.append(kind(part.strip()))
        except ValueError:
            raise InputError(name, f"{part.strip()!r} is not {'an integer' if kind is int else 'a number'}") from None
    return out


def parse_weights(text: str) -> list[tuple[float, float]]:
    """``"1:1,0.5:1"`` -> ``[(1.0, 1.0), (0.5, 1.0)]``: a comma list of ``parse_leg_weights``."""
    return [parse_leg_weights(part, "--weights") for part in text.split(",")]
