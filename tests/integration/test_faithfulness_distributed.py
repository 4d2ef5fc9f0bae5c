"""faithfulness.evaluate() sharded over two torch.distributed (gloo) processes equals one
process: the same rows in the same order, the values equal up to the padding of a batch
(each rank pools and pads its own texts' inputs)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tests.integration.distributed import run_ranks

MODEL = "ref:transformer-classifier"  # untrained, built the same way in every process
TEXTS = ["key cat the dog red", "a big tree and the sun", "the key is in the red box",
         "the cat and the dog", "key key tree"]


def _library(rank: int) -> dict | None:
    import attnprobe as ap

    model, tok = ap.load_model(MODEL)
    result = ap.faithfulness.evaluate(model, tok, TEXTS, "class:1", views=["raw", "rollout"],
                                      methods=["saliency", "leave_one_out"], levels=(0.2, 0.5),
                                      curve_steps=4, seed=3)
    return None if rank else {"table": result.table, "curves": result.curves_table}


def test_two_processes_give_the_single_process_tables(tmp_path):
    single = _library(0)  # one process: this one
    sharded = run_ranks(_library, world=2, folder=tmp_path)[0]
    for name in ("table", "curves"):
        a, b = single[name], sharded[name]
        pd.testing.assert_frame_equal(a.drop(columns="value"), b.drop(columns="value"))
        # float32 outputs of a differently padded batch: a few ulps of the logits
        scale = np.nanmax(np.abs(a["value"].to_numpy())) + 1.0
        np.testing.assert_allclose(a["value"].to_numpy(), b["value"].to_numpy(),
                                   atol=64 * np.finfo(np.float32).eps * scale)
    assert list(dict.fromkeys(single["table"].example_id)) == ["0", "1", "2", "3", "4"]
