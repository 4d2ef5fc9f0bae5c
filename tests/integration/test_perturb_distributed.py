"""perturb.run sharded over two torch.distributed (gloo) processes equals one process: the same
example ids, the same random draws, the same corpus-level sums (importance's gradients and
curve, mean's head means), the same per-head sweeps, the same knockouts and scalar metrics;
through the library and through ``attnprobe perturb --distributed`` as torchrun would start
it."""

from __future__ import annotations

import pandas as pd

from tests.integration.distributed import cli_tables, counting_forwards, run_ranks

MODEL = "ref:transformer-classifier"  # untrained, built the same way in every process
TEXTS = ["the cat sat on the red mat", "a dog ran to the big tree", "the bird saw a fish",
         "dog " * 12 + "cat", "the red cat and the dog", "a tree"]
MAX_LENGTH = 10  # text 3 (14 tokens) is longer: skipped, the others keep their index
RUNS = {  # name -> experiment, options; batch_size 2 makes several batches to split
    "permute": ("permute", {"n_permutations": 5, "batch_size": 2}),
    "dirichlet": ("dirichlet", {"n_draws": 3, "alpha": 0.5}),
    "uniform": ("uniform", {"batch_size": 2}),
    "erase": ("erase", {"max_erased": 2, "rankings": ["attention", "random"], "batch_size": 3}),
    "importance": ("importance", {"batch_size": 2, "prune_steps": 3}),
    # 5 texts in batches of 3 and 2, each repeated for one head at a time: 8 forwards
    "ablate-sweep": ("ablate", {"sweep": "head", "batch_size": 3}),
    # attention knockout, each batch with its texts' own edges; a metric read per text
    "knockout": ("knockout", {"edges": "to:0", "batch_size": 2}),
    "knockout-sweep": ("knockout", {"edges": "last-to:0-1", "sweep": "layer", "batch_size": 3,
                                    "metric": "first-class"}),
    "uniform-metric": ("uniform", {"metric": "first-class", "batch_size": 2}),
}


def first_class(output, batch):
    """A callable metric: the classifier's first logit."""
    return output[:, 0]
BERT_WORDS = "the cat sat on mat a dog ran big red tree bird saw fish and"


def _library(rank: int) -> dict:
    """One rank: every experiment over TEXTS; the tables and the forwards each one ran."""
    import attnprobe as ap
    from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert

    model, tok = ap.load_model(MODEL)
    tables, forwards = {}, {}
    for name, (experiment, options) in RUNS.items():
        if options.get("metric") == "first-class":
            options = {**options, "metric": first_class}
        with counting_forwards(model) as seen:
            tables[name] = ap.perturb.run(
                model, tok, TEXTS, experiment, seed=7, truncation="skip",
                max_length=MAX_LENGTH, **options)
        forwards[name] = len(seen)
    vocab = bert_vocab(BERT_WORDS)
    bert, bert_tok = tiny_bert(vocab), bert_tokenizer(vocab)  # seeded: the same on every rank
    tables["mean"] = ap.perturb.run(bert, bert_tok, TEXTS, "mean", scope="layer:1",
                                    batch_size=2, truncation="skip", max_length=MAX_LENGTH)
    # the 5 texts repeated for heads 0.0-1.0 in one forward and for 1.1 in another
    tables["mean-sweep"] = ap.perturb.run(bert, bert_tok, TEXTS, "mean", sweep="head",
                                          truncation="skip", max_length=MAX_LENGTH)
    return {"tables": tables, "forwards": forwards}


def test_two_processes_give_the_single_process_tables_on_every_rank(tmp_path):
    (single,) = run_ranks(_library, world=1, folder=tmp_path)
    ranks = run_ranks(_library, world=2, folder=tmp_path)
    for name, table in single["tables"].items():
        kept = ["0", "1", "2", "4", "5"] if name != "importance" else ["all"]
        assert list(dict.fromkeys(table["example_id"])) == kept, name
        for sharded in ranks:
            pd.testing.assert_frame_equal(table, sharded["tables"][name], check_exact=True,
                                          obj=name)
    # the work was split: each rank ran only part of the forwards (plus the first forward
    # every rank runs to read the output kind)
    for name, count in single["forwards"].items():
        parts = [r["forwards"][name] for r in ranks]
        assert all(part < count for part in parts), (name, parts, count)
    uniform = [r["forwards"]["uniform"] for r in ranks]
    assert sum(uniform) - 1 == single["forwards"]["uniform"]  # 3 batches: 2 + 1
    # corpus quantities really are over the corpus: importance scores every head
    importance = single["tables"]["importance"]
    assert len(importance[importance["metric"] == "importance"]) == 4
    # a sweep has a row per head: the reference classifier's and the tiny BERT's 2 x 2
    for name in ("ablate-sweep", "mean-sweep"):
        heads = single["tables"][name][["layer", "head"]].drop_duplicates()
        assert heads.values.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]], name
    swept = single["tables"]["knockout-sweep"]
    assert swept["layer"].drop_duplicates().tolist() == [0, 1]
    assert set(swept["metric"]) == {"custom"} == set(single["tables"]["uniform-metric"]["metric"])


def test_cli_knockout_under_two_processes_writes_the_single_process_table(tmp_path):
    texts = [a for text in TEXTS for a in ("--text", text)]
    single, sharded = cli_tables(
        ["perturb", "--model", "ref:transformer", *texts, "--experiment", "knockout",
         "--edges", "to:0", "--metric", "loss", "--batch-size", "2", "--skip-long",
         "--max-length", str(MAX_LENGTH), "--distributed", "--quiet"], folder=tmp_path)
    pd.testing.assert_frame_equal(single, sharded, check_exact=True)
    assert list(dict.fromkeys(single.example_id)) == ["0", "1", "2", "4", "5"]


# ---------------------------------------------------------------------------- the CLI
def test_cli_under_two_processes_writes_the_single_process_table(tmp_path):
    texts = [a for text in TEXTS for a in ("--text", text)]
    single, sharded = cli_tables(
        ["perturb", "--model", MODEL, *texts, "--experiment", "permute", "--permutations", "4",
         "--batch-size", "3", "--seed", "2", "--skip-long", "--max-length", str(MAX_LENGTH),
         "--distributed", "--quiet"], folder=tmp_path)
    pd.testing.assert_frame_equal(single, sharded, check_exact=True)
    assert list(dict.fromkeys(single.example_id)) == ["0", "1", "2", "4", "5"]
