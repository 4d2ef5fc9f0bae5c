"""attnprobe's own reference models, one attention mechanism family per file.

Each model exposes hook points ``blocks.{i}.attn.hook_scores`` / ``blocks.{i}.attn.hook_pattern``
(``[batch, head, query, key]``). Build one by name::

    model, tok = build_reference("transformer", seed=0)
    logits = model(**tok(["The cat sat on the mat."]))
"""

# Mechanism families register their builders in REFERENCE_MODELS when imported.
from attnprobe.models import (  # noqa: F401
    classifier,
    decoder_only,
    encoder_decoder,
    induction,
    linear_attention,
    pooling,
    positional,
    rnn_attention,
    seq2seq,
    sparse,
)
from attnprobe.models.attention import (
    MultiHeadAttention,
    ScaledDotProductAttention,
    scaled_dot_product,
)
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.models.transformer import Block, TransformerConfig, TransformerModel
from attnprobe.models.zoo import REFERENCE_MODELS, build_reference

__all__ = [
    "REFERENCE_MODELS",
    "Block",
    "MultiHeadAttention",
    "ScaledDotProductAttention",
    "TransformerConfig",
    "TransformerModel",
    "WordTokenizer",
    "build_reference",
    "scaled_dot_product",
]
