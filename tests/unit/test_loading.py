"""Loading local HuggingFace checkpoints keeps the head they were saved with, and a broken
model directory is a one-line error."""

import json
import re

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
from attnprobe.errors import AttnProbeError, InputError, ModelNotFoundError
from tests.helpers import run_cli


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


# ------------------------------------------------------------ broken model directories
CONFIG = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=20)


class _Payload:
    """Pickles to "open(marker, 'w')": loading it with plain pickle would create the file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _no_tokenizer(folder):
    BertModel(CONFIG).save_pretrained(folder)


def _no_model_type(folder):
    _save(BertModel(CONFIG), folder, _tokenizer())
    config = json.loads((folder / "config.json").read_text())
    del config["model_type"]
    (folder / "config.json").write_text(json.dumps(config))


def _bad_config_json(folder):
    _save(BertModel(CONFIG), folder, _tokenizer())
    (folder / "config.json").write_text("{not json")


def _corrupt_safetensors(folder):
    _save(BertModel(CONFIG), folder, _tokenizer())
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)


def _truncated_safetensors(folder):
    _save(BertModel(CONFIG), folder, _tokenizer())
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _malicious_bin(folder):
    _save(BertModel(CONFIG), folder, _tokenizer())
    (folder / "model.safetensors").unlink()
    torch.save({"embeddings.word_embeddings.weight": _Payload(folder / "pwned")},
               folder / "pytorch_model.bin")


BROKEN = {
    "no tokenizer": (_no_tokenizer, r"has no tokenizer files: the tokenizer built from it "
                                    r"knows only its 5 special tokens, so every word would "
                                    r"be \[UNK\]"),
    "no model_type": (_no_model_type, r"config\.json is not a usable model config: .*model_type"),
    "bad config json": (_bad_config_json, r"config\.json is not a usable model config: .*JSON"),
    "corrupt safetensors": (_corrupt_safetensors, r"cannot load the weights in .*header"),
    "truncated safetensors": (_truncated_safetensors, r"cannot load the weights in .*"),
    "malicious bin": (_malicious_bin, r"the \.bin checkpoint holds objects other than tensors, "
                                      r"so it was not unpickled"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_model_directory_is_a_one_line_error(case, tmp_path):
    build, message = BROKEN[case]
    torch.manual_seed(0)
    build(tmp_path)
    with pytest.raises(AttnProbeError, match=message) as caught:
        ap.load_model(str(tmp_path))
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "pwned").exists()  # the pickle payload never ran


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_model_directory_exits_2_from_the_command_line(case, tmp_path, capsys):
    build, message = BROKEN[case]
    (tmp_path / "model").mkdir()
    build(tmp_path / "model")
    code, printed, err = run_cli(["extract", "--model", str(tmp_path / "model"), "--text",
                                  "w1 w2", "--out", str(tmp_path / "maps.npz")], capsys)
    assert code == 2 and printed == ""
    assert err.startswith("attnprobe: error:") and err.count("\n") == 1
    assert re.search(message, err) and "Traceback" not in err
    assert not (tmp_path / "maps.npz").exists()


def test_a_tokenizer_with_words_still_loads(tmp_path):
    # the guard counts real tokens: 59 words beyond the 5 specials pass
    _save(BertModel(CONFIG), tmp_path, _tokenizer())
    _, tokenizer = ap.load_model(str(tmp_path))
    assert tokenizer.tokenize("w1 w2") == ["w1", "w2"]


def test_a_model_loaded_without_its_weights_is_refused(tmp_path, monkeypatch):
    # what from_pretrained(device_map="meta") or a failed lazy load gives: parameters with
    # no data, on which every later forward fails with a raw torch error
    _save(BertModel(CONFIG), tmp_path, _tokenizer())
    load = BertModel.from_pretrained.__func__

    def on_meta(cls, *args, **kwargs):
        return load(cls, *args, **kwargs).to("meta")

    monkeypatch.setattr(BertModel, "from_pretrained", classmethod(on_meta))
    with pytest.raises(InputError, match=r"was loaded without its weights \(on the 'meta' "
                                         r"device\)"):
        ap.load_model(str(tmp_path))
