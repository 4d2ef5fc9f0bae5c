"""How much an output (or an attention pattern) changed: TVD, JSD, decision flips, cosine.

Conventions: probability vectors on the last axis ``[..., classes]``; natural log (nats), so
the Jensen-Shannon divergence is at most ``ln 2 ≈ 0.693``; TVD is ``½ Σ |p − q|`` (for a
binary output, ``|p₁ − q₁|``). Sums are formed in float64 and returned in the inputs' dtype.
``jsd`` and ``tvd`` are the one definition in :mod:`attnprobe.core.divergence`, re-exported.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from attnprobe.core.divergence import jsd, tvd
from attnprobe.errors import InputError

OutputKind = Literal["classifier", "lm", "embedding"]
OUTPUT_KINDS: tuple[OutputKind, ...] = ("classifier", "lm", "embedding")

__all__ = [
    "OUTPUT_KINDS",
    "attention_jsd",
    "cosine_distance",
    "decision_flip",
    "jsd",
    "logit_change",
    "output_change",
    "prob_change",
    "tvd",
]


def _pair(p: torch.Tensor, q: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(p, torch.Tensor) or not isinstance(q, torch.Tensor):
        raise InputError(f"{what} needs two tensors")
    if p.shape != q.shape:
        raise InputError(f"{what}: shapes differ, {tuple(p.shape)} vs {tuple(q.shape)}")
    if p.ndim == 0:
        raise InputError(f"{what} needs vectors on the last axis; got scalars")
    return p, q


def _out_dtype(p: torch.Tensor) -> torch.dtype:
    return p.dtype if p.is_floating_point() else torch.get_default_dtype()


def decision_flip(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Whether the argmax class differs (bool ``[...]``); works on logits or probabilities.

    Example:
        >>> before = torch.tensor([[2.0, 1.0], [0.0, 3.0]])   # [batch, classes]
        >>> decision_flip(before, torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
        tensor([ True, False])
    """
    p, q = _pair(p, q, "decision_flip")
    return p.argmax(-1) != q.argmax(-1)


def cosine_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``1 − cos(a, b)`` over the last axis (embeddings) -> ``[...]``; 0 for equal vectors.

    Example:
        >>> a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])        # [batch, dim]
        >>> cosine_distance(a, torch.tensor([[0.0, 1.0], [0.0, 5.0]]))  # orthogonal; parallel
        tensor([1., 0.])
    """
    a, b = _pair(a, b, "cosine_distance")
    sim = F.cosine_similarity(a.double(), b.double(), dim=-1)
    return (1.0 - sim).clamp(min=0.0).to(_out_dtype(a))


def _at(logits: torch.Tensor, position: int | torch.Tensor) -> torch.Tensor:
    """``[batch, vocab]`` logits: as given, or at ``position`` of ``[batch, seq, vocab]``
    (an int for every example, or a ``[batch]`` tensor, e.g. the last real token)."""
    if logits.ndim == 2:
        return logits
    if logits.ndim != 3:
        raise InputError(f"LM logits must be [batch, vocab] or [batch, seq, vocab]; got "
                         f"{tuple(logits.shape)}")
    if isinstance(position, int):
        return logits[:, position]
    position = torch.as_tensor(position, device=logits.device).long()
    if position.shape != (logits.shape[0],):
        raise InputError(f"position must be an int or a [batch] tensor; got shape "
                         f"{tuple(position.shape)}")
    return logits[torch.arange(logits.shape[0], device=logits.device), position]


def _token_index(token: int | torch.Tensor, batch: int, device: torch.device) -> torch.Tensor:
    index = torch.as_tensor(token, device=device).long()
    if index.ndim == 0:
        index = index.expand(batch)
    if index.shape != (batch,):
        raise InputError(f"token must be an int or a [batch] tensor; got shape "
                         f"{tuple(index.shape)}")
    return index[:, None]


def logit_change(before: torch.Tensor, after: torch.Tensor, token: int | torch.Tensor, *,
                 position: int | torch.Tensor = -1) -> torch.Tensor:
    """``after − before`` logit of ``token`` (int or ``[batch]``) at ``position`` -> ``[batch]``.

    ``before`` / ``after``: LM logits ``[batch, vocab]`` or ``[batch, seq, vocab]``.

    Example:
        >>> before = torch.zeros(2, 3, 5)               # [batch, seq, vocab]
        >>> after = before.clone()
        >>> after[:, -1, 4] = 1.5                       # token 4 gains 1.5 at the last position
        >>> logit_change(before, after, 4)              # [batch]
        tensor([1.5000, 1.5000])
        >>> logit_change(before, after, 4, position=0)
        tensor([0., 0.])
    """
    before, after = _pair(before, after, "logit_change")
    b, a = _at(before, position), _at(after, position)
    index = _token_index(token, b.shape[0], b.device)
    return (a.gather(-1, index) - b.gather(-1, index)).squeeze(-1)


def prob_change(before: torch.Tensor, after: torch.Tensor, token: int | torch.Tensor, *,
                position: int | torch.Tensor = -1) -> torch.Tensor:
    """``after − before`` softmax probability of ``token`` at ``position`` -> ``[batch]``.

    Example:
        >>> before = torch.zeros(1, 4)                  # [batch, vocab]: uniform, 1/4 each
        >>> after = torch.tensor([[0.0, 0.0, 0.0, -float("inf")]])   # token 3 out: 1/3 each
        >>> prob_change(before, after, 0)               # 1/3 - 1/4
        tensor([0.0833])
    """
    before, after = _pair(before, after, "prob_change")
    b = _at(before, position).double().softmax(-1)
    a = _at(after, position).double().softmax(-1)
    index = _token_index(token, b.shape[0], b.device)
    return (a.gather(-1, index) - b.gather(-1, index)).squeeze(-1).to(_out_dtype(before))


def attention_jsd(before: torch.Tensor, after: torch.Tensor,
                  query_valid: torch.Tensor | None = None) -> torch.Tensor:
    """Mean JSD over the query rows of two patterns ``[..., query, key]`` -> ``[...]``.

    Rows that count: ``query_valid`` (bool, broadcastable to ``[..., query]``) when given, and
    only rows of ``before`` that hold weight (a padding-stripped map has no others).

    Example:
        >>> own = torch.eye(4)[None]            # [head, query, key]: each row on its own key
        >>> attention_jsd(own, own.roll(1, dims=-1))    # every row moved elsewhere: ln 2
        tensor([0.6931])
        >>> attention_jsd(amap.pattern, amap.pattern)   # [layer, head]
        tensor([[0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0.],
                [0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0.],
                [0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0.],
                [0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0.],
                [0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0.],
                [0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0., 0.]])
    """
    before, after = _pair(before, after, "attention_jsd")
    if before.ndim < 2:
        raise InputError("attention_jsd needs patterns [..., query, key]")
    per_row = jsd(before, after).double()  # [..., query]
    rows = before.sum(-1) > 0
    if query_valid is not None:
        rows = rows & query_valid.to(rows.device).bool()
    total = torch.where(rows, per_row, 0.0).sum(-1)
    count = rows.sum(-1)
    if bool((count == 0).any()):
        raise InputError("attention_jsd: a pattern has no valid query row")
    return (total / count).to(_out_dtype(before))


def output_change(kind: OutputKind, before: torch.Tensor, after: torch.Tensor, *,
                  token: int | torch.Tensor | None = None,
                  position: int | torch.Tensor = -1) -> dict[str, torch.Tensor]:
    """Per-example change of a model output; every value is ``[batch]``.

    - ``"classifier"``: logits ``[batch, classes]`` -> ``tvd``, ``jsd`` (of the softmax
      distributions) and ``flip`` (1.0 when the argmax class changed).
    - ``"lm"``: logits ``[batch, vocab]`` or ``[batch, seq, vocab]`` (read at ``position``) ->
      ``tvd``, ``jsd``, ``flip`` of the next-token distribution, plus ``logit_change`` and
      ``prob_change`` of ``token`` (default: the token ``before`` ranks first).
    - ``"embedding"``: vectors ``[batch, dim]`` -> ``cosine_distance`` and ``l2_distance``.

    Example:
        >>> before = torch.tensor([[2.0, 0.0]])         # [batch, classes]
        >>> change = output_change("classifier", before, before.flip(-1))  # classes swapped
        >>> change["flip"], change["tvd"]               # tvd = |p₁ - q₁| = tanh(1)
        (tensor([1.]), tensor([0.7616]))
        >>> sorted(output_change("lm", torch.zeros(2, 3, 5), torch.zeros(2, 3, 5)))
        ['flip', 'jsd', 'logit_change', 'prob_change', 'tvd']
    """
    if kind not in OUTPUT_KINDS:
        raise InputError(f"unknown output kind {kind!r}; choose one of "
                         f"{', '.join(map(repr, OUTPUT_KINDS))}")
    before, after = _pair(before, after, "output_change")
    if kind == "embedding":
        if before.ndim != 2:
            raise InputError(f"embeddings must be [batch, dim]; got {tuple(before.shape)}")
        diff = (after.double() - before.double()).norm(dim=-1).to(_out_dtype(before))
        return {"cosine_distance": cosine_distance(before, after), "l2_distance": diff}
    if kind == "classifier":
        if before.ndim != 2:
            raise InputError(f"classifier logits must be [batch, classes]; got "
                             f"{tuple(before.shape)}")
        b, a = before, after
    else:
        b, a = _at(before, position), _at(after, position)
    p, q = b.double().softmax(-1), a.double().softmax(-1)
    dtype = _out_dtype(before)
    out = {"tvd": tvd(p, q).to(dtype), "jsd": jsd(p, q).to(dtype),
           "flip": decision_flip(b, a).to(dtype)}
    if kind == "lm":
        chosen = b.argmax(-1) if token is None else token
        out["logit_change"] = logit_change(b, a, chosen)
        out["prob_change"] = prob_change(b, a, chosen)
    return out
