"""GRU sequence-to-sequence models, with a fixed context or with attention (seeds 001, 002).

- ``attention="none"``: the decoder starts from the encoder's final state and also reads it at
  every step (Cho et al. 2014); there is no attention and nothing to capture.
- ``"bahdanau"``: step ``t`` attends with the previous decoder state ``s_{t-1}`` and feeds the
  context into the GRU: ``c_t = attn(s_{t-1}, H)``, ``s_t = GRU([y_{t-1}; c_t], s_{t-1})``.
- ``"luong-*"``: the GRU runs first and the new state attends (with input feeding):
  ``s_t = GRU([y_{t-1}; h̃_{t-1}], s_{t-1})``, ``c_t = attn(s_t, H)``.
  ``luong-local-m`` / ``luong-local-p`` use Luong's local window (``local_window`` = D).

Every variant predicts from ``h̃_t = tanh(W_c [c_t; s_t])`` (``c_t`` = the encoder's final
state without attention) and ``logits_t = W_o h̃_t``.

Hook paths: ``decoder.cross_attn.hook_scores`` / ``decoder.cross_attn.hook_pattern``, called
once per decoder step with ``[batch, 1, 1, src]``; capture stacks the steps into a
``[batch, 1, tgt, src]`` cross-attention map.

Padding: the encoder packs each row's real tokens (left or right padding alike), padding keys
get zero weight, and a padding decoder step leaves the decoder state unchanged, so padded and
unpadded inputs give the same logits on real positions.

Size of the registered models (WordTokenizer vocab of 418, embed 32, hidden 64, one GRU layer
per side): about 112k parameters without attention, 116k with Luong general, 120k with Bahdanau
(most of them in the two embeddings and the output layer). A teacher-forced Adam step on 32
copy examples of source length 10-50 takes about 0.05 s (none), 0.08 s (Luong) and 0.12 s
(Bahdanau) on one CPU thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
from torch import nn

from attnprobe.errors import InputError
from attnprobe.models.inputs import (
    check_encoder_decoder_inputs,
    check_sizes,
    check_token_inputs,
    positions_from_mask,
)
from attnprobe.models.rnn_attention import (
    BahdanauAttention,
    LocalAttention,
    LuongAttention,
    real_first,
    run_packed,
)
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.models.zoo import REFERENCE_MODELS, seeded_reference

AttentionKind = Literal[
    "none", "bahdanau", "luong-dot", "luong-general", "luong-concat",
    "luong-local-m", "luong-local-p",
]
_KINDS: tuple[str, ...] = get_args(AttentionKind)


@dataclass
class Seq2SeqConfig:
    """Hyperparameters of :class:`Seq2Seq`.

    ``n_layers`` counts attention layers (1; 0 without attention), ``n_heads`` the heads of the
    cross-attention (1; 0 without). ``causal`` is False: the only attention (decoder ->
    encoder) sees the whole source; the decoder is left-to-right by construction.
    """

    vocab_size: int
    d_embed: int = 32
    d_hidden: int = 64
    attention: AttentionKind = "bahdanau"
    local_window: int = 2
    pad_id: int = 0
    causal: bool = False
    is_encoder_decoder: bool = True
    n_layers: int = field(init=False)
    n_heads: int = field(init=False)

    def __post_init__(self) -> None:
        if self.attention not in _KINDS:
            raise InputError(f"attention must be one of {list(_KINDS)}; got {self.attention!r}")
        check_sizes(self, "vocab_size", "d_embed", "d_hidden")
        self.n_layers = self.n_heads = 0 if self.attention == "none" else 1


class Encoder(nn.Module):
    """Embedding + one-layer GRU over the real tokens of each row.

    Shapes: ids ``[batch, src]``, real ``[batch, src]`` bool -> states ``[batch, src, hidden]``
    (zeros at padding) and the final state ``[batch, hidden]`` (after the last real token).
    """

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.d_embed)
        self.gru = nn.GRU(config.d_embed, config.d_hidden, batch_first=True)

    def forward(self, ids: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        order = real_first(real)  # [batch, src]: each row's real tokens first
        x = self.embed(ids.gather(1, order))  # [batch, src, embed]
        states, final = run_packed(self.gru, x, real, order)  # final: [1, batch, hidden]
        return states, final[0]  # [batch, src, hidden], [batch, hidden]


class Decoder(nn.Module):
    """GRU cell stepped over the target; ``cross_attn`` (absent without attention) is called
    once per step. See the module docstring for the update of each variant."""

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        d, kind = config.d_hidden, config.attention
        self.kind = kind
        self.embed = nn.Embedding(config.vocab_size, config.d_embed)
        self.cell = nn.GRUCell(config.d_embed + d, d)
        if kind == "bahdanau":
            self.cross_attn = BahdanauAttention(d, d)
        elif kind in ("luong-local-m", "luong-local-p"):
            mode = "monotonic" if kind == "luong-local-m" else "predictive"
            self.cross_attn = LocalAttention(d, d, config.local_window, mode, "general")
        elif kind != "none":
            self.cross_attn = LuongAttention(d, d, kind.removeprefix("luong-"))  # type: ignore[arg-type]
        self.combine = nn.Linear(2 * d, d)
        self.out = nn.Linear(d, config.vocab_size)

    def _attend(self, query: torch.Tensor, memory: tuple[torch.Tensor, ...],
                t: int | torch.Tensor) -> torch.Tensor:
        states, _, real = memory
        if isinstance(self.cross_attn, LocalAttention):
            return self.cross_attn(query, states, real, step=t)[0]
        return self.cross_attn(query, states, real)[0]  # [batch, hidden]

    def step(
        self,
        tokens: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor],
        memory: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        t: int | torch.Tensor,
        real_t: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One decoder step.

        Args:
            tokens: ``[batch]`` previous target tokens ``y_{t-1}``.
            state: ``(s_{t-1} [batch, hidden], feed [batch, hidden])``, feed = ``h̃_{t-1}``.
            memory: ``(encoder states [batch, src, hidden], final [batch, hidden],
                real source keys [batch, src] bool)``.
            t: step index, int or ``[batch]`` (counts real target tokens; local-m's centre).
            real_t: ``[batch]`` bool, False = padding step (the state is kept); None = all real.

        Returns:
            ``(logits [batch, vocab], new state)``.
        """
        s, feed = state
        if self.kind == "none":
            feed = memory[1]  # the fixed context: the encoder's final state
        elif self.kind == "bahdanau":
            feed = self._attend(s, memory, t)  # c_t from s_{t-1}
        new_s = self.cell(torch.cat([self.embed(tokens), feed], dim=-1), s)  # [batch, hidden]
        if self.kind == "none":
            context = memory[1]
        elif self.kind == "bahdanau":
            context = feed
        else:
            context = self._attend(new_s, memory, t)  # Luong: c_t from s_t
        h_tilde = torch.tanh(self.combine(torch.cat([context, new_s], dim=-1)))  # [batch, hidden]
        logits = self.out(h_tilde)  # [batch, vocab]
        if real_t is not None:  # padding steps leave the recurrent state untouched
            keep = real_t[:, None]
            new_s, h_tilde = torch.where(keep, new_s, s), torch.where(keep, h_tilde, state[1])
        return logits, (new_s, h_tilde)


class Seq2Seq(nn.Module):
    """GRU encoder–decoder; ``config.attention`` picks the decoder's attention (or none).

    Shapes:
        input_ids ``[batch, src]``, decoder_input_ids ``[batch, tgt]`` (masks alike,
        1 = real token) -> logits ``[batch, tgt, vocab]``.
    """

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(states [batch, src, hidden], final [batch, hidden], real [batch, src])``."""
        real = check_token_inputs(input_ids, attention_mask, vocab_size=self.config.vocab_size)
        states, final = self.encoder(input_ids, real)
        return states, final, real

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits ``[batch, tgt, vocab]`` (finite but meaningless at padding).

        Raises:
            InputError: missing ``decoder_input_ids``, bad shapes, ids out of range, an
                example without real tokens, or (local attention) a source shorter than 2D+1.
        """
        src_real, dec_real = check_encoder_decoder_inputs(
            input_ids, attention_mask, decoder_input_ids, decoder_attention_mask,
            vocab_size=self.config.vocab_size,
            hint="the teacher-forced target (use generate() to decode from the source alone)",
        )  # [batch, src], [batch, tgt]
        memory = (*self.encoder(input_ids, src_real), src_real)  # states, final, real
        step = positions_from_mask(dec_real)  # [batch, tgt] real-step index
        state = (memory[1], torch.zeros_like(memory[1]))
        logits = []
        for t in range(decoder_input_ids.shape[1]):
            step_logits, state = self.decoder.step(
                decoder_input_ids[:, t], state, memory, step[:, t], dec_real[:, t])
            logits.append(step_logits)
        return torch.stack(logits, dim=1)  # [batch, tgt, vocab]

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int = 64,
        bos_id: int = 1,
        eos_id: int = 2,
    ) -> torch.Tensor:
        """Greedy decoding from ``[BOS]``.

        Returns:
            LongTensor ``[batch, n]``, ``n <= max_new_tokens``: the generated tokens (``[BOS]``
            excluded, ``eos_id`` included); after an example's EOS its row holds ``pad_id``.
            Stops early once every example has produced ``eos_id``.
        """
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be >= 1; got {max_new_tokens}")
        for name, i in (("bos_id", bos_id), ("eos_id", eos_id)):
            if not 0 <= i < self.config.vocab_size:
                raise InputError(f"{name}={i} is outside the vocabulary [0, "
                                 f"{self.config.vocab_size})")
        memory = self.encode(input_ids, attention_mask)
        batch = input_ids.shape[0]
        state = (memory[1], torch.zeros_like(memory[1]))
        tokens = torch.full((batch,), bos_id, dtype=torch.long, device=input_ids.device)
        done = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)
        out = []
        for t in range(max_new_tokens):
            logits, state = self.decoder.step(tokens, state, memory, t)
            tokens = logits.argmax(dim=-1)  # [batch]
            out.append(tokens.masked_fill(done, self.config.pad_id))
            done = done | (tokens == eos_id)
            if bool(done.all()):
                break
        return torch.stack(out, dim=1)  # [batch, n]


def _build(name: str, seed: int, attention: AttentionKind,
           **config: int) -> tuple[nn.Module, WordTokenizer]:
    tokenizer = WordTokenizer()
    return seeded_reference(name, seed, tokenizer, lambda: Seq2Seq(Seq2SeqConfig(
        vocab_size=len(tokenizer), attention=attention, **config)))


@REFERENCE_MODELS.register("rnn-seq2seq")
def rnn_seq2seq(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """GRU encoder-decoder with a fixed context (final encoder state), no attention."""
    return _build("rnn-seq2seq", seed, "none")


@REFERENCE_MODELS.register("rnn-bahdanau")
def rnn_bahdanau(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """GRU encoder-decoder with Bahdanau additive attention over the encoder states."""
    return _build("rnn-bahdanau", seed, "bahdanau")


@REFERENCE_MODELS.register("rnn-luong")
def rnn_luong(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """GRU encoder-decoder with Luong general (bilinear) attention and input feeding."""
    return _build("rnn-luong", seed, "luong-general")


@REFERENCE_MODELS.register("rnn-luong-dot")
def rnn_luong_dot(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """GRU encoder-decoder with Luong dot attention and input feeding."""
    return _build("rnn-luong-dot", seed, "luong-dot")


@REFERENCE_MODELS.register("rnn-luong-concat")
def rnn_luong_concat(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """GRU encoder-decoder with Luong concat attention and input feeding."""
    return _build("rnn-luong-concat", seed, "luong-concat")


@REFERENCE_MODELS.register("rnn-luong-local-m")
def rnn_luong_local_m(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """GRU encoder-decoder with Luong local-m attention (window [t-D, t+D], D = 1)."""
    return _build("rnn-luong-local-m", seed, "luong-local-m", local_window=1)


@REFERENCE_MODELS.register("rnn-luong-local-p")
def rnn_luong_local_p(seed: int = 0) -> tuple[nn.Module, WordTokenizer]:
    """GRU encoder-decoder with Luong local-p attention (predicted centre, Gaussian, D = 1)."""
    return _build("rnn-luong-local-p", seed, "luong-local-p", local_window=1)
