"""Issue 12 §6: retrieval heads of ``ref:induction`` on a needle task, and long contexts that
stream.

Ground truth comes from the task's construction (where the needle is, which token each copy
step must produce), from independent counts on extracted maps, or from the claims of the
issue (the retrieval heads are the census' induction heads; ablating them breaks the copy).
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import attnprobe as ap
from attnprobe.capture import attend, hf, parts
from attnprobe.errors import InputError
from attnprobe.heads.census_tap import CensusTap
from attnprobe.heads.retrieval import copy_accuracy, retrieval_scores
from attnprobe.models.induction import N_SYMBOLS, repeated_segments
from attnprobe.models.tokenizer import WordTokenizer
from attnprobe.tasks.needle import greedy_continuation, needle_task
from tests.conftest import track
from tests.integration.distributed import run_ranks

L1_HEADS = {(1, 0), (1, 1), (1, 2), (1, 3)}


@pytest.fixture(scope="module")
def trained():
    model, tok = ap.load_model("ref:induction")
    return track(model), tok


def _accuracy(table) -> float:
    return float(table["correct"].sum() / table["copy_steps"].sum())


def _found(table, threshold: float = 0.5) -> set[tuple[int, int]]:
    rows = table[table["retrieval"] > threshold]
    return {(int(r.layer), int(r.head)) for r in rows.itertuples()}


# ------------------------------------------------------------------------- the needle task
def test_needle_layout_by_construction():
    task = needle_task(3, length=60, depth=0.5, needle_len=10, prefix_len=3, seed=2)
    ids = task.input_ids
    copy = 60 - 10
    assert task.copy_start == copy and ids.shape == (3, 60)
    for b in range(3):
        span = task.source[b].nonzero().flatten()
        assert len(span) == 10 and span[-1] - span[0] == 9  # one contiguous needle
        assert torch.equal(ids[b, span], ids[b, copy:])  # the final copy is the needle
        steps = (task.target[b] >= 0).nonzero().flatten()
        assert steps.tolist() == list(range(copy + 2, 59))  # after the 3-token prefix
        assert torch.equal(task.target[b, steps], ids[b, steps + 1])
        hay = torch.cat([ids[b, 1:span[0]], ids[b, span[-1] + 1:copy]])
        assert not torch.isin(hay, ids[b, copy:]).any()  # distinct: no distractor
        assert len(set(ids[b, copy:].tolist())) == 10
    assert task.prompt_ids.shape == (3, copy + 3) and task.answer_ids.shape == (3, 7)


def test_needle_depth_spans_the_haystack():
    first = needle_task(1, length=40, depth=0.0, needle_len=8)
    last = needle_task(1, length=40, depth=1.0, needle_len=8)
    assert int(first.needle_start[0]) == 1  # right after [BOS]
    assert int(last.needle_start[0]) + 8 == last.copy_start  # ends where the copy starts


def test_needle_with_distractors_reuses_the_needle_symbols():
    task = needle_task(4, length=400, depth=0.5, distinct=False, seed=1)
    hay = task.input_ids[:, 1:task.copy_start][~task.source[:, 1:task.copy_start]]
    assert len(set(hay.tolist())) == N_SYMBOLS  # 400 draws cover all 64 symbols


@pytest.mark.parametrize("kwargs, message", [
    (dict(length=4096, depth=0.5), "longer than the model's 2048 positions"),
    (dict(length=64, depth=0.5, needle_len=8, prefix_len=8), "no copy step"),
    (dict(length=64, depth=1.5), "between 0 and 1"),
    (dict(length=20, depth=0.5), "cannot hold"),
])
def test_needle_bad_sizes_are_one_line_errors(kwargs, message):
    with pytest.raises(InputError, match=message) as err:
        needle_task(2, **kwargs)
    assert "\n" not in str(err.value)


def test_the_models_positions_bound_the_task(trained):
    model, tok = trained
    long_tok = WordTokenizer(tok.ids_to_tokens[3:], model_max_length=4096)
    task = needle_task(1, length=2100, depth=0.5, tokenizer=long_tok)
    with pytest.raises(InputError, match="2100 tokens but the model takes at most 2048"):
        retrieval_scores(model, tok, task)


# ------------------------------------------------------------------ retrieval heads found
def test_scores_equal_an_independent_count_on_extracted_maps(trained):
    model, tok = trained
    task = needle_task(6, length=64, depth=0.25, seed=3)  # past 48 tokens: some misses
    table = retrieval_scores(model, tok, task, batch_size=4)  # two batches, merged
    copied = retrieval_scores(model, tok, task, batch_size=4, copied_only=True)
    maps = ap.extract(model, tok, task.texts(tok))
    predicted = model(task.input_ids).argmax(-1)
    hits = torch.zeros(2, 4)
    hits_copied = torch.zeros(2, 4)
    for b, amap in enumerate(maps):
        assert amap.key_tokens[1:] == tuple(task.texts(tok)[b].split())
        for q in (task.target[b] >= 0).nonzero().flatten().tolist():
            top = amap.pattern[:, :, q].argmax(-1)  # [layer, head]
            hit = task.source[b, top] & (task.input_ids[b, top] == task.target[b, q])
            hits += hit
            hits_copied += hit & (predicted[b, q] == task.target[b, q])
    steps = int((task.target >= 0).sum())
    assert (table["copy_steps"] == steps).all() and (copied["copy_steps"] == steps).all()
    for frame, expected in ((table, hits), (copied, hits_copied)):
        got = torch.tensor(frame.sort_values(["layer", "head"])["retrieval"].tolist())
        assert torch.allclose(got, expected.flatten() / steps, atol=1e-12)
    assert 0 < hits_copied.sum() < hits.sum()  # the model fails some copies at 64


def test_retrieval_heads_are_the_census_induction_heads(trained):
    model, tok = trained
    found = set()
    for depth in (0.0, 0.5, 1.0):
        table = retrieval_scores(model, tok, needle_task(12, length=48, depth=depth, seed=5))
        found |= _found(table)
        assert (table.loc[table["layer"] == 0, "retrieval"] < 0.05).all()
    segments = repeated_segments(32, torch.Generator().manual_seed(2024), tok)
    texts = [" ".join(tok.convert_ids_to_tokens(row[1:].tolist()))
             for row in segments.input_ids]
    labels = ap.heads.census(model, tok, texts, similarity=False).classify()
    induction = {(int(r.layer), int(r.head)) for r in labels.itertuples()
                 if r.label == "induction"}
    assert found == induction == L1_HEADS


def test_ablating_the_retrieval_heads_breaks_the_copy(trained):
    model, tok = trained
    task = needle_task(16, length=48, depth=0.5, seed=6)
    heads = _found(retrieval_scores(model, tok, task))
    scope = "heads:" + ",".join(f"{layer}.{head}" for layer, head in sorted(heads))
    base = _accuracy(copy_accuracy(model, tok, task))
    with ap.perturb.perturbed(model, "zero", scope):
        ablated = _accuracy(copy_accuracy(model, tok, task))
    with ap.perturb.perturbed(model, "zero", "head:0.0"):  # outside the circuit
        control = _accuracy(copy_accuracy(model, tok, task))
    assert base >= 0.9
    assert ablated <= 0.1
    assert control >= base - 0.1


def test_greedy_continuation_matches_the_teacher_forced_copy(trained):
    model, _ = trained
    task = needle_task(4, length=48, depth=0.0, seed=7)
    generated = greedy_continuation(model, task, batch_size=3)
    assert generated.shape == (4, 14)
    # where the teacher-forced copy is right at every step, greedy generation is too
    forced = model(task.input_ids).argmax(-1)[:, task.copy_start + 1:-1] == \
        task.answer_ids
    right = forced.all(-1)
    assert right.any() and generated[right].all()


def test_copying_fades_beyond_the_trained_length(trained):
    """RoPE does not carry the 48-token model to longer contexts, even with the needle just
    before its copy (the same distances as in training)."""
    model, tok = trained
    short = needle_task(16, length=48, depth=1.0, seed=8)
    long = needle_task(16, length=192, depth=1.0, seed=8)
    acc_short = _accuracy(copy_accuracy(model, tok, short))
    acc_long = _accuracy(copy_accuracy(model, tok, long, batch_size=8))
    assert acc_short >= 0.9 and acc_long <= acc_short - 0.4
    induction = retrieval_scores(model, tok, long, batch_size=8)
    assert induction.loc[induction["layer"] == 1, "retrieval"].mean() < 0.5


def _sharded_retrieval(rank: int) -> object:
    """One rank: retrieval scores of a needle task in three batches; rank 0 returns them."""
    model, tok = ap.load_model("ref:induction")
    table = retrieval_scores(model, tok, needle_task(12, length=64, depth=0.5, seed=9),
                             batch_size=4, copied_only=True)
    return table if rank == 0 else None


def test_two_processes_give_the_single_process_scores(tmp_path):
    single = run_ranks(_sharded_retrieval, world=1, folder=tmp_path)[0]
    sharded = run_ranks(_sharded_retrieval, world=2, folder=tmp_path)[0]
    pd.testing.assert_frame_equal(single, sharded, check_exact=True)
    assert (single["copy_steps"] == 12 * 14).all()


# --------------------------------------------------------------- long contexts stream
def _tiny_causal_lm(length: int, *, lm_head: bool = False):
    import transformers

    tok = WordTokenizer(model_max_length=length + 8)
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=length + 8,
        initializer_range=0.2, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    torch.manual_seed(0)
    cls = transformers.LlamaForCausalLM if lm_head else transformers.LlamaModel
    return track(cls(config).eval()), tok


def _random_text(tok: WordTokenizer, n_words: int, seed: int = 0) -> str:
    words = tok.ids_to_tokens[3 + 11:]  # no specials, no punctuation
    draw = torch.randint(0, len(words), (n_words,), generator=torch.Generator().manual_seed(seed))
    return " ".join(words[i] for i in draw.tolist())


@pytest.fixture
def spied_blocks(monkeypatch):
    """``(first row, rows, first key, keys)`` of every block the streaming parts (Reduce, the
    census's tap) receive, and the shape of every mask the attention function receives."""
    blocks, masks = [], []

    def spy(cls):
        on_rows = cls.on_rows

        def record(self, recorder, rows):
            shape = rows.pattern.shape
            blocks.append((rows.q_start, shape[2], rows.k_start, shape[3]))
            return on_rows(self, recorder, rows)

        monkeypatch.setattr(cls, "on_rows", record)

    spy(parts.Reduce)
    spy(CensusTap)
    attention = hf.attnprobe_attention

    def record_mask(module, query, key, value, attention_mask, **kwargs):
        masks.append(None if attention_mask is None else tuple(attention_mask.shape))
        return attention(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setattr(hf, "attnprobe_attention", record_mask)
    return blocks, masks


def _numeric(frame):
    return frame.select_dtypes("number").drop(columns=["layer", "head"]).sort_index(axis=1)


def test_census_streams_a_long_context_in_row_blocks(spied_blocks, monkeypatch):
    blocks, masks = spied_blocks
    n = 256
    model, tok = _tiny_causal_lm(n)
    text = _random_text(tok, n - 1)  # + [BOS]
    rows = 32
    monkeypatch.setattr(attend, "BLOCK_BYTES", 4 * n * 4 * rows)  # heads x keys x float32 x rows
    streamed = ap.heads.census(model, tok, [text], repeated=False)  # distances: sampled rows
    # a causal block holds only the keys up to its last row, so early blocks take more rows,
    # never more weights than the budget
    assert blocks and all(q_block < n and k_start == 0 and k_block == start + q_block
                          and q_block * k_block <= rows * n
                          for start, q_block, k_start, k_block in blocks)
    assert sum(q_block for _, q_block, _, _ in blocks) == 2 * n  # every row of both layers
    assert max(q_block for _, q_block, _, _ in blocks) > rows
    assert all(mask is None or mask[-1] * mask[-2] < n * n for mask in masks)
    monkeypatch.undo()
    whole = ap.heads.census(model, tok, [text], repeated=False)  # whole rows
    a, b = _numeric(streamed.scores()), _numeric(whole.scores())
    assert list(a.columns) == list(b.columns)
    # a block holds no key after its last row: later copies (weight 0 in a causal model)
    # count only inside it, so the *_ahead scores are 0 over fewer rows
    ahead = [c for c in a.columns if c.endswith("_ahead_rows")]
    assert (a[ahead] <= b[ahead]).all().all() and (a[ahead] > 0).all().all()
    assert (a[[c[:-5] for c in ahead]] == 0).all().all()
    a, b = a.drop(columns=ahead), b.drop(columns=ahead)
    assert torch.allclose(torch.tensor(a.values), torch.tensor(b.values), atol=1e-5,
                          equal_nan=True)
    js_streamed, js_whole = streamed.distances()["js"], whole.distances()["js"]
    assert torch.allclose(torch.tensor(js_streamed.values), torch.tensor(js_whole.values),
                          atol=1e-6)


def test_census_pools_offsets_beyond_max_offset_into_far(monkeypatch):
    n = 128
    model, tok = _tiny_causal_lm(n)
    text = _random_text(tok, n - 1)  # + [BOS]
    monkeypatch.setattr(attend, "BLOCK_BYTES", 4 * n * 4 * 16)  # streamed, 16 rows a block
    pooled = ap.heads.census(model, tok, [text], similarity=False, repeated=False)  # 64
    every = ap.heads.census(model, tok, [text], similarity=False, repeated=False,
                            max_offset=None)
    keys = ["layer", "head", "offset"]
    near, full = pooled.offsets(), every.offsets()
    # the keys after a block's last row are not in it (no row may see them): positive
    # offsets only as far as a block reaches, with no mass
    assert sorted(full["offset"].unique())[:n] == list(range(-(n - 1), 1))
    assert (full.loc[full["offset"] > 0, "mass"] == 0).all()
    assert sorted(near["offset"].unique())[:65] == list(range(-64, 1))
    inside = full[full["offset"].abs() <= 64].merge(near, on=keys, suffixes=("", "_pooled"))
    assert len(inside) == len(near)
    for column in ("mass", "argmax_share"):
        assert torch.allclose(torch.tensor(inside[column].values),
                              torch.tensor(inside[f"{column}_pooled"].values), atol=1e-6)
    tally = pooled.tally.to_frame()
    far = tally[tally["statistic"] == "offset@far"].set_index(["layer", "head"])["value"]
    beyond = full[full["offset"].abs() > 64].groupby(["layer", "head"])["mass"].sum()
    assert torch.allclose(torch.tensor(far.sort_index().values),
                          torch.tensor(beyond.sort_index().values), atol=1e-6)
    assert (far > 0.1).all()  # random heads of a 128-token input do look that far
    with pytest.raises(InputError, match="max_offset"):
        ap.heads.census(model, tok, [text], max_offset=0)


def test_retrieval_streams_and_equals_whole_rows(spied_blocks, monkeypatch):
    blocks, _ = spied_blocks
    n = 401
    model, tok = _tiny_causal_lm(n, lm_head=True)
    half = _random_text(tok, n // 2, seed=3)
    texts = [half + " " + half]  # [BOS], then the second half copies the first
    whole = retrieval_scores(model, tok, texts, copied_only=True)
    assert max(block[1] for block in blocks) == n  # one block holds every row
    blocks.clear()
    monkeypatch.setattr(attend, "BLOCK_BYTES", 4 * n * 4 * 8)
    streamed = retrieval_scores(model, tok, texts, copied_only=True)
    assert max(q_block * k_block for _, q_block, _, k_block in blocks) <= 8 * n
    assert len(blocks) > 2  # rows streamed in blocks, each with the keys up to its last row
    assert streamed.equals(whole)
    assert (whole["copy_steps"] > 100).all()
