"""A report prepares its corpus once (issue 25 item 3): through ``from_model`` — the census,
the comparison, the attention views, the direct logit attribution — the model's length limit
(``max_length_of`` / ``token_limit``) and the tokenizer's token classes (``token_classes``)
are computed once for the one tokenizer, and each text is tokenized once."""

from __future__ import annotations

import importlib
import sys
from collections import Counter

import pytest

from attnprobe.inputs.prepared import prepare
from attnprobe.models import build_reference
from attnprobe.report import from_model

# words of the reference models' vocabulary, so no text is only [UNK]
TEXTS = ["the cat sat on the mat .", "a dog ran to the park .", "this is a big house ."]
# ap.capture is also a function: the modules by their full names
COUNTED = {"max_length_of": "attnprobe.inputs.length_limit",
           "token_limit": "attnprobe.inputs.length_limit",
           "token_classes": "attnprobe.core.tokens", "token_rows": "attnprobe.inputs.text"}


@pytest.fixture(scope="module")
def llama():
    """A pre-norm causal LM with an unembedding: every section but patching applies."""
    model, tok = build_reference("llama", seed=0)
    return model.eval(), tok


def _count_calls(monkeypatch: pytest.MonkeyPatch, calls: Counter) -> None:
    """Every attnprobe module's reference to each counted function, wrapped to count it per
    tokenizer (the functions are imported by name into many modules)."""
    for name, home in COUNTED.items():
        original = getattr(importlib.import_module(home), name)

        def counting(*args, _name=name, _original=original, **kwargs):
            tokenizer = next((a for a in args if hasattr(a, "get_vocab")), None)
            calls[(_name, id(tokenizer))] += 1
            return _original(*args, **kwargs)

        for module in list(sys.modules.values()):
            if (getattr(module, "__name__", "") or "").startswith("attnprobe") \
                    and getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counting)


def _count_texts(monkeypatch: pytest.MonkeyPatch, tok, seen: Counter) -> None:
    """How many times the tokenizer is given each corpus text."""
    original = type(tok).__call__

    def counting(self, texts, *args, **kwargs):
        for text in [texts] if isinstance(texts, str) else texts:
            if isinstance(text, str) and text in TEXTS:
                seen[text] += 1
        return original(self, texts, *args, **kwargs)

    monkeypatch.setattr(type(tok), "__call__", counting)


def test_from_model_reads_each_fact_once_per_tokenizer(llama, monkeypatch):
    model, tok = llama
    calls: Counter = Counter()
    seen: Counter = Counter()
    _count_calls(monkeypatch, calls)
    _count_texts(monkeypatch, tok, seen)
    page = from_model(model, tok, TEXTS, target="next-token", view_texts=2, n_steps=2,
                      composition=False)
    contents = page.contents
    # every section that reads the corpus ran
    assert contents.census is not None and contents.comparison is not None
    assert len(contents.maps) == 2 and contents.logit_attribution is not None
    per_tokenizer = {(name, key): n for (name, key), n in calls.items() if key == id(tok)}
    limits = per_tokenizer.get(("max_length_of", id(tok)), 0)
    assert limits == 1, calls  # token_limit reads max_length_of, so it counts here too
    assert per_tokenizer.get(("token_classes", id(tok)), 0) == 1, calls
    assert per_tokenizer.get(("token_rows", id(tok)), 0) == 1, calls
    assert seen == Counter({text: 1 for text in TEXTS}), seen


def test_a_prepared_corpus_is_handed_on_not_prepared_again(llama):
    model, tok = llama
    prepared = prepare(model, tok, TEXTS)
    assert prepare(model, tok, prepared) is prepared
    head = prepared.head(2)
    assert list(head) == TEXTS[:2] and prepared[:2].facts is prepared.facts
    # the rows of the first texts are the whole corpus's, tokenized once by hand here
    by_hand = [tok([t])["input_ids"][0].tolist() for t in TEXTS]
    assert [r.ids for r in prepared.rows()] == by_hand
    assert [r.ids for r in head.rows()] == by_hand[:2]
    other, _ = build_reference("llama", seed=1)
    assert prepare(other.eval(), tok, prepared).facts is not prepared.facts
