"""compare() sharded over two torch.distributed (gloo) processes equals one process: through
the library and through ``attnprobe compare --distributed`` as torchrun would start it."""

from __future__ import annotations

import pandas as pd

from tests.integration.distributed import cli_tables, run_ranks

MODEL = "ref:transformer-classifier"  # untrained, built the same way in every process
TEXTS = ["key cat the dog red", "a big tree and the sun", "the key is in the red box",
         "dog " * 12 + "key", "the cat and the dog", "key key tree"]
MAX_LENGTH = 10  # text 3 (14 tokens) is longer: skipped
VIEWS = ["raw", "rollout", "flow", "attn_x_grad"]
METHODS = ["integrated_gradients", "saliency", "gradient_shap", "leave_one_out"]


def _truth(text: str) -> list[bool] | None:
    """The ``key`` words; None (no truth) for a text without one."""
    mask = [word == "key" for word in text.split()]
    return mask if any(mask) and not all(mask) else None


def _library(rank: int) -> dict | None:
    """One rank: compare() over TEXTS; rank 0 returns the tables and every attribution."""
    import attnprobe as ap
    from attnprobe.attribution import compare

    model, tok = ap.load_model(MODEL)
    result = compare(model, tok, TEXTS, "class:1", views=VIEWS, methods=METHODS,
                     truth=[_truth(t) for t in TEXTS], truncation="skip",
                     max_length=MAX_LENGTH, n_steps=8, seed=5, top_k=2)
    if rank != 0:
        return None
    scores = [(a.example_id, a.method, a.tokens, a.scores.tolist()) for a in result.attributions]
    return {"table": result.table, "truth": result.truth_table, "skipped": result.skipped,
            "scores": scores}


def test_two_processes_give_the_single_process_tables(tmp_path):
    single = run_ranks(_library, world=1, folder=tmp_path)[0]
    sharded = run_ranks(_library, world=2, folder=tmp_path)[0]
    assert single["skipped"] == sharded["skipped"] == ("3",)
    pd.testing.assert_frame_equal(single["table"], sharded["table"], check_exact=True)
    pd.testing.assert_frame_equal(single["truth"], sharded["truth"], check_exact=True)
    assert single["scores"] == sharded["scores"]
    # every kept text, in the caller's order, with every source
    assert list(dict.fromkeys(single["table"].example_id)) == ["0", "1", "2", "4", "5"]
    assert {"raw@L1", "rollout@L0", "flow@L1", "attn_x_grad", "gradient_shap"} <= set(
        single["table"].source)
    assert set(single["truth"].example_id) == {"0", "2", "5"}  # 1 and 4 have no key


# ---------------------------------------------------------------------------- the CLI
def test_cli_under_two_processes_writes_the_single_process_table(tmp_path):
    texts = [a for text in TEXTS for a in ("--text", text)]
    single, sharded = cli_tables(
        ["compare", "--model", MODEL, *texts, "--target", "class:1", "--views", ",".join(VIEWS),
         "--methods", "saliency,gradient_shap,leave_one_out", "--seed", "2", "--skip-long",
         "--max-length", str(MAX_LENGTH), "--distributed", "--quiet"], folder=tmp_path)
    pd.testing.assert_frame_equal(single, sharded, check_exact=True)
    assert list(dict.fromkeys(single.example_id)) == ["0", "1", "2", "4", "5"]
