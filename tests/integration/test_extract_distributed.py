"""extract and head_stats sharded over two torch.distributed (gloo) processes equal one process:
the same maps in the same order (example ids included) and the same tally."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.integration.distributed import counting_forwards, run_ranks

WORDS = "the cat sat on a mat dog ran big red"
TEXTS = [
    "the cat sat on a mat", "a dog ran", "the big red dog sat on the cat",
    "red mat", "a cat ran on the mat", "the dog", "big cat sat", "a red dog ran on a big mat",
    "dog ran big", "the mat\ta cat", "a dog\tran", "red\tthe big cat sat",
]
BATCH = 3  # four batches: rank 0 runs batches 0 and 2, rank 1 batches 1 and 3 (the pairs)
SCOPE = "heads:0.1,1.0"


def _outputs(rank: int) -> dict:
    """One rank: extract and head_stats over TEXTS; the forwards it ran and (rank 0) what it
    gathered."""
    import attnprobe as ap
    from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert

    vocab = bert_vocab(WORDS)
    model, tok = tiny_bert(vocab), bert_tokenizer(vocab)  # seeded: the same on every rank
    with counting_forwards(model) as forwards:
        maps = ap.extract(model, tok, TEXTS, scope=SCOPE, batch_size=BATCH)
        tally = ap.head_stats(model, tok, TEXTS, batch_size=BATCH, query_block=2)
    if rank != 0:
        return {"forwards": len(forwards)}
    return {"forwards": len(forwards),
            "maps": [(m.example_id, m.query_tokens, m.key_tokens, m.layers, m.heads,
                      m.pattern.numpy()) for m in maps],
            "summary": tally.summary(), "stats": tally.to_frame()}


def _run(tmp, world: int) -> dict:
    """Rank 0's outputs, with the forwards of every rank."""
    ranks = run_ranks(_outputs, world=world, folder=tmp)
    return {**ranks[0], "forwards": [r["forwards"] for r in ranks]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict, dict]:
    tmp = tmp_path_factory.mktemp("extract")
    return _run(tmp, 1), _run(tmp, 2)


def test_two_processes_extract_the_single_process_maps(runs):
    single, sharded = runs
    assert single["forwards"] == [8]  # 4 batches, for extract and for head_stats
    assert sharded["forwards"] == [4, 4]  # each rank ran half of them
    assert [m[0] for m in single["maps"]] == [str(i) for i in range(len(TEXTS))]
    assert len(sharded["maps"]) == len(single["maps"])
    for one, two in zip(single["maps"], sharded["maps"], strict=True):
        assert one[:5] == two[:5]  # example id, tokens, layers, heads
        assert (one[3], one[4]) == ((0, 1), (0, 1))  # the grid holding the scope
        assert one[5].shape == two[5].shape and (one[5] == two[5]).all()
    assert single["maps"][9][1] == ("[CLS]", "the", "mat", "[SEP]", "a", "cat", "[SEP]")


def test_two_processes_tally_the_single_process_head_stats(runs):
    single, sharded = runs
    pd.testing.assert_frame_equal(single["stats"], sharded["stats"], check_exact=True)
    pd.testing.assert_frame_equal(single["summary"], sharded["summary"], check_exact=True)
    assert len(single["summary"]) == 2 * 2  # every head of the tiny BERT
    counts = single["stats"].query("statistic == 'entropy'")["count"]
    n_tokens = sum(len(m[1]) for m in single["maps"])
    assert set(counts) == {n_tokens}  # every real query row of every text, counted once
