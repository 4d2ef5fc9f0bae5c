"""The token that stands for "no information" in attributions: the baseline of Integrated
Gradients and GradientSHAP (every ordinary token replaced by it, special tokens kept), and
occlusion's filler when the tokenizer has no unk token.

The rule (:func:`baseline_token`), so tokenizers work as they ship: the tokenizer's **pad**
token, else its **unk**, else its **mask**, else its **eos** (what people set as the pad token
of a LLaMA-3-style tokenizer, which has neither pad nor unk), else the **first ordinary
token** (the lowest id that is not special, as :func:`~attnprobe.core.tokens.vocabulary_ids`
finds them). Each candidate must fit the model's input embedding. A choice past pad and unk is
named in a warning (:meth:`BaselineToken.note`), since the scores depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnprobe.core.tokens import special_ids, vocabulary_ids

__all__ = ["BASELINE_ROLES", "FIRST_ORDINARY", "BaselineToken", "baseline_token"]

BASELINE_ROLES = ("pad", "unk", "mask", "eos")  # tried in this order
CONVENTIONAL = ("pad", "unk")  # a baseline of these goes without a note
FIRST_ORDINARY = "first ordinary token"


@dataclass(frozen=True)
class BaselineToken:
    """The baseline token: its ``id``, ``source`` (a role of :data:`BASELINE_ROLES` or
    :data:`FIRST_ORDINARY`) and its ``token`` string."""

    id: int
    source: str
    token: str

    def note(self) -> str | None:
        """A one-line note naming the token when it is not the pad or unk token, else None."""
        if self.source in CONVENTIONAL:
            return None
        what = f"the {self.source} token" if self.source != FIRST_ORDINARY else \
            f"the {FIRST_ORDINARY}"
        return (f"the tokenizer has no pad or unk token: the attribution baseline token is "
                f"{what} {self.token!r} (id {self.id}); rule: pad, else unk, else mask, else "
                f"eos, else the {FIRST_ORDINARY}")


def _role_id(tokenizer: Any, role: str) -> int | None:
    value = getattr(tokenizer, f"{role}_token_id", None)
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def _token(tokenizer: Any, token_id: int) -> str:
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    found = convert([token_id]) if callable(convert) else [str(token_id)]
    return str(found[0])


def baseline_token(tokenizer: Any, vocab: int | None = None) -> BaselineToken | None:
    """The baseline token of ``tokenizer`` by the module's rule, among ids below ``vocab``
    (the model's input embedding rows, when known); None when no token fits."""
    for role in BASELINE_ROLES:
        found = _role_id(tokenizer, role)
        if found is not None and (vocab is None or found < vocab):
            return BaselineToken(found, role, _token(tokenizer, found))
    specials = special_ids(tokenizer)
    for found in vocabulary_ids(tokenizer).plain.tolist():
        if found not in specials and (vocab is None or found < vocab):
            return BaselineToken(int(found), FIRST_ORDINARY, _token(tokenizer, found))
    return None
