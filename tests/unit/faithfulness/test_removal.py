"""Removal procedures: what each does to the ids and the attention mask, what they refuse, and
that on a bag-of-words model (fillers weigh 0) all three remove exactly the token's weight."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnprobe.errors import InputError
from attnprobe.faithfulness.removal import (
    Removal,
    pad_batch,
    perturb,
    perturb_ranked,
    removal_for,
    unique_inputs,
)
from tests.helpers import bert_tokenizer, bert_vocab
from tests.unit.faithfulness.bag_of_words import (
    CLS,
    MASK,
    PAD,
    SEP,
    BagOfWords,
    special_of,
    text,
    weights,
)

IDS = torch.tensor([CLS, 7, 8, 9, 10, SEP])
SPECIAL = special_of(IDS)


def test_replace_delete_and_attention_by_hand():
    fill = Removal("replace", MASK, "[MASK]")
    out = perturb(IDS, None, SPECIAL, [3, 1], fill)
    assert out.input_ids.tolist() == [CLS, MASK, 8, MASK, 10, SEP]
    assert out.attention_mask.tolist() == [1, 1, 1, 1, 1, 1]
    out = perturb(IDS, None, SPECIAL, [3, 1], Removal("delete"))
    assert out.input_ids.tolist() == [CLS, 8, 10, SEP]
    assert out.attention_mask.tolist() == [1, 1, 1, 1]
    out = perturb(IDS, None, SPECIAL, [3, 1], Removal("attention"))
    assert out.input_ids.tolist() == IDS.tolist()
    assert out.attention_mask.tolist() == [1, 0, 1, 0, 1, 1]
    assert perturb(IDS, None, SPECIAL, [], Removal("delete")).input_ids.tolist() \
        == IDS.tolist()
    assert IDS.tolist() == [CLS, 7, 8, 9, 10, SEP]     # the input is never edited in place


def test_labels_recorded_in_rows():
    assert Removal("replace", MASK, "[MASK]").label == "replace:[MASK]"
    assert Removal("replace", MASK).label == f"replace:{MASK}"
    assert Removal("delete").label == "delete"
    assert Removal("attention").label == "attention"


def test_ranked_removal_takes_the_front_or_keeps_it():
    order = [3, 1, 4, 2]
    gone = perturb_ranked(IDS, None, SPECIAL, order, 2, Removal("delete"))
    assert gone.input_ids.tolist() == [CLS, 8, 10, SEP]
    kept = perturb_ranked(IDS, None, SPECIAL, order, 2, Removal("delete"), keep=True)
    assert kept.input_ids.tolist() == [CLS, 7, 9, SEP]
    lerf = perturb_ranked(IDS, None, SPECIAL, order[::-1], 1, Removal("attention"))
    assert lerf.attention_mask.tolist() == [1, 1, 0, 1, 1, 1]
    with pytest.raises(InputError, match="k must be"):
        perturb_ranked(IDS, None, SPECIAL, order, 5, Removal("delete"))


def test_refusals_name_the_problem():
    delete = Removal("delete")
    with pytest.raises(InputError, match="special token"):
        perturb(IDS, None, SPECIAL, [0], delete)
    with pytest.raises(InputError, match="repeated"):
        perturb(IDS, None, SPECIAL, [1, 1], delete)
    with pytest.raises(InputError, match="outside"):
        perturb(IDS, None, SPECIAL, [6], delete)
    with pytest.raises(InputError, match="padding"):
        perturb(torch.tensor([CLS, 7, SEP, PAD]), torch.tensor([1, 1, 1, 0]),
                torch.tensor([True, False, True, False]), [3], delete)
    with pytest.raises(InputError, match="every real token"):
        perturb(IDS, None, SPECIAL, [1, 2, 3, 4], delete)
    # a curve's end point may remove every real token; the specials stay
    end = perturb(IDS, None, SPECIAL, [1, 2, 3, 4], delete, allow_all_real=True)
    assert end.input_ids.tolist() == [CLS, SEP]
    with pytest.raises(InputError, match="no token"):   # a decoder text without specials
        perturb(torch.tensor([7, 8]), None, None, [0, 1], delete, allow_all_real=True)
    with pytest.raises(InputError, match="differ in length"):
        perturb(IDS, None, SPECIAL[:-1], [1], delete)
    with pytest.raises(InputError, match="one of"):
        Removal("drop")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="needs a token id"):
        Removal("replace")
    with pytest.raises(InputError, match="takes no fill"):
        Removal("delete", MASK)


def test_removal_for_a_tokenizer():
    tok = bert_tokenizer(bert_vocab())
    assert removal_for(tok) == Removal("delete")
    assert removal_for(tok, "replace") == Removal("replace", tok.mask_token_id, "[MASK]")
    assert removal_for(tok, "replace", fill="pad") == Removal("replace", tok.pad_token_id, "[PAD]")
    assert removal_for(tok, "replace", fill="unk").label == "replace:[UNK]"
    assert removal_for(tok, "delete") == Removal("delete")
    assert removal_for(tok, "attention") == Removal("attention")
    bare = SimpleNamespace(mask_token_id=None, pad_token_id=None, unk_token_id=None)
    with pytest.raises(InputError, match="has none"):
        removal_for(bare, "replace")
    with pytest.raises(InputError, match="fill must be"):
        removal_for(tok, "replace", fill="eos")
    with pytest.raises(InputError, match="takes no fill"):
        removal_for(tok, "delete", fill="pad")


def test_duplicates_collapse_and_batches_pad():
    delete = Removal("delete")
    items = [perturb(IDS, None, SPECIAL, p, delete) for p in ([1], [2], [1], [1, 2])]
    unique, index = unique_inputs(items)
    assert len(unique) == 3 and index == [0, 1, 0, 2]
    assert all(unique[index[i]].key() == items[i].key() for i in range(len(items)))
    ids, mask = pad_batch(unique, PAD)
    assert ids.tolist() == [[CLS, 8, 9, 10, SEP], [CLS, 7, 9, 10, SEP],
                            [CLS, 9, 10, SEP, PAD]]
    assert mask[2].tolist() == [1, 1, 1, 1, 0]
    ids, mask = pad_batch(unique, PAD, side="left")
    assert ids[2].tolist() == [PAD, CLS, 9, 10, SEP]
    assert mask[2].tolist() == [0, 1, 1, 1, 1]


def test_every_procedure_removes_exactly_the_token_weight_on_bag_of_words():
    w = weights()
    model = BagOfWords(w)
    ids = text(12, seed=4)
    special = special_of(ids)
    positions = [2, 5, 11]
    want = float(w.double()[ids].sum() - w.double()[ids[positions]].sum())
    tol = ids.numel() * float(torch.finfo(torch.float32).eps) * float(w[ids].abs().sum())
    for removal in (Removal("delete"), Removal("attention"), Removal("replace", MASK),
                    Removal("replace", PAD)):
        out = perturb(ids, None, special, positions, removal)
        with torch.no_grad():
            logit = model(out.input_ids[None], out.attention_mask[None])[0, 1].item()
        assert logit == pytest.approx(want, abs=tol), removal.label


def test_a_padded_batch_of_perturbed_inputs_gives_each_input_own_output_on_bert():
    """What evaluate() relies on: one batched forward over perturbed inputs of different
    lengths equals a forward per input (right padding, mask 0 on the pad)."""
    from tests.helpers import tiny_bert_classifier

    model, tok = tiny_bert_classifier()
    enc = tok("the cat sat on a big red mat", return_tensors="pt")
    ids, mask = enc["input_ids"][0], enc["attention_mask"][0]
    special = torch.tensor(tok.get_special_tokens_mask(ids.tolist(),
                                                       already_has_special_tokens=True),
                           dtype=torch.bool)
    order = (~special).nonzero().flatten().tolist()
    items = [perturb_ranked(ids, mask, special, order, k, removal)
             for removal in (Removal("delete"), Removal("attention"), removal_for(tok, "replace"))
             for k in (1, 3, 5)]
    batch, batch_mask = pad_batch(items, tok.pad_token_id)
    with torch.no_grad():
        together = model(input_ids=batch, attention_mask=batch_mask).logits
        alone = torch.cat([model(input_ids=item.input_ids[None],
                                 attention_mask=item.attention_mask[None]).logits
                           for item in items])
    # same maths, different summation order over padded keys: float32 round-off only
    scale = float(alone.abs().max())
    torch.testing.assert_close(together, alone, rtol=0,
                               atol=64 * float(torch.finfo(torch.float32).eps) * scale)
    assert not torch.allclose(alone[0], alone[3])   # delete and attention differ on BERT
