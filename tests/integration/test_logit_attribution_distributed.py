"""Direct logit attribution sharded over two torch.distributed (gloo) processes equals one
process: the same table and totals, in the same order, each batch run on one rank only."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.integration.distributed import counting_forwards, run_ranks

TEXTS = ["the cat sat on a mat", "a dog ran", "the big red dog sat on the cat", "red mat",
         "a cat ran on the mat", "the dog", "big cat sat"]
BATCH = 2  # four batches: rank 0 runs batches 0 and 2, rank 1 batches 1 and 3


def _outputs(rank: int) -> dict:
    import attnprobe as ap

    model, tok = ap.load_model("ref:llama")  # seeded: the same on every rank
    with counting_forwards(model) as forwards:
        result = ap.heads.logit_attribution(model, tok, TEXTS, "logit:dog", metric_positions="all",
                                            batch_size=BATCH, scope="layer:1")
    return {"forwards": len(forwards), "table": result.table, "totals": result.totals}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[list[dict], list[dict]]:
    tmp = tmp_path_factory.mktemp("dla")
    return run_ranks(_outputs, world=1, folder=tmp), run_ranks(_outputs, world=2, folder=tmp)


def test_two_processes_attribute_like_one(runs):
    single, sharded = runs
    assert [r["forwards"] for r in single] == [4]
    assert [r["forwards"] for r in sharded] == [2, 2]
    for rank in sharded:  # every rank gathers the whole result
        pd.testing.assert_frame_equal(single[0]["table"], rank["table"], check_exact=True)
        pd.testing.assert_frame_equal(single[0]["totals"], rank["totals"], check_exact=True)
    assert list(single[0]["totals"]["example_id"]) == [str(i) for i in range(len(TEXTS))]
