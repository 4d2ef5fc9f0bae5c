"""The census sharded over two torch.distributed (gloo) processes equals one process exactly."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.multiprocessing as mp

N_SENTENCES = 40
CORPUS = Path(__file__).parents[2] / "analyses" / "data" / "census_sentences.txt"


def _census_tables(conllu: str, out: Path, rank: int, world: int, rendezvous: str) -> None:
    """One rank: run the census on the shared trees and (rank 0) pickle every table."""
    torch.set_num_threads(1)  # same arithmetic in every process
    import attnprobe as ap
    from attnprobe.heads import census, read_conllu

    if world > 1:
        torch.distributed.init_process_group("gloo", init_method=rendezvous, rank=rank,
                                             world_size=world)
    try:
        model, tokenizer = ap.load_model("minilm")
        result = census(model, tokenizer, trees=read_conllu(conllu), batch_size=8)
        if rank == 0:
            tables = {"scores": result.scores(), "syntax": result.syntax(),
                      "distances": result.distances(), "n": result.n_sentences,
                      "rows": dict(result.tally.counts)}
            out.write_bytes(pickle.dumps(tables))
    finally:
        if world > 1:
            torch.distributed.destroy_process_group()


def _rank(rank: int, conllu: str, out: str, world: int, rendezvous: str) -> None:
    _census_tables(conllu, Path(out), rank, world, rendezvous)


@pytest.fixture(scope="module")
def conllu(tmp_path_factory) -> str:
    from attnprobe.heads import parse, write_conllu

    texts = CORPUS.read_text(encoding="utf-8").splitlines()[:N_SENTENCES]
    path = tmp_path_factory.mktemp("trees") / "corpus.conllu"
    path.write_text(write_conllu(parse(texts)), encoding="utf-8")
    return str(path)


def _run(conllu: str, tmp: Path, world: int) -> dict:
    out = tmp / f"world{world}.pkl"
    rendezvous = f"file://{tmp / f'rendezvous{world}'}"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_rank, args=(conllu, str(out), world, rendezvous), nprocs=world,
                       join=True, start_method="spawn")
    return pickle.loads(out.read_bytes())


def test_two_processes_give_exactly_the_single_process_census(conllu, tmp_path):
    single = _run(conllu, tmp_path, 1)
    sharded = _run(conllu, tmp_path, 2)
    assert single["n"] == sharded["n"] == N_SENTENCES
    assert single["rows"] == sharded["rows"]
    for name in ("scores", "syntax", "distances"):
        pd.testing.assert_frame_equal(single[name], sharded[name], check_exact=True)
    # the census really covered syntax and every head
    assert len(single["scores"]) == 6 * 12
    assert {"det", "nsubj"} <= set(single["syntax"]["relation"])
