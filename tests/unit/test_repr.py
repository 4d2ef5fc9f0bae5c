"""Every result object prints as one informative line (issue 13 §1): at most MAX_WIDTH
characters, no newline, naming the numbers that matter. The numbers are computed here from
the inputs (token counts from the tokenizer, heads from the config), not read back from the
object, and a repr never formats a huge value (a 512-token map, a megabyte of HTML)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
import torch

import attnprobe as ap
from attnprobe.capture.generation import Generated
from attnprobe.core.display import MAX_WIDTH, counted, describe, grid, indices, quoted, size
from attnprobe.core.row_blocks import RowBlock
from attnprobe.heads import census as run_census
from attnprobe.heads.checkpoint_diff import diff_censuses
from attnprobe.heads.copy_steps import CopySteps
from attnprobe.heads.paired_attention import attention_change
from attnprobe.heads.retrieval import RetrievalHits
from attnprobe.heads.trees import Tree
from attnprobe.inputs.text import prepare_corpus
from attnprobe.perturb.adversarial import AdversarialResult
from attnprobe.tasks import make_batch, needle_task
from attnprobe.tasks.keytoken import make_examples
from tests.helpers import bert_tokenizer, bert_vocab, tiny_bert, tiny_bert_classifier

TEXTS = ["the cat sat on a mat", "a big red dog ran", "the dog sat"]
# pre-split sentences of the vocabulary's words (one token each) with their trees
TREES = [Tree("s0", ("the", "cat", "sat"), (2, 3, 0), ("det", "nsubj", "root")),
         Tree("s1", ("a", "big", "dog", "ran", "on", "the", "mat"), (3, 3, 4, 0, 7, 7, 4),
              ("det", "amod", "nsubj", "root", "case", "det", "obl"))]
INFO = ap.ModelInfo("tiny", "bert", n_layers=3, n_heads=4, causal=False,
                    attn_implementation="eager", dtype="float32")


def one_line(obj: object) -> str:
    text = repr(obj)
    assert "\n" not in text, text
    assert len(text) <= MAX_WIDTH, (len(text), text)
    assert text.startswith(type(obj).__name__ + "("), text
    return text


def random_map(n_query: int, n_key: int | None = None, **kw) -> ap.AttentionMap:
    n_key = n_query if n_key is None else n_key
    pattern = torch.randn(3, 4, n_query, n_key).softmax(-1)
    return ap.AttentionMap(pattern, [f"q{i}" for i in range(n_query)],
                           [f"k{i}" for i in range(n_key)], (0, 1, 2), INFO, **kw)


@pytest.fixture(scope="module")
def bert():
    vocab = bert_vocab()
    return tiny_bert(vocab), bert_tokenizer(vocab)


@pytest.fixture(scope="module")
def census(bert):
    model, tok = bert
    return run_census(model, tok, trees=TREES, repeated=False)


# ---------------------------------------------------------------------------- helpers
def test_display_helpers():
    assert counted(4311) == "4,311" and counted(4311, "token") == "4,311 tokens"
    assert counted(1, "token") == "1 token" and counted(2, "class", "classes") == "2 classes"
    assert size(812) == "812 B" and size(1_234_567) == "1.23 MB" and size(14_200) == "14.2 kB"
    assert indices([5, 0, 1, 2, 3, 4]) == "0-5" and indices([2, 5]) == "2,5"
    assert indices([0, 1, 2, 3, 7, 9]) == "0-3,7,9" and indices(range(0, 40, 2)).endswith("…")
    assert grid(6, 12) == "6 layers × 12 heads"
    assert grid((2, 5), (0, 8), 6, 12) == "2 layers (2,5) × 2 heads (0,8)"
    assert grid(range(6), range(12), 6, 12) == "6 layers × 12 heads"
    assert quoted("x" * 10_000, 20) == repr("x" * 19) + "…"
    long = describe("Thing", "a" * 500, "b")
    assert len(long) == MAX_WIDTH and long.endswith("…)")
    assert describe("Thing", "a", None, "", "b") == "Thing(a, b)"


# ------------------------------------------------------------------------- core types
def test_attention_map_repr_names_model_grid_and_tokens():
    text = one_line(random_map(5))
    assert text.startswith("AttentionMap(tiny, self, 3 layers × 4 heads, 5 × 5 tokens, float32")
    assert "'q0 q1 q2 q3 q4'" in text
    sub = one_line(random_map(5, example_id="s7").select(layers=[1], heads=[0, 2]))
    assert "1 layer (1) × 2 heads (0,2)" in sub and "example 's7'" in sub
    cross = one_line(random_map(4, 6, kind="cross", stack="decoder.layers"))
    assert "decoder cross" in cross and "4 query × 6 key tokens" in cross
    generated = one_line(random_map(6, prompt_length=4))
    assert "prompt 4 + 2 generated" in generated


def test_repr_of_a_long_map_stays_short():
    amap = random_map(512)
    text = one_line(amap)
    assert "512 × 512 tokens" in text and "q11" in text and "q12 " not in text


def test_model_info_and_token_attribution():
    assert one_line(INFO) == ("ModelInfo(tiny: bert, 3 layers × 4 heads, bidirectional, eager, "
                              "float32)")
    scores = torch.tensor([0.1, -0.7, 0.3])
    found = one_line(ap.TokenAttribution(scores, ("a", "cat", "sat"), "saliency", "class:1",
                                         "4", delta=0.01))
    assert found == ("TokenAttribution(saliency for 'class:1', 3 tokens, top 'cat' -0.7, "
                     "delta 0.01, example '4')")


# ------------------------------------------------------------------------ streaming stats
def test_tally_and_row_block(bert):
    model, tok = bert
    tally = ap.head_stats(model, tok, TEXTS)
    rows = sum(len(tok(t)["input_ids"]) for t in TEXTS)  # [CLS] ... [SEP] of each text
    n_heads = model.config.num_hidden_layers * model.config.num_attention_heads
    n_stats = len(set(tally.to_frame()["statistic"]))
    text = one_line(tally)
    assert text.startswith(f"Tally({n_stats} statistics (entropy")
    assert f"× {n_heads} heads in 2 layers (0,1), {rows} rows)" in text
    valid = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]).bool()
    block = RowBlock(pattern=torch.rand(2, 3, 4, 5), query_valid=valid,
                     query_pos=torch.zeros(2, 4), key_pos=torch.zeros(2, 5),
                     key_len=torch.tensor([5, 2]))
    assert one_line(block) == ("RowBlock(2 examples × 3 heads × 4 query rows × 5 keys, "
                               "4 real rows, no token ids)")


def test_capture_repr_does_not_assemble_the_maps(bert):
    model, tok = bert
    with ap.capture(model, "layer:1", tokenizer=tok) as cap:
        model(**tok(TEXTS[:2], padding=True, return_tensors="pt"))
    assert one_line(cap) == ("Capture(1 site (encoder.layer self 1), maps built on first "
                             "read)")
    assert len(cap.maps) == 2
    assert "2 maps" in one_line(cap)


# ------------------------------------------------------------------------------ census
def test_census_and_its_parts(bert, census):
    model, _ = bert
    heads = model.config.num_hidden_layers * model.config.num_attention_heads
    tokens = sum(len(t.words) + 2 for t in TREES)  # one token per word, [CLS] and [SEP]
    scored = sum(1 for t in TREES for h in t.heads if h != 0)  # words with a head word
    text = one_line(census)
    assert text.startswith(f"Census(BertModel: {heads} heads in 2 layers, 2 sentences, "
                           f"{tokens} tokens, syntax on {scored} words, head distances")
    relations = len({r for t in TREES for r, h in zip(t.relations, t.heads, strict=True) if h})
    assert one_line(census.sums.syntax).startswith(
        f"SyntaxCounts({heads} heads, {scored} words with a head, {relations} relations")
    assert one_line(census.sums.distances).startswith(
        f"HeadDistances({heads} heads, {heads * (heads - 1) // 2} pairs")
    assert f"{tokens} rows" in one_line(census.sums)
    assert f"{tokens} rows" in one_line(census.tally)
    for stacked in census.sums.stacked.values():
        assert "2 layers × 2 heads" in one_line(stacked)
    stats = ap.heads.CensusStats(classes={"cls": torch.tensor([2])}, max_offset=8,
                                 groups=frozenset({"rows", "offsets"}))
    assert one_line(stats) == "CensusStats(offsets, rows, 1 token class, max offset 8)"
    assert "2 sentences" in one_line(diff_censuses(census, census))


def test_tree_and_attention_change(bert):
    model, tok = bert
    tree = one_line(TREES[1])
    assert tree == "Tree('s1', 7 words, root 'ran', 'a big dog ran on the mat')"
    change = attention_change(model, model, tok, TEXTS)
    rows = sum(len(tok(t)["input_ids"]) for t in TEXTS)
    assert one_line(change) == f"AttentionChange(4 heads, 3 examples, {rows} rows, mean JS 0 nats)"


# ------------------------------------------------------------------ attribution, report
def test_comparison_and_report():
    model, tok = tiny_bert_classifier()
    found = ap.attribution.compare(model, tok, TEXTS[:2], "class:1", views=["raw"],
                                   methods=["saliency", "leave_one_out"])
    text = one_line(found)
    # the views' layers: the tiny model's two
    assert text == ("Comparison(2 texts, methods saliency, leave_one_out, views raw at 2 layers, "
                    f"{len(found.table)} rows)")
    report = ap.report.build(maps=ap.extract(model, tok, TEXTS[:1]), comparison=found)

    class Sections(HTMLParser):
        n = 0

        def handle_starttag(self, tag, attrs):
            self.n += tag == "section"

    parser = Sections()
    parser.feed(report.html)
    kilobytes = len(report.html.encode()) / 1000
    text = one_line(report)
    assert re.fullmatch(r"Report\('attnprobe report', ([\d.]+) kB, (\d+) sections\)", text)
    shown, sections = re.fullmatch(r".*, ([\d.]+) kB, (\d+) sections\)", text).groups()
    assert abs(float(shown) - kilobytes) < 1 and int(sections) == parser.n > 0
    big = type(report)("<p>" + "x" * 5_000_000 + "</p>", title="y" * 1000)
    assert one_line(big).endswith("5 MB, 0 sections)")


# ------------------------------------------------------------------------------- tasks
def test_task_objects():
    needles = needle_task(3, length=64, depth=0.5, needle_len=8)
    assert one_line(needles) == ("Needles(3 contexts × 64 tokens, needle of 8 tokens at depth "
                                 "0.5, prefix 2, distinct)")
    batch = make_batch("reverse", 5, min_len=3, max_len=6)
    longest = max(len(a) for a in batch.alignment)
    assert one_line(batch) == (f"TaskBatch(reverse, 5 examples, sources of up to {longest} "
                               f"words, targets of up to {longest} words)")
    data = make_examples("contains", 20, seed=1)
    text = one_line(data)
    assert text.startswith(f"KeyTokenData(contains, 20 texts, {int(data.labels.sum())} "
                           "labelled 1")


def test_copy_steps_retrieval_hits_adversarial_generated_corpus(bert):
    model, tok = bert
    target = torch.tensor([[-1, -1, 5, 6, -1], [-1, 7, -1, -1, -1]])
    steps = CopySteps(torch.ones(2, 5, dtype=torch.long),
                      torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]), target,
                      torch.zeros(2, 5, dtype=torch.bool), ("0", "1"), ("2",))
    assert one_line(steps) == ("CopySteps(2 examples, up to 5 tokens, 3 copy steps, "
                               "1 example skipped)")
    hits = RetrievalHits(target, torch.zeros(2, 5, dtype=torch.bool))
    assert one_line(hits) == "RetrievalHits(2 examples × 5 positions, 3 copy steps)"
    found = AdversarialResult(3, (0, 1, 2), 0.01, (0.2, 0.5, 0.4), (0.001, 0.02, 0.005), 0.4,
                              torch.zeros(3, 3, 2, 2), torch.zeros(3, 2, 2))
    assert one_line(found) == ("AdversarialResult(layer 3 heads 0-2, eps 0.01, 3 adversaries, "
                               "2 within eps, max JSD 0.4 nats)")
    generated = Generated(random_map(6, prompt_length=4), torch.arange(6))
    assert one_line(generated).startswith("Generated(4 prompt tokens + 2 generated, "
                                          "AttentionMap(tiny")
    corpus = prepare_corpus(model, tok, [*TEXTS, "the cat " * 40], truncation="skip")
    assert one_line(corpus) == "Corpus(3 texts, 1 text skipped)"
