"""How a token is removed for a faithfulness test, and the perturbed inputs for a ranking.

Three procedures, recorded by name in every result row (:attr:`Removal.label`):

- ``replace``: the token's id becomes a filler (the tokenizer's mask, pad or unk token);
  the length and positions stay.
- ``delete``: the token is cut out; later tokens move one position left (ERASER and ferret
  remove tokens this way).
- ``attention``: the id stays but the attention mask is 0 at the token, so no query attends
  to it (the token's own row still runs; its value never reaches another token).

Special tokens (``[CLS]``, ``[SEP]``, BOS, ...) are never removed: asking for one raises.
Removing every real token is refused unless the caller asks for it (a curve's end point);
removing every token the model would see is always refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from attnprobe.errors import InputError

__all__ = ["KINDS", "Perturbed", "Removal", "pad_batch", "perturb", "perturb_ranked",
           "removal_for", "unique_inputs"]

Kind = Literal["replace", "delete", "attention"]
KINDS: tuple[str, ...] = ("replace", "delete", "attention")
FILL_ROLES: tuple[str, ...] = ("mask", "pad", "unk")  # tried in this order by removal_for


@dataclass(frozen=True)
class Removal:
    """One removal procedure.

    Args:
        kind: ``"replace"``, ``"delete"`` or ``"attention"``.
        fill_id: the filler id (``replace`` only; required there, None otherwise).
        fill_token: the filler's string, for the label.
    """

    kind: Kind
    fill_id: int | None = None
    fill_token: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"removal must be one of {', '.join(KINDS)}; got {self.kind!r}")
        if self.kind == "replace" and (isinstance(self.fill_id, bool)
                                       or not isinstance(self.fill_id, int)
                                       or self.fill_id < 0):
            raise InputError(f"removal 'replace' needs a token id to fill with; got "
                             f"{self.fill_id!r}")
        if self.kind != "replace" and self.fill_id is not None:
            raise InputError(f"removal {self.kind!r} takes no fill token")

    @property
    def label(self) -> str:
        """The name recorded in result rows: ``replace:[MASK]``, ``delete``, ``attention``."""
        if self.kind != "replace":
            return self.kind
        return f"replace:{self.fill_token if self.fill_token is not None else self.fill_id}"


def removal_for(tokenizer: Any, kind: str = "delete", fill: str | None = None) -> Removal:
    """The :class:`Removal` of ``kind`` for ``tokenizer``.

    Args:
        tokenizer: a HF tokenizer (only ``<role>_token_id`` and ``<role>_token`` are read).
        kind: ``"delete"`` (the default: ERASER and ferret delete tokens), ``"replace"`` or
            ``"attention"``.
        fill: for ``replace``, the role of the filler (``"mask"``, ``"pad"``, ``"unk"``);
            None = the first of these the tokenizer has.

    Raises:
        InputError: an unknown kind or role, or no filler token for ``replace``.

    Example:
        >>> removal_for(tok).label                            # tok: MiniLM's tokenizer
        'delete'
        >>> removal_for(tok, "replace").label
        'replace:[MASK]'
    """
    if kind not in KINDS:
        raise InputError(f"removal must be one of {', '.join(KINDS)}; got {kind!r}")
    if kind != "replace":
        if fill is not None:
            raise InputError(f"removal {kind!r} takes no fill token; got fill={fill!r}")
        return Removal(kind)  # type: ignore[arg-type]
    if fill is not None and fill not in FILL_ROLES:
        raise InputError(f"fill must be one of {', '.join(FILL_ROLES)}; got {fill!r}")
    for role in (fill,) if fill is not None else FILL_ROLES:
        found = getattr(tokenizer, f"{role}_token_id", None)
        if isinstance(found, int) and not isinstance(found, bool) and found >= 0:
            return Removal("replace", found, str(getattr(tokenizer, f"{role}_token", found)))
    wanted = f"a {fill} token" if fill is not None else "a mask, pad or unk token"
    raise InputError(f"removal 'replace' needs {wanted}; the tokenizer has none (use "
                     "removal='delete' or 'attention')")


@dataclass(frozen=True)
class Perturbed:
    """One perturbed input: ``input_ids`` and ``attention_mask``, both ``[seq']`` int64
    (``seq' = seq − removed`` for ``delete``, else ``seq``)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor

    def key(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """A hashable identity (equal inputs, equal keys): for deduplication."""
        return tuple(self.input_ids.tolist()), tuple(self.attention_mask.tolist())


def _vector(x: Any, name: str, dtype: torch.dtype) -> torch.Tensor:
    t = torch.as_tensor(x).detach().cpu()
    if t.dim() != 1:
        raise InputError(f"{name} must be one sequence [seq]; got shape {tuple(t.shape)}")
    return t.to(dtype)


def perturb(input_ids: Any, attention_mask: Any, special: Any, positions: Sequence[int],
            removal: Removal, *, allow_all_real: bool = False) -> Perturbed:
    """``input_ids`` with ``positions`` removed by ``removal``.

    Args:
        input_ids: ``[seq]`` ids of one text (no padding, or padding with mask 0).
        attention_mask: ``[seq]`` 1 at tokens the model sees (None = all ones).
        special: ``[seq]`` bools, True at special tokens (None = none).
        positions: positions to remove (any order; repeats raise).
        removal: the procedure.
        allow_all_real: permit removing every real token (a curve's end point).

    Returns:
        The :class:`Perturbed` input.

    Raises:
        InputError: a position out of range, repeated, special or padding; every real token
            removed without ``allow_all_real``; no token left for the model.

    Example:
        >>> out = perturb([2, 7, 8, 3], None, [1, 0, 0, 1], [1], Removal("delete"))
        >>> out.input_ids.tolist()
        [2, 8, 3]
    """
    ids = _vector(input_ids, "input_ids", torch.long)
    mask = torch.ones_like(ids) if attention_mask is None else \
        _vector(attention_mask, "attention_mask", torch.long)
    spec = torch.zeros_like(ids, dtype=torch.bool) if special is None else \
        _vector(special, "special", torch.bool)
    if not ids.shape == mask.shape == spec.shape:
        raise InputError(f"input_ids, attention_mask and special differ in length: "
                         f"{ids.numel()}, {mask.numel()}, {spec.numel()}")
    pos = [int(p) for p in positions]
    if len(set(pos)) != len(pos):
        raise InputError(f"a position to remove is repeated: {pos}")
    seq = ids.numel()
    for p in pos:
        if not 0 <= p < seq:
            raise InputError(f"position {p} is outside the text (0..{seq - 1})")
        if bool(spec[p]):
            raise InputError(f"position {p} is a special token; special tokens are never "
                             "removed")
        if int(mask[p]) == 0:
            raise InputError(f"position {p} is padding (attention mask 0)")
    real = (~spec) & (mask > 0)
    if pos and len(pos) == int(real.sum()) and not allow_all_real:
        raise InputError(f"removing {len(pos)} tokens removes every real token of the text")
    drop = torch.zeros(seq, dtype=torch.bool)
    drop[pos] = True
    if removal.kind == "delete":
        out = Perturbed(ids[~drop].clone(), mask[~drop].clone())
    elif removal.kind == "replace":
        fill = torch.full_like(ids, int(removal.fill_id or 0))  # checked in Removal
        out = Perturbed(torch.where(drop, fill, ids), mask.clone())
    else:
        out = Perturbed(ids.clone(), torch.where(drop, 0, mask))
    if int(out.attention_mask.sum()) == 0:
        raise InputError("the removal leaves no token for the model to see")
    return out


def perturb_ranked(input_ids: Any, attention_mask: Any, special: Any, order: Sequence[int],
                   k: int, removal: Removal, *, keep: bool = False,
                   allow_all_real: bool = False) -> Perturbed:
    """The input for ranking ``order`` at count ``k``.

    Args:
        input_ids, attention_mask, special: ``[seq]`` as in :func:`perturb`.
        order: ``[n]`` real positions, first = removed first (a MoRF ranking; pass it reversed
            for LeRF).
        k: tokens taken from the front of ``order``.
        removal: the procedure.
        keep: False = remove ``order[:k]`` (comprehensiveness, deletion curves); True = keep
            only ``order[:k]``, removing ``order[k:]`` (sufficiency, insertion curves).
        allow_all_real: as in :func:`perturb`.

    Example:
        >>> ids, special, order = [2, 7, 8, 3], [1, 0, 0, 1], [2, 1]  # position 2 first
        >>> perturb_ranked(ids, None, special, order, 1, Removal("delete")).input_ids.tolist()
        [2, 7, 3]
        >>> perturb_ranked(ids, None, special, order, 1, Removal("delete"),
        ...                keep=True).input_ids.tolist()              # only the top token kept
        [2, 8, 3]
    """
    ranked = [int(p) for p in order]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) \
            or not 0 <= k <= len(ranked):
        raise InputError(f"k must be an int in 0..{len(ranked)}; got {k!r}")
    gone = ranked[k:] if keep else ranked[:k]
    return perturb(input_ids, attention_mask, special, gone, removal,
                   allow_all_real=allow_all_real)


def unique_inputs(items: Sequence[Perturbed]) -> tuple[list[Perturbed], list[int]]:
    """Identical perturbed inputs collapsed: ``(unique, index)`` with
    ``items[i] == unique[index[i]]``, first occurrence order (run ``unique`` once, then
    gather the outputs by ``index``).

    Example:
        >>> a = Perturbed(torch.tensor([2, 3]), torch.ones(2, dtype=torch.long))
        >>> b = Perturbed(torch.tensor([2, 7, 3]), torch.ones(3, dtype=torch.long))
        >>> unique, index = unique_inputs([a, b, a])
        >>> len(unique), index
        (2, [0, 1, 0])
    """
    seen: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    unique: list[Perturbed] = []
    index: list[int] = []
    for item in items:
        key = item.key()
        if key not in seen:
            seen[key] = len(unique)
            unique.append(item)
        index.append(seen[key])
    return unique, index


def pad_batch(items: Sequence[Perturbed], pad_id: int, *,
              side: Literal["right", "left"] = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """Perturbed inputs as one batch: ``input_ids`` and ``attention_mask``, both ``[B, L]``
    (``L`` the longest), padded with ``pad_id`` and mask 0 on ``side`` (left for decoders whose
    explained position is the last).

    Example:
        >>> long = Perturbed(torch.tensor([2, 7, 3]), torch.ones(3, dtype=torch.long))
        >>> short = Perturbed(torch.tensor([2, 3]), torch.ones(2, dtype=torch.long))
        >>> ids, mask = pad_batch([long, short], 0)
        >>> ids.tolist(), mask.tolist()
        ([[2, 7, 3], [2, 3, 0]], [[1, 1, 1], [1, 1, 0]])
    """
    if not items:
        raise InputError("no perturbed input to batch")
    width = max(item.input_ids.numel() for item in items)
    ids = torch.full((len(items), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, item in enumerate(items):
        n = item.input_ids.numel()
        span = slice(0, n) if side == "right" else slice(width - n, width)
        ids[row, span] = item.input_ids
        mask[row, span] = item.attention_mask
    return ids, mask
