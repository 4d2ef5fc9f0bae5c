"""What every piece of text goes through on its way into a page, besides HTML escaping.

- :func:`show_controls`: bidirectional control characters (embeddings, overrides and
  isolates, U+202A–U+202E and U+2066–U+2069) are invisible but reorder the text around them:
  a token holding U+202E reverses everything after it on the line. A report is for looking at
  data, so they are shown as ``⟨U+202E⟩`` instead. The attention view's script applies the
  same mapping (``static/attention_view.js``).
- :func:`slug`: a caller's key becomes an ``id`` made only of ``a-z 0-9 _ -``, so it can
  never leave its attribute whatever the key holds.
"""

from __future__ import annotations

import re

from attnprobe.errors import InputError

BIDI_CONTROLS = frozenset(chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A)))
_BIDI = re.compile("[" + "".join(sorted(BIDI_CONTROLS)) + "]")
_NOT_SLUG = re.compile(r"[^a-z0-9_-]+")


def visible(char: str) -> str:
    """``⟨U+202E⟩`` for one character."""
    return f"\u27e8U+{ord(char):04X}\u27e9"


def show_controls(text: str) -> str:
    """``text`` with every bidirectional control character written visibly."""
    return _BIDI.sub(lambda m: visible(m.group()), text)


def slug(key: object) -> str:
    """``key`` as an ``id`` fragment: lower case, runs of other characters as one ``-``.

    Raises:
        InputError: a key that is not a string or has no letter or digit to keep.
    """
    if not isinstance(key, str):
        raise InputError(f"a section key must be a string, got {type(key).__name__}")
    out = _NOT_SLUG.sub("-", key.lower()).strip("-")
    if not re.search(r"[a-z0-9]", out):
        raise InputError(f"section key {key!r} has no letter or digit to make an id from")
    return out
