"""Checking captured attention against transformers' own eager attention.

- :func:`reference` — the eager twin's ``output_attentions`` per role (``attentions``,
  ``encoder_attentions``, ``decoder_attentions``, ``cross_attentions``), each entry
  ``[batch, head, query, key]`` over the full keys; documented banded layouts are converted
  (:func:`band_to_full`, Longformer), anything else is :class:`NoReference`;
- :func:`compare_maps` — every padding-stripped map against the reference cropped to the
  example's real query rows and keys, and every reference layer against the maps;
- :func:`compare_outputs` — every floating output of the captured forward against the
  uncaptured one on real positions;
- :func:`config_state` / :func:`describe_error` — what "restored" means, and where an
  exception came from.

Each check returns :class:`Issue` values; an empty list means the check passed.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROLES = ("attentions", "encoder_attentions", "decoder_attentions", "cross_attentions")
WEIGHT_TOL = 1e-4
# A partly captured forward sits between the uncaptured one (SDPA) and the eager twin: by the
# triangle inequality it is within 2x their measured gap of the uncaptured output, and x2 again
# because rounding does not propagate monotonically through a recurrent model (layer-scoped
# captures of the sample measured up to 1.03x the gap; full captures equal the twin).
IMPLEMENTATION_MULTIPLE = 4.0
EPS32 = torch.finfo(torch.float32).eps
ROW_TOL = 1e-4
EXTRA_SOFTMAX = "#"  # a stack name holding it: a layer's further softmax, no eager twin


class NoReference(Exception):
    """The eager twin gives no attention this checker can compare with (one-line reason)."""


@dataclass(frozen=True)
class Issue:
    """One failed comparison: which check, what, and the worst difference (``nan``: none)."""

    check: str  # "weights" | "outputs" | "restored"
    detail: str
    worst: float = float("nan")

    def __str__(self) -> str:
        worst = "" if self.worst != self.worst else f" (max |diff| {self.worst:.3g})"
        return f"{self.check}: {self.detail}{worst}"


# ------------------------------------------------------------------ reference
def band_to_full(band: torch.Tensor, window: int, key_len: int) -> torch.Tensor:
    """Longformer's local attention ``[batch, head, seq, window + 1]`` -> ``[batch, head, seq,
    key_len]``.

    Column ``window // 2 + d`` of row ``i`` is the weight of key ``i + d`` (``|d| <= window //
    2``; transformers' ``LongformerBaseModelOutput.attentions``, no global tokens). Keys outside
    ``0..key_len-1`` (the padding Longformer adds up to a multiple of the window) must carry no
    weight; otherwise the conversion would drop mass and it raises ``ValueError``.
    """
    batch, heads, seq, width = band.shape
    half = window // 2
    if width != window + 1 or window % 2:
        raise ValueError(f"band of width {width} is not a window of {window} (+1, even window)")
    full = band.new_zeros(batch, heads, seq, key_len)
    rows = torch.arange(seq)
    for col in range(width):
        keys = rows + col - half
        inside = (keys >= 0) & (keys < key_len)
        outside = band[:, :, rows[~inside], col]
        if outside.numel() and outside.abs().max() > 1e-6:
            raise ValueError(f"band column {col} puts weight on keys outside 0..{key_len - 1}")
        full[:, :, rows[inside], keys[inside]] = band[:, :, rows[inside], col]
    return full


def _longformer(entries: list[Any], config: Any, key_len: int) -> list[Any]:
    windows = config.attention_window
    windows = windows if isinstance(windows, (list, tuple)) else [windows] * len(entries)
    try:
        return [None if e is None else band_to_full(e, int(windows[i]), key_len)
                for i, e in enumerate(entries)]
    except ValueError as err:
        raise NoReference(f"Longformer band layout: {err}") from None


# model type -> (role, converter(entries, config, key_len)) for documented non-full layouts
CONVERTERS = {"longformer": ("attentions", _longformer),
              "led": ("encoder_attentions", _longformer)}


def _side_lengths(masks: dict[str, torch.Tensor], role: str) -> tuple[int, int]:
    """Padded query and key lengths of a role (cross: decoder queries, encoder keys)."""
    main = masks["main"].shape[1]
    dec = masks["decoder"].shape[1] if "decoder" in masks else main
    return {"decoder_attentions": (dec, dec), "cross_attentions": (dec, main)}.get(role,
                                                                               (main, main))


@dataclass
class Reference:
    """The eager twin's attention per role: ``entries[role][layer]`` ``[batch, head, query,
    key]`` post-softmax weights, None where the twin gives none for that layer or where its
    entry cannot be compared (``unusable[(role, layer)]`` says why)."""

    entries: dict[str, list[torch.Tensor | None]]
    unusable: dict[tuple[str, int], str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # how entries were read, for the table


def _why_unusable(entry: Any, role: str, masks: dict[str, torch.Tensor]) -> str | None:
    """Why an entry is not ``[batch, head, query, key]`` post-softmax weights over the real
    keys (None if it is). Queries may be fewer than the tokens (pooled), never more."""
    q_len, k_len = _side_lengths(masks, role)
    if not isinstance(entry, torch.Tensor):
        return f"a {type(entry).__name__}, not a tensor"
    shape = list(entry.shape)
    # queries may be fewer than the tokens (pooled), keys fewer (pooled) or more (a model's
    # own extra keys, e.g. compressed ones): an axis of another length is compared whole
    if entry.ndim != 4 or shape[0] != masks["main"].shape[0] or shape[-2] > q_len:
        return f"{shape}, not [batch, head, query, key] over the {k_len} keys"
    q_mask, k_mask = _masks_of(role, masks)
    for b in range(shape[0]):
        rows = _crop(entry[b].float(), q_mask[b], k_mask[b])
        if (rows < -1e-6).any() or (rows.sum(-1) > 1 + 1e-3).any():
            return (f"not post-softmax weights (entries {rows.min().item():.3g}.."
                    f"{rows.max().item():.3g}, rows summing to up to "
                    f"{rows.sum(-1).max().item():.3g})")
    return None


def reference(output: Any, model_type: str, config: Any, masks: dict[str, torch.Tensor]
              ) -> Reference:
    """The twin's attention (see :class:`Reference`); a documented banded layout is converted
    (:data:`CONVERTERS`). Raises :class:`NoReference` when no entry can be compared."""
    found, unusable, empty, notes = {}, {}, [], {}
    for role in ROLES:
        entries = getattr(output, role, None) if hasattr(output, role) else None
        if entries is None:
            continue
        if not any(e is not None for e in entries):
            empty.append(role)
            continue
        convert = CONVERTERS.get(model_type)
        if convert is not None and convert[0] == role:
            entries = convert[1](list(entries), config, _side_lengths(masks, role)[1])
        found[role] = list(entries)
        for i, entry in enumerate(entries):
            why = None if entry is None else _why_unusable(entry, role, masks)
            # scores: some models return them (over their token keys; a [d, d] state of a
            # linear-attention layer is no scores, whatever its softmax looks like)
            if why is not None and "post-softmax" in why \
                    and entry.shape[-1] == _side_lengths(masks, role)[1]:
                weights = entry.float().softmax(-1)
                if _why_unusable(weights, role, masks) is None:
                    found[role][i] = weights
                    notes[f"{role} holds pre-softmax scores (compared after a softmax)"] = None
                    continue
            if why is not None:
                unusable[role, i] = f"{role}[{i}] is {why}"
                found[role][i] = None
    if not any(e is not None for entries in found.values() for e in entries):
        if unusable:
            raise NoReference("; ".join(list(unusable.values())[:2]))
        raise NoReference("the eager model returns no attention weights"
                          + (f" ({', '.join(empty)} empty)" if empty else ""))
    return Reference({r: e for r, e in found.items() if any(x is not None for x in e)},
                     unusable, list(notes))


# ------------------------------------------------------------------ maps
def role_of(stack: str, kind: str, encoder_decoder: bool) -> str:
    """Which reference tuple a map of ``stack``/``kind`` indexes."""
    if kind == "cross":
        return "cross_attentions"
    if not encoder_decoder:
        return "attentions"
    return "decoder_attentions" if "decoder" in stack.lower() else "encoder_attentions"


def _crop(ref: torch.Tensor, q_valid: torch.Tensor, k_valid: torch.Tensor) -> torch.Tensor:
    """``[head, q, k]`` cut to real rows and keys along each axis that spans the side (an axis
    of another length, e.g. pooled queries, is kept whole). Keys beyond the side's tokens (a
    model's own appended entries, e.g. DeepSeek-V4's compressed ones) follow the token keys:
    those some real row attends to are kept, the rest stand for padding."""
    if ref.shape[-2] == q_valid.shape[0]:
        ref = ref[:, q_valid]
    n = k_valid.shape[0]
    if ref.shape[-1] == n:
        ref = ref[..., k_valid]
    elif ref.shape[-1] > n and ref.shape[-2] == int(q_valid.sum()):
        seen = ref[..., n:].ne(0).flatten(0, 1).any(0)
        ref = torch.cat([ref[..., :n][..., k_valid], ref[..., n:][..., seen]], dim=-1)
    return ref


def _masks_of(role: str, masks: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    main, dec = masks["main"], masks.get("decoder", masks["main"])
    return {"decoder_attentions": (dec, dec), "cross_attentions": (dec, main)}.get(role,
                                                                               (main, main))


def _extra_softmax(amap: Any, sinks: bool) -> list[Issue]:
    """A layer's further softmax (stack ``...#k``): finite rows that sum to 1 (<= 1 with
    learned sinks)."""
    sums = amap.pattern.sum(-1)
    if not torch.isfinite(amap.pattern).all():
        return [Issue("weights", f"{amap.stack} layer {amap.layers}: non-finite weights")]
    over = (sums - 1).max().item()
    under = (1 - sums).max().item()
    if over > ROW_TOL or (not sinks and under > ROW_TOL):
        return [Issue("weights", f"{amap.stack}: rows sum to {sums.min():.4g}..{sums.max():.4g}",
                      max(over, under))]
    return []


def reference_index(runs: Sequence[tuple[str, str, int]], encoder_decoder: bool
                    ) -> dict[tuple[str, str, int], int]:
    """Where each captured layer ``(stack, kind, layer)`` sits in its role's reference tuple.

    transformers appends each attention module's weights to the tuple as the module runs, so
    the ``i``-th layer of a role to run (``runs``: captured layers in the order they first
    ran, ``Capture.runs``) is entry ``i``: hybrids list only their attention layers, models
    with several stacks (CANINE) one tuple for all, looped models their runs in order.
    Extra softmaxes of a layer (stacks with ``#``) have no entry."""
    index: dict[tuple[str, str, int], int] = {}
    counts: dict[str, int] = {}
    for stack, kind, layer in runs:
        if EXTRA_SOFTMAX in stack or (stack, kind, layer) in index:
            continue
        role = role_of(stack, kind, encoder_decoder)
        index[stack, kind, layer] = counts.get(role, 0)
        counts[role] = counts.get(role, 0) + 1
    return index


def compare_maps(maps: Sequence[Any], ref: Reference, masks: dict[str, torch.Tensor],
                 encoder_decoder: bool, sinks: bool = False,
                 runs: Sequence[tuple[str, str, int]] | None = None
                 ) -> tuple[list[Issue], float, list[str]]:
    """Every map against the reference, and every reference layer against the maps.

    ``maps`` are :class:`attnprobe.AttentionMap` with ``example_id`` the batch row;
    ``masks`` the real-token masks ``[batch, seq]`` of each side ("main", "decoder");
    ``runs`` the captured layers in the order they ran (:func:`reference_index`; without
    them a map's layer index is its reference index).
    Returns the issues, the largest |map - reference| over the maps compared, and the
    reference entries that maps exist for but that cannot be compared (``ref.unusable``).
    """
    refs = ref.entries
    order = reference_index(runs, encoder_decoder) if runs is not None else {}
    issues: list[Issue] = []
    unverified: dict[str, None] = {}
    seen: dict[tuple[str, int, int], str] = {}
    worst = 0.0
    for amap in maps:
        if EXTRA_SOFTMAX in amap.stack:
            issues += _extra_softmax(amap, sinks)
            continue
        role = role_of(amap.stack, amap.kind, encoder_decoder)
        b = int(amap.example_id)
        entries = refs.get(role)
        if entries is None and any(r == role for r, _ in ref.unusable):
            unverified.update({w: None for (r, _), w in ref.unusable.items() if r == role})
            continue
        if entries is None:
            issues.append(Issue("weights", f"map of {amap.stack} ({amap.kind}) has no "
                                           f"reference: the eager model gives no {role}"))
            continue
        q_valid, k_valid = (m[b] for m in _masks_of(role, masks))
        for i, model_layer in enumerate(amap.layers):
            layer = order.get((amap.stack, amap.kind, model_layer), model_layer)
            site = f"map {amap.stack}.{model_layer}"
            if (role, b, layer) in seen:
                issues.append(Issue("weights", f"{role}[{layer}] captured twice ({site} and "
                                               f"map {seen[role, b, layer]}.{layer})"))
                continue
            seen[role, b, layer] = amap.stack
            if (role, layer) in ref.unusable:
                unverified[ref.unusable[role, layer]] = None
                continue
            if not 0 <= layer < len(entries) or entries[layer] is None:
                issues.append(Issue("weights", f"{site} has no reference: {role} has "
                                               f"{len(entries)} entries"))
                continue
            target = entries[layer][b]
            if list(amap.heads) != list(range(target.shape[0])):
                issues.append(Issue("weights", f"{site}: heads {list(amap.heads)} of "
                                               f"{target.shape[0]}"))
                continue
            expected = _crop(target.float(), q_valid, k_valid)
            got = amap.pattern[i]
            if got.shape != expected.shape:
                issues.append(Issue("weights", f"{site}: {list(got.shape)} vs reference "
                                               f"{list(expected.shape)} (example {b})"))
                continue
            diff = (got - expected).abs().nan_to_num(nan=float("inf")).max().item()
            worst = max(worst, diff)
            if diff > WEIGHT_TOL:
                issues.append(Issue("weights", f"{role}[{layer}] example {b} differs", diff))
    for role, entries in refs.items():
        for b in range(masks["main"].shape[0]):
            missing = [i for i, e in enumerate(entries) if e is not None and (role, b, i)
                       not in seen]
            if missing:
                issues.append(Issue("weights", f"{role} layers {missing} have no map "
                                               f"(example {b})"))
                break
    return _merge(issues), worst, list(unverified)


def compare_partial(full: Sequence[Any], partial: Sequence[Any], layer: int) -> list[Issue]:
    """Maps of a capture scoped to ``layer`` equal that layer of the full capture's maps (the
    other layers ran their original attention meanwhile)."""
    whole = {(m.example_id, m.stack, m.kind, x): m.pattern[i]
             for m in full for i, x in enumerate(m.layers)}
    issues = []
    for amap in partial:
        other = whole.get((amap.example_id, amap.stack, amap.kind, layer))
        if amap.layers != (layer,) or other is None:
            issues.append(Issue("partial", f"scope layer:{layer} gave {amap.stack} layers "
                                           f"{amap.layers}"))
            continue
        diff = (amap.pattern[0] - other).abs().max().item()
        if diff > WEIGHT_TOL:
            issues.append(Issue("partial", f"{amap.stack} layer {layer} differs from the full "
                                           "capture", diff))
    if not partial:
        issues.append(Issue("partial", f"scope layer:{layer} gave no map"))
    return _merge(issues)


def _merge(issues: list[Issue]) -> list[Issue]:
    """One issue per distinct detail pattern (the worst example of each); structural ones
    (missing, extra or doubled layers, shapes) first: they explain the differences."""
    out: dict[str, Issue] = {}
    for issue in issues:
        key = issue.detail.split(" example ")[0]
        old = out.get(key)
        if old is None or (issue.worst > old.worst):
            out[key] = issue
    return sorted(out.values(), key=lambda i: i.worst == i.worst)  # NaN worst: structural


def distance_from_uniform(ref: Reference, masks: dict[str, torch.Tensor]) -> float:
    """Mean total variation distance of the reference's real rows from the uniform row over
    the keys each row may see (its nonzero entries): 0 means attention is uniform."""
    tvds = []
    for role, entries in ref.entries.items():
        q_mask, k_mask = _masks_of(role, masks)
        for entry in entries:
            if entry is None:
                continue
            for b in range(entry.shape[0]):
                rows = _crop(entry[b].float(), q_mask[b], k_mask[b])
                support = (rows > 0).sum(-1, keepdim=True).clamp(min=1)
                uniform = torch.where(rows > 0, 1.0 / support, torch.zeros_like(rows))
                tvds.append(0.5 * (rows - uniform).abs().sum(-1).flatten())
    return torch.cat(tvds).nanmean().item() if tvds else float("nan")


# ------------------------------------------------------------------ outputs
def _tensors(output: Any) -> dict[str, torch.Tensor]:
    """Floating tensors of a model output by name (tuples flattened as ``name[i]``)."""
    found = {}
    items = output.items() if hasattr(output, "items") else enumerate(output)
    for key, value in items:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            found[str(key)] = value
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                if isinstance(v, torch.Tensor) and v.is_floating_point():
                    found[f"{key}[{i}]"] = v
    return found


def _real(name: str, t: torch.Tensor, masks: dict[str, torch.Tensor],
          encoder_decoder: bool) -> torch.Tensor:
    """The entries of ``t`` at real positions when its second axis spans a side."""
    side = "main" if name.startswith("encoder") or not encoder_decoder else "decoder"
    mask = masks.get(side, masks["main"])
    if t.ndim >= 2 and t.shape[:2] == mask.shape:
        return t[mask]
    return t


def _scale(t: torch.Tensor) -> float:
    """``max(1, max |t|)`` over the finite entries: what a relative tolerance is taken of."""
    return max(1.0, t.abs().masked_fill(~torch.isfinite(t), 0).max().item()
               if t.numel() else 1.0)


def output_bounds(base: Any, eager: Any, masks: dict[str, torch.Tensor],
                  encoder_decoder: bool, depth: int) -> dict[str, float]:
    """Per output of ``base``, how far a captured forward may be from it: the captured
    layers run the model's eager attention and the others its default (SDPA), so a correct
    capture moves an output by about the model's own SDPA-vs-eager difference on the same
    input (``eager``: the eager twin's output, measured, not assumed). Allowed:
    :data:`IMPLEMENTATION_MULTIPLE` times that difference, plus float32 rounding for a model
    whose two paths agree bitwise: ``eps * scale * keys * depth`` -- the worst-case relative
    rounding of a reduction over the ``keys`` (padded key length, weights x values) in each
    of the ``depth`` attention calls of one forward (recurrences counted: a looped model
    accumulates it per call)."""
    keys = max(m.shape[-1] for m in masks.values())
    bounds = {}
    eager_t = _tensors(eager)
    for name, ref in _tensors(base).items():
        ref = _real(name, ref.float(), masks, encoder_decoder)
        scale = _scale(ref)
        other = eager_t.get(name)
        gap = 0.0
        if other is not None and other.shape == _tensors(base)[name].shape:
            other = _real(name, other.float(), masks, encoder_decoder)
            finite = torch.isfinite(ref) & torch.isfinite(other)
            gap = (other - ref).abs()[finite].max().item() if finite.any() else 0.0
        bounds[name] = IMPLEMENTATION_MULTIPLE * gap + EPS32 * scale * keys * max(1, depth)
    return bounds


def compare_outputs(base: Any, captured: Any, masks: dict[str, torch.Tensor],
                    encoder_decoder: bool, bounds: dict[str, float],
                    names: Sequence[str] | None = None) -> list[Issue]:
    """Captured forward = uncaptured forward on real positions: ``|diff| <= bounds[name]``
    (:func:`output_bounds`: measured on the same input, never a fixed tolerance, which a
    recurrent-depth model's amplified rounding exceeds on some instruction sets);
    ``names``: only these outputs of ``base`` (default all)."""
    issues = []
    base_t, cap_t = _tensors(base), _tensors(captured)
    if names is not None:
        base_t = {name: t for name, t in base_t.items() if name in set(names)}
    for name, ref in base_t.items():
        got = cap_t.get(name)
        if got is None or got.shape != ref.shape:
            issues.append(Issue("outputs", f"{name} missing or reshaped under capture"))
            continue
        ref, got = (_real(name, t.float(), masks, encoder_decoder) for t in (ref, got))
        both_nan = ref.isnan() & got.isnan()
        diff = (got - ref).abs().masked_fill(both_nan, 0).nan_to_num(nan=float("inf"))
        scale = _scale(ref)
        worst = diff.max().item() if diff.numel() else 0.0
        if worst > bounds[name]:
            issues.append(Issue("outputs", f"{name} changed under capture (scale {scale:.3g})",
                                worst))
    return issues


def output_names(output: Any) -> list[str]:
    """Names of the floating outputs :func:`compare_outputs` compares."""
    return list(_tensors(output))


def finite_on_real(output: Any, masks: dict[str, torch.Tensor], encoder_decoder: bool
                   ) -> list[str]:
    """Names of floating outputs with a non-finite value at a real position."""
    return [name for name, t in _tensors(output).items()
            if not torch.isfinite(_real(name, t.float(), masks, encoder_decoder)).all()]


# ------------------------------------------------------------------ restored, errors
def config_state(model: torch.nn.Module) -> list[tuple[int, Any]]:
    """``(id, _attn_implementation)`` of every config of the model, its sub-models and their
    sub-configs (recursively)."""
    found: dict[int, Any] = {}
    todo = [getattr(m, "config", None) for m in model.modules()]
    while todo:
        config = todo.pop()
        if config is None or id(config) in found or not hasattr(config, "to_dict"):
            continue
        found[id(config)] = config
        todo.extend(getattr(config, k, None) for k in getattr(config, "sub_configs", {}) or {})
    return sorted((key, getattr(c, "_attn_implementation", None)) for key, c in found.items())


def _short(path: str) -> str:
    parts = Path(path).parts
    for anchor in ("site-packages", "main"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) + 1:])
    return "/".join(parts[-3:])


def where(err: BaseException) -> str:
    """``at file:line in fn; via attnprobe/...:line in fn``: the innermost frame of the
    traceback, and the innermost attnprobe frame when that is another one ("" if none)."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    text = f"at {_short(last.filename)}:{last.lineno} in {last.name}"
    ours = [f for f in frames if "/attnprobe/" in f.filename and "/analyses/" not in f.filename]
    if ours and ours[-1] is not last:
        text += f"; via {_short(ours[-1].filename)}:{ours[-1].lineno} in {ours[-1].name}"
    return text


def describe_error(err: BaseException) -> str:
    """``Type: first line (where)``; see :func:`where`."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    text = f"{type(err).__name__}: {lines[0].strip() if lines else ''}".rstrip(": ")
    place = where(err)
    return f"{text} ({place})" if place else text
