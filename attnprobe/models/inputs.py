"""Checks shared by every reference model's inputs: token ids, masks and positions."""

from __future__ import annotations

import torch

from attnprobe.errors import InputError


def check_token_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *,
                       vocab_size: int, max_len: int | None = None,
                       name: str = "input_ids") -> torch.Tensor:
    """Validate ``[batch, seq]`` ids and their 0/1 mask; return the bool real-token mask."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
        got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else input_ids
        raise InputError(f"{name} must be a 2-d [batch, seq] tensor; got {got!r}")
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise InputError(f"{name} must be an integer tensor; got {input_ids.dtype}")
    batch, seq = input_ids.shape
    if seq == 0:
        raise InputError(f"{name} has no tokens (seq length 0)")
    if max_len is not None and seq > max_len:
        raise InputError(f"{name} has {seq} tokens but the model's max_len is {max_len}; "
                         "shorten the text")
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size:
        raise InputError(f"{name} must lie in [0, {vocab_size}); got "
                         f"[{int(input_ids.min())}, {int(input_ids.max())}]")
    if attention_mask is None:
        return torch.ones(batch, seq, dtype=torch.bool, device=input_ids.device)
    if tuple(attention_mask.shape) != (batch, seq):
        raise InputError(f"the mask must have the shape of {name} {(batch, seq)}; "
                         f"got {tuple(attention_mask.shape)}")
    if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise InputError(f"the mask of {name} must contain only 0 and 1")
    real = attention_mask.to(input_ids.device) != 0  # [batch, seq]
    empty = (~real.any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise InputError(f"fully masked example(s) {empty} in {name}: no real token")
    return real


def check_token_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                          config: object) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`check_token_inputs` against ``config.vocab_size`` and ``config.max_len``; returns
    the bool real-token mask and :func:`positions_from_mask` of it, both ``[batch, seq]``."""
    real = check_token_inputs(input_ids, attention_mask,
                              vocab_size=config.vocab_size,  # type: ignore[attr-defined]
                              max_len=config.max_len)  # type: ignore[attr-defined]
    return real, positions_from_mask(real)


def check_encoder_decoder_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    decoder_input_ids: torch.Tensor | None,
    decoder_attention_mask: torch.Tensor | None,
    *,
    vocab_size: int,
    max_len: int | None = None,
    hint: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`check_token_inputs` for a source and its target (one target per example).

    ``hint`` ends the error for a missing ``decoder_input_ids``. Returns the bool real-token
    masks ``(source [batch, src], target [batch, tgt])``.
    """
    if decoder_input_ids is None:
        raise InputError(f"decoder_input_ids is required: {hint}")
    sizes = {"vocab_size": vocab_size, "max_len": max_len}
    src_real = check_token_inputs(input_ids, attention_mask, **sizes)  # [batch, src]
    tgt_real = check_token_inputs(decoder_input_ids, decoder_attention_mask,
                                  name="decoder_input_ids", **sizes)  # [batch, tgt]
    if decoder_input_ids.shape[0] != input_ids.shape[0]:
        raise InputError(f"input_ids has batch {input_ids.shape[0]} but decoder_input_ids has "
                         f"batch {decoder_input_ids.shape[0]}: give one target per source "
                         "(the numbers of examples differ)")
    return src_real, tgt_real


def check_key_padding_mask(key_padding_mask: torch.Tensor | None, batch: int, n_key: int,
                           device: torch.device) -> torch.Tensor | None:
    """Validate a ``[batch, key]`` key padding mask (nonzero = real token); return it as a
    bool tensor on ``device``, or None when there is none."""
    if key_padding_mask is None:
        return None
    if tuple(key_padding_mask.shape) != (batch, n_key):
        raise InputError(
            f"key_padding_mask must be [batch, key] = {(batch, n_key)}; "
            f"got {tuple(key_padding_mask.shape)}"
        )
    return key_padding_mask.to(device) != 0  # [batch, key]


def positions_from_mask(real: torch.Tensor) -> torch.Tensor:
    """``[batch, seq]`` position of each token among the real ones (0 on leading padding)."""
    return (real.long().cumsum(dim=1) - 1).clamp(min=0)


def check_sizes(config: object, *names: str) -> None:
    """InputError unless every named field of ``config`` is at least 1 (a config's
    ``__post_init__`` check of its sizes)."""
    for name in names:
        if getattr(config, name) < 1:
            raise InputError(f"{name} must be >= 1; got {getattr(config, name)}")


class ConfigSizes:
    """``n_layers`` / ``n_heads`` read from ``self.config`` (what capture and reports ask)."""

    config: object

    @property
    def n_layers(self) -> int:
        return self.config.n_layers  # type: ignore[attr-defined]

    @property
    def n_heads(self) -> int:
        return self.config.n_heads  # type: ignore[attr-defined]
