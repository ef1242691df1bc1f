"""Query identity: FNV-1a 64 of the raw query text, or of the full query
vector in semantic mode (so the hash is a true identity, not a prefix)."""

from __future__ import annotations

import numpy as np

FNV64_OFFSET = 0xCBF29CE484222325
FNV64_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    """64-bit FNV-1a (Fowler, Noll, Vo; draft-eastlake-fnv)."""
    h = FNV64_OFFSET
    for byte in data:
        h ^= byte
        h = (h * FNV64_PRIME) & _MASK64
    return h


def text_identity(text: str) -> str:
    return f"{fnv1a64(text.encode('utf-8')):016x}"


def vector_identity(vector: np.ndarray) -> str:
    """Hash of the full float32 little-endian vector: a true identity, not a prefix."""
    return f"{fnv1a64(np.asarray(vector, dtype='<f4').tobytes()):016x}"
