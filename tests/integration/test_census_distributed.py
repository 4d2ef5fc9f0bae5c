"""The census sharded over two torch.distributed (gloo) processes equals one process exactly."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.integration.distributed import run_ranks

N_SENTENCES = 40
CORPUS = Path(__file__).parents[2] / "analyses" / "data" / "census_sentences.txt"


def _census_tables(rank: int, conllu: str) -> dict | None:
    """One rank: run the census on the shared trees; rank 0 returns every table."""
    import attnprobe as ap
    from attnprobe.heads import census, read_conllu

    model, tokenizer = ap.load_model("minilm")
    result = census(model, tokenizer, trees=read_conllu(conllu), batch_size=8)
    if rank != 0:
        return None
    return {"scores": result.scores(), "syntax": result.syntax(),
            "distances": result.distances(), "n": result.n_sentences,
            "rows": dict(result.tally.counts)}


@pytest.fixture(scope="module")
def conllu(tmp_path_factory) -> str:
    from attnprobe.heads import parse, write_conllu

    texts = CORPUS.read_text(encoding="utf-8").splitlines()[:N_SENTENCES]
    path = tmp_path_factory.mktemp("trees") / "corpus.conllu"
    path.write_text(write_conllu(parse(texts)), encoding="utf-8")
    return str(path)


def test_two_processes_give_exactly_the_single_process_census(conllu, tmp_path):
    single = run_ranks(_census_tables, (conllu,), world=1, folder=tmp_path)[0]
    sharded = run_ranks(_census_tables, (conllu,), world=2, folder=tmp_path)[0]
    assert single["n"] == sharded["n"] == N_SENTENCES
    assert single["rows"] == sharded["rows"]
    for name in ("scores", "syntax", "distances"):
        pd.testing.assert_frame_equal(single[name], sharded[name], check_exact=True)
    # the census really covered syntax and every head
    assert len(single["scores"]) == 6 * 12
    assert {"det", "nsubj"} <= set(single["syntax"]["relation"])
