"""The Porter stemmer as Snowball defines it (``porter.sbl``), the one DuckDB's
FTS extension runs for ``stemmer='porter'`` (the default): a query's terms
are stemmed here, in Python, instead of by a statement per query on the
base (``QueryTerms``, which keeps each word's stem): 10-20 µs a new word
against ~0.9 ms a statement (with its cursor, at 100,000 memories).

Written after the algorithm's Snowball definition, step for step, and tested
against DuckDB's own ``stem`` on every word of the packaged corpora and on
generated words (``tests/unit/test_porter.py``): an answer that differed
would give a query other terms than the index holds.
"""

from __future__ import annotations

_V = frozenset("aeiouy")


def _non_v_wxy(c: str) -> bool:
    return c not in _V and c not in "wxY"


def _shortv(w: str, end: int) -> bool:
    """Snowball's ``shortv`` ending at ``end`` (exclusive): a non-vowel other
    than w, x or Y, after a vowel, after a non-vowel."""
    return end >= 3 and _non_v_wxy(w[end - 1]) and w[end - 2] in _V and w[end - 3] not in _V


def _regions(w: str) -> tuple[int, int]:
    """p1 and p2: after the first non-vowel that follows a vowel, and again."""
    n = len(w)
    marks = []
    i = 0
    for _ in range(2):
        while i < n and w[i] not in _V:
            i += 1
        while i < n and w[i] in _V:
            i += 1
        if i >= n:
            marks.append(n)
            i = n
            continue
        i += 1
        marks.append(i)
    return marks[0], marks[1]


def _has_vowel(w: str, end: int) -> bool:
    return any(c in _V for c in w[:end])


def _longest(w: str, suffixes: tuple[str, ...]) -> str | None:
    """The longest of ``suffixes`` ``w`` ends with (``among``), or None."""
    for s in suffixes:  # sorted longest first
        if w.endswith(s):
            return s
    return None


def _by_length(words) -> tuple[str, ...]:
    return tuple(sorted(words, key=len, reverse=True))


_STEP1A = {"sses": "ss", "ies": "i", "ss": "ss", "s": ""}
_STEP1A_KEYS = _by_length(_STEP1A)
_STEP1B_KEYS = _by_length(("eed", "ed", "ing"))
_DOUBLES = frozenset(("bb", "dd", "ff", "gg", "mm", "nn", "pp", "rr", "tt"))
_STEP2 = {
    "tional": "tion", "enci": "ence", "anci": "ance", "abli": "able", "entli": "ent", "eli": "e",
    "izer": "ize", "ization": "ize", "ational": "ate", "ation": "ate", "ator": "ate", "alli": "al",
    "alism": "al", "aliti": "al", "fulness": "ful", "ousli": "ous", "ousness": "ous",
    "iveness": "ive", "iviti": "ive", "biliti": "ble",
}
_STEP2_KEYS = _by_length(_STEP2)
_STEP3 = {"alize": "al", "icate": "ic", "iciti": "ic", "ical": "ic", "ative": "", "ful": "", "ness": ""}
_STEP3_KEYS = _by_length(_STEP3)
_STEP4_KEYS = _by_length(("al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent",
                          "ou", "ism", "ate", "iti", "ous", "ive", "ize", "ion"))


def stem(word: str) -> str:
    """``word`` (lower case) stemmed as DuckDB's ``stem(word, 'porter')`` stems it."""
    if not word:
        return word
    w = word
    found_y = False
    if w[0] == "y":
        w = "Y" + w[1:]
        found_y = True
    if "y" in w:
        chars = list(w)
        for i in range(1, len(chars)):
            if chars[i] == "y" and chars[i - 1] in _V:
                chars[i] = "Y"
                found_y = True
        w = "".join(chars)
    p1, p2 = _regions(w)

    # Step 1a
    s = _longest(w, _STEP1A_KEYS)
    if s is not None:
        w = w[: len(w) - len(s)] + _STEP1A[s]

    # Step 1b
    s = _longest(w, _STEP1B_KEYS)
    if s == "eed":
        if len(w) - 3 >= p1:
            w = w[:-1]
    elif s is not None and _has_vowel(w, len(w) - len(s)):
        w = w[: len(w) - len(s)]
        if w.endswith(("at", "bl", "iz")):
            w += "e"
        elif w[-2:] in _DOUBLES:
            w = w[:-1]
        elif len(w) == p1 and _shortv(w, len(w)):
            w += "e"

    # Step 1c
    if w and w[-1] in "yY" and _has_vowel(w, len(w) - 1):
        w = w[:-1] + "i"

    # Step 2
    s = _longest(w, _STEP2_KEYS)
    if s is not None and len(w) - len(s) >= p1:
        w = w[: len(w) - len(s)] + _STEP2[s]

    # Step 3
    s = _longest(w, _STEP3_KEYS)
    if s is not None and len(w) - len(s) >= p1:
        w = w[: len(w) - len(s)] + _STEP3[s]

    # Step 4
    s = _longest(w, _STEP4_KEYS)
    if s is not None and len(w) - len(s) >= p2:
        if s != "ion":
            w = w[: len(w) - len(s)]
        elif len(w) >= 4 and w[-4] in "st":
            w = w[:-3]

    # Step 5a
    if w.endswith("e"):
        at = len(w) - 1
        if at >= p2 or (at >= p1 and not _shortv(w, at)):
            w = w[:-1]

    # Step 5b
    if w.endswith("ll") and len(w) - 1 >= p2:
        w = w[:-1]

    if found_y:
        w = w.replace("Y", "y")
    return w
