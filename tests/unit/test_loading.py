"""Loading local HuggingFace checkpoints keeps the head they were saved with."""

import pytest
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    BertTokenizerFast,
    GPT2Config,
    GPT2LMHeadModel,
)

import attnprobe as ap
from attnprobe.errors import ModelNotFoundError


def _tokenizer():
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                         *(f"w{i}" for i in range(59))])}
    return BertTokenizerFast(vocab=vocab, do_lower_case=True)


def _save(model, tmp_path, tokenizer):
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return str(tmp_path)


@pytest.mark.parametrize(("cls", "config", "n_out"), [
    (BertForSequenceClassification,
     BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=20, num_labels=3), 3),
    (GPT2LMHeadModel, GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2), 64),
    (BertModel, BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=20), None),
])
def test_a_saved_checkpoint_loads_as_its_own_class(tmp_path, cls, config, n_out):
    torch.manual_seed(0)
    saved = cls(config).eval()
    path = _save(saved, tmp_path, _tokenizer())
    model, _ = ap.load_model(path)
    assert type(model) is cls
    ids = torch.randint(5, 60, (1, 6))
    with torch.no_grad():
        ours, theirs = model(input_ids=ids), saved(input_ids=ids)
    if n_out is None:
        assert torch.allclose(ours.last_hidden_state, theirs.last_hidden_state)
    else:
        assert ours.logits.shape[-1] == n_out
        assert torch.allclose(ours.logits, theirs.logits)


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="nothing is downloaded"):
        ap.load_model(str(tmp_path / "missing"))
