"""ap.patch sharded over two torch.distributed (gloo) processes equals one process: the same
example ids (a skipped pair keeps its index), the same patches, the same numbers; through the
library and through ``attnprobe patch --distributed`` as torchrun would start it."""

from __future__ import annotations

import pandas as pd

from tests.integration.distributed import cli_tables, counting_forwards, run_ranks

MODEL = "ref:llama"  # untrained, built the same way in every process (GQA: 2 key/value heads)
CLEAN = ["the cat sat on the red mat", "a dog ran to the big tree", "dog " * 12 + "cat",
         "the bird saw a fish", "the red cat and the dog"]
CORRUPT = ["the dog sat on the red mat", "a cat ran to the big tree", "cat " * 12 + "dog",
           "the fish saw a bird", "the big dog and the cat"]
MAX_LENGTH = 9  # pair 2 (14 tokens) is longer: skipped, the others keep their index
OPTIONS = {"metric_positions": "all", "truncation": "skip", "max_length": MAX_LENGTH}
RUNS = {  # name -> function, options; small batches make several forwards to split
    "heads": ("heads", {"batch_size": 6}),
    "each": ("heads", {"site": "k", "scope": "layer:1", "positions": "each",
                       "direction": "noising", "batch_size": 8}),
    "path": ("path", {"senders": "layer:0", "receivers": "layer:1", "into": ("k", "v"),
                      "batch_size": 5}),
    "attribution": ("attribution", {"positions": "each", "batch_size": 2}),
}


def _library(rank: int) -> dict:
    import attnprobe as ap

    model, tok = ap.load_model(MODEL)
    tables, forwards = {}, {}
    for name, (fn, options) in RUNS.items():
        with counting_forwards(model) as seen:
            tables[name] = getattr(ap.patch, fn)(model, tok, CLEAN, CORRUPT, "logit:next",
                                                 **OPTIONS, **options)
        forwards[name] = len(seen)
    return {"tables": tables, "forwards": forwards}


def test_two_processes_give_the_single_process_tables_on_every_rank(tmp_path):
    (single,) = run_ranks(_library, world=1, folder=tmp_path)
    ranks = run_ranks(_library, world=2, folder=tmp_path)
    for name, table in single["tables"].items():
        assert list(dict.fromkeys(table["example_id"])) == ["0", "1", "3", "4"], name
        assert table["effect"].notna().all(), name
        for sharded in ranks:
            pd.testing.assert_frame_equal(table, sharded["tables"][name], check_exact=True,
                                          obj=name)
    for name, count in single["forwards"].items():  # each rank ran only part of the work
        parts = [r["forwards"][name] for r in ranks]
        assert all(part < count for part in parts), (name, parts, count)
    heads = single["tables"]["heads"][["layer", "head"]].drop_duplicates().values.tolist()
    assert heads == [[layer, head] for layer in range(2) for head in range(4)]
    assert sorted(set(single["tables"]["each"]["head"])) == [0, 1]  # key/value heads


def test_cli_under_two_processes_writes_the_single_process_table(tmp_path):
    pairs = [a for c, x in zip(CLEAN, CORRUPT, strict=True)
             for a in ("--clean", c, "--corrupt", x)]
    single, sharded = cli_tables(
        ["patch", "--model", MODEL, *pairs, "--experiment", "heads", "--metric", "logit:next",
         "--metric-positions", "all", "--site", "v", "--batch-size", "5", "--skip-long",
         "--max-length", str(MAX_LENGTH), "--distributed", "--quiet"], folder=tmp_path)
    pd.testing.assert_frame_equal(single, sharded, check_exact=True)
    assert list(dict.fromkeys(single.example_id)) == ["0", "1", "3", "4"]
