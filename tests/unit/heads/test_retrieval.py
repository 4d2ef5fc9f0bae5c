"""Retrieval scores (Wu et al. 2024): copy steps found by hand, hits on hand-built rows,
the whole pipeline on patterns set by construction, and one-line errors."""

from dataclasses import dataclass

import pytest
import torch

import attnprobe as ap
from attnprobe.core.row_blocks import RowBlock
from attnprobe.errors import InputError
from attnprobe.heads.copy_steps import CopySteps, as_copy_steps, find_copy_steps
from attnprobe.heads.retrieval import COLUMNS, RetrievalHits, copy_accuracy, retrieval_scores
from tests.conftest import track


def test_copy_steps_of_a_repeated_segment_by_hand():
    ids = [0, 1, 2, 3, 4, 5, 1, 2, 3, 4, 6]
    target, source = find_copy_steps(ids, min_match=2)
    # (1, 2) at 6-7 was followed by 3 at position 3, (2, 3) by 4 at position 4; (3, 4) is
    # followed by 6 now but by 5 before: no copy
    assert target == [-1] * 7 + [3, 4, -1, -1]
    assert source == [i in (3, 4) for i in range(11)]


def test_copy_steps_of_one_token_runs_include_the_query_itself():
    target, source = find_copy_steps([7, 7, 7, 7], min_match=1)
    assert target == [-1, 7, 7, -1]
    assert source == [False, True, True, False]


def test_copy_steps_need_the_whole_match():
    target, _ = find_copy_steps([1, 2, 3, 9, 2, 3], min_match=3)
    assert target == [-1] * 6  # only two tokens recur before the 3


def _block(pattern, ids, valid=None, query_pos=None):
    batch, _, q, k = pattern.shape
    ids = torch.as_tensor(ids)
    valid = torch.ones(batch, q, dtype=torch.bool) if valid is None else valid
    key_pos = torch.where(ids >= 0, torch.arange(k).expand(batch, k), -1)
    query_pos = torch.arange(q).expand(batch, q) if query_pos is None else query_pos
    return RowBlock(pattern=pattern, query_valid=valid, query_pos=query_pos,
                    key_pos=key_pos, key_len=(ids >= 0).sum(-1), query_ids=None,
                    key_ids=ids.clamp(min=0))


# [BOS] A B C A B: at position 4 (A) the next token B is copied from position 2
IDS = [[2, 10, 11, 12, 10, 11]]
TARGET = torch.tensor([[-1, -1, -1, -1, 11, -1]])
SOURCE = torch.tensor([[False, True, True, True, False, False]])


def _one_hot_rows(keys_per_head, n=6):
    """``[1, head, n, n]``: every row of head h puts weight 1 on key keys_per_head[h]."""
    pattern = torch.zeros(1, len(keys_per_head), n, n)
    for h, key in enumerate(keys_per_head):
        pattern[0, h, :, key] = 1.0
    return pattern


def test_a_hit_is_the_argmax_on_the_copied_token_inside_the_source():
    # head 0: the B of the needle (hit); head 1: the A of the needle (wrong token);
    # head 2: [BOS]; head 3: mostly the later B, outside the needle (same token, no hit)
    pattern = _one_hot_rows([2, 1, 0, 5])
    pattern[0, 3, :, 2] = 0.4
    pattern[0, 3, :, 5] = 0.6
    hits, steps = RetrievalHits(TARGET, SOURCE)(_block(pattern, IDS))["retrieval"]
    assert hits.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert steps.tolist() == [1.0] * 4


def test_copied_only_counts_hits_where_the_model_copied_but_keeps_every_step():
    pattern = _one_hot_rows([2, 2])
    not_copied = torch.zeros_like(SOURCE)
    hits, steps = RetrievalHits(TARGET, SOURCE, not_copied)(_block(pattern, IDS))["retrieval"]
    assert hits.tolist() == [0.0, 0.0] and steps.tolist() == [1.0, 1.0]
    copied = TARGET >= 0
    hits, _ = RetrievalHits(TARGET, SOURCE, copied)(_block(pattern, IDS))["retrieval"]
    assert hits.tolist() == [1.0, 1.0]


def test_padding_rows_and_keys_never_count():
    ids = [[2, 10, 11, 12, 10, 11], [2, 10, 11, 10, -1, -1]]
    target = torch.tensor([[-1, -1, -1, -1, 11, -1], [-1, -1, -1, 11, -1, -1]])
    source = torch.tensor([[False, True, True, True, False, False],
                           [False, True, True, False, False, False]])
    pattern = torch.zeros(2, 1, 6, 6)
    pattern[0, 0, :, 2] = 1.0  # hit at row 4
    pattern[1, 0, :, 2] = 1.0  # hit at row 3
    pattern[1, 0, 4:, :] = 0.0
    pattern[1, 0, 4:, 4] = 1.0  # padding rows on a padding key: never a step
    valid = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    hits, steps = RetrievalHits(target, source)(_block(pattern, ids, valid))["retrieval"]
    assert hits.tolist() == [2.0] and steps.tolist() == [2.0]


def test_row_blocks_add_up_to_the_whole():
    torch.manual_seed(1)
    n = 12
    ids = torch.randint(10, 14, (2, n))
    target = torch.where(torch.rand(2, n) < 0.5, ids.roll(-1, 1), -1)
    source = torch.rand(2, n) < 0.5
    pattern = torch.rand(2, 3, n, n).softmax(-1)
    reducer = RetrievalHits(target, source)
    whole = reducer(_block(pattern, ids))["retrieval"]
    parts = [reducer(_block(pattern[:, :, s:s + 5], ids,
                            query_pos=torch.arange(s, min(s + 5, n)).expand(2, -1)))
             ["retrieval"] for s in range(0, n, 5)]
    assert torch.equal(sum(p[0] for p in parts), whole[0])
    assert torch.equal(sum(p[1] for p in parts), whole[1])
    assert whole[1][0] == (target >= 0).sum()


# ------------------------------------------------------------------ whole pipeline
@pytest.fixture(scope="module")
def llama():
    model, tok = ap.load_model("ref:llama")  # random 2-layer, 4-head reference decoder
    return track(model), tok


@dataclass
class Task:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    target: torch.Tensor
    source: torch.Tensor


def _copy_task(tok):
    # [BOS] the cat sat on a mat . the cat  -> after the second "the" (position 8) the
    # model should copy "cat" from position 2
    ids = torch.tensor([tok.encode("the cat sat on a mat . the cat")])
    target = torch.full_like(ids, -1)
    target[0, 8] = ids[0, 2]
    source = torch.zeros_like(ids, dtype=torch.bool)
    source[0, 1:4] = True
    return Task(ids, torch.ones_like(ids), target, source)


def test_scores_of_patterns_set_by_construction(llama):
    model, tok = llama
    task = _copy_task(tok)

    def point(layer, pattern):  # [batch, head, q, k]: head h of layer 1 looks at key KEYS[h]
        if layer == 1:
            for head, key in enumerate((2, 1, 0, 7)):  # cat (hit), the, [BOS], the (query)
                pattern[:, head] = 0.0
                pattern[:, head, :, key] = 1.0
        return pattern

    with ap.capture(model, "layer:1", edit=point, keep=False):
        table = retrieval_scores(model, tok, task)
    assert list(table.columns) == COLUMNS
    layer1 = table[table.layer == 1].set_index("head")
    assert layer1["retrieval"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert (table["copy_steps"] == 1).all()


def test_scope_keeps_only_its_heads(llama):
    model, tok = llama
    table = retrieval_scores(model, tok, _copy_task(tok), scope="heads:1.0,1.3")
    assert table["head_id"].tolist() == ["L1H0", "L1H3"]


def test_texts_find_their_own_copy_steps(llama):
    model, tok = llama
    text = "the cat sat on the mat and the cat sat on the mat"
    steps = as_copy_steps(model, tok, [text], min_match=2)
    ids = tok.encode(text)
    expected, _ = find_copy_steps(ids, min_match=2)
    assert steps.target[0].tolist() == expected and steps.n_steps > 0
    table = retrieval_scores(model, tok, [text], min_match=2)
    assert (table["copy_steps"] == steps.n_steps).all()
    assert table["retrieval"].between(0, 1).all()


def test_copy_accuracy_against_the_logits(llama):
    model, tok = llama
    task = _copy_task(tok)
    logits = model(task.input_ids)
    expected = float(logits[0, 8].argmax() == task.target[0, 8])
    table = copy_accuracy(model, tok, task)
    assert table[["copy_steps", "correct"]].values.tolist() == [[1, expected]]


# ------------------------------------------------------------------ bad input
def test_no_copy_step_is_a_one_line_error(llama):
    model, tok = llama
    task = _copy_task(tok)
    task.target[:] = -1
    with pytest.raises(InputError, match="no copy step") as err:
        retrieval_scores(model, tok, task)
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="no copy step"):
        retrieval_scores(model, tok, ["the cat sat on a mat"])


def test_a_context_longer_than_the_model_is_a_one_line_error(llama):
    model, tok = llama  # 64 positions
    ids = torch.full((1, 80), tok.convert_tokens_to_ids(["cat"])[0])
    ids[0, 0] = tok.bos_token_id
    target = torch.full_like(ids, -1)
    target[0, 70] = ids[0, 71]
    task = Task(ids, torch.ones_like(ids), target, torch.ones_like(ids, dtype=torch.bool))
    with pytest.raises(InputError, match="80 tokens but the model takes at most 64") as err:
        retrieval_scores(model, tok, task)
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="cannot be cut"):
        retrieval_scores(model, tok, task, truncation="cut")
    with pytest.raises(InputError, match="every example is longer"):
        retrieval_scores(model, tok, task, truncation="skip")


def test_skip_leaves_long_examples_out_and_lists_them(llama):
    model, tok = llama
    short = _copy_task(tok)
    n = short.input_ids.shape[1]
    ids = torch.full((2, 80), tok.pad_token_id)
    ids[0, :n] = short.input_ids[0]
    ids[1] = tok.convert_tokens_to_ids(["cat"])[0]
    mask = torch.zeros_like(ids)
    mask[0, :n] = 1
    mask[1] = 1
    target = torch.full_like(ids, -1)
    target[0, :n] = short.target[0]
    target[1, 70] = ids[1, 71]
    source = torch.zeros_like(ids, dtype=torch.bool)
    source[0, :n] = short.source[0]
    table = retrieval_scores(model, tok, Task(ids, mask, target, source), truncation="skip")
    assert table.attrs["skipped"] == ("1",)
    assert (table["copy_steps"] == 1).all()


@pytest.mark.parametrize("change, message", [
    (lambda t: setattr(t, "source", t.source.long()), "source must be a bool"),
    (lambda t: setattr(t, "target", t.target[:, :-1]), "must all be"),
    (lambda t: t.attention_mask.__setitem__((0, 0), 0), "right-padded"),
    (lambda t: t.target.__setitem__((0, 0), -5), "-1 where"),
])
def test_malformed_tasks_are_one_line_errors(llama, change, message):
    model, tok = llama
    task = _copy_task(tok)
    change(task)
    with pytest.raises(InputError, match=message) as err:
        retrieval_scores(model, tok, task)
    assert "\n" not in str(err.value)


def test_a_task_object_without_the_tensors_is_named(llama):
    model, tok = llama
    with pytest.raises(InputError, match="lacks input_ids"):
        retrieval_scores(model, tok, CopySteps)  # a class, not a task


def test_copied_only_needs_logits():
    import transformers

    from tests.integration.hf_models import build

    model = track(build("llama"))
    assert isinstance(model, transformers.LlamaModel)  # hidden states, no logits
    ids = torch.tensor([[1, 5, 6, 7, 8, 5, 6, 7]])
    with pytest.raises(InputError, match="next-token logits"):
        retrieval_scores(model, None, CopySteps(ids, torch.ones_like(ids),
                                                 *find_copy_tensors(ids)),
                         copied_only=True)


def find_copy_tensors(ids):
    target, source = find_copy_steps(ids[0].tolist(), min_match=1)
    return torch.tensor([target]), torch.tensor([source])


def test_batches_keep_padded_masks_small(monkeypatch):
    from attnprobe.heads import copy_steps

    lengths = [10, 3, 10, 9]
    ids = torch.zeros(4, 10, dtype=torch.long)
    mask = (torch.arange(10)[None, :] < torch.tensor(lengths)[:, None]).long()
    steps = CopySteps(ids, mask, torch.full_like(ids, -1), torch.zeros_like(mask).bool(),
                      ("a", "b", "c", "d"))
    monkeypatch.setattr(copy_steps, "MASK_CELLS", 250)  # 2 x 9² fits, 3 x 10² does not
    batches = steps.batches(4)
    assert [b.ids for b in batches] == [("a", "c"), ("d", "b")]  # equal lengths always share
    assert [b.input_ids.shape[1] for b in batches] == [10, 9]
    assert [len(b.ids) for b in steps.batches(1)] == [1, 1, 1, 1]


def test_copy_accuracy_rows_follow_the_task_order(llama):
    model, tok = llama
    short, long = _copy_task(tok), _copy_task(tok)
    n = short.input_ids.shape[1]
    ids = torch.cat([short.input_ids, torch.zeros(1, 2, dtype=torch.long)], 1)
    ids = torch.cat([ids, torch.cat([long.input_ids, long.input_ids[:, 1:3]], 1)])
    mask = torch.ones_like(ids)
    mask[0, n:] = 0
    target = torch.full_like(ids, -1)
    target[:, 8] = ids[:, 2]
    source = torch.zeros_like(ids, dtype=torch.bool)
    source[:, 1:4] = True
    table = copy_accuracy(model, tok, Task(ids, mask, target, source), batch_size=1)
    assert table["example"].tolist() == ["0", "1"]  # the longer one ran first
