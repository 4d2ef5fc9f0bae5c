"""What the tests share: tiny random transformers models (2 layers, 2 heads, width 16), the
command line run in-process, and a fresh interpreter's printout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
import transformers

from tests.conftest import track

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BERT_WORDS = "the cat sat on a mat dog ran big red"


def bert_vocab(words: str = BERT_WORDS) -> dict[str, int]:
    """The word-piece vocabulary: BERT's special tokens, then ``words`` (space separated)."""
    return {t: i for i, t in enumerate([*SPECIALS, *words.split()])}


def bert_tokenizer(vocab: dict[str, int]) -> transformers.BertTokenizerFast:
    return transformers.BertTokenizerFast(vocab=vocab, do_lower_case=True)


def tiny_bert_config(vocab: dict[str, int], **kw) -> transformers.BertConfig:
    return transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=64, initializer_range=0.3, **kw)


def tiny_bert(vocab: dict[str, int], implementation: str = "sdpa") -> transformers.BertModel:
    """A seeded random ``BertModel`` (eval, tracked for left-over hooks)."""
    torch.manual_seed(0)
    config = tiny_bert_config(vocab, attn_implementation=implementation)
    return track(transformers.BertModel(config).eval())


def saved_tiny_bert(folder: Path) -> str:
    """:func:`tiny_bert` and its tokenizer (which adds [CLS] and [SEP]) saved in ``folder``,
    for ``--model``: the folder as a string."""
    vocab = bert_vocab()
    tiny_bert(vocab).save_pretrained(folder)
    bert_tokenizer(vocab).save_pretrained(folder)
    return str(folder)


def tiny_bert_classifier(words: str = BERT_WORDS):
    """A seeded random 2-class ``BertForSequenceClassification`` (eval, tracked) and its
    tokenizer."""
    vocab = bert_vocab(words)
    tok = bert_tokenizer(vocab)
    torch.manual_seed(0)
    config = tiny_bert_config(vocab, num_labels=2)
    return track(transformers.BertForSequenceClassification(config).eval()), tok


def run_cli(argv, capsys) -> tuple[int, str, str]:
    """``attnprobe`` with ``argv``: exit code (argparse's own exits included), stdout, stderr."""
    from attnprobe.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse exits by itself
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def fresh_python(code: str, cwd: str | Path | None = None) -> str:
    """What a new interpreter running ``code`` prints (stripped); the test fails (with the
    traceback) when the code raises. For what one process cannot show: which modules an
    import loads, signal handlers."""
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=cwd)
    assert found.returncode == 0, found.stderr
    return found.stdout.strip()
