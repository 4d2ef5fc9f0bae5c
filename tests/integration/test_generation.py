"""Attention while causal language models generate: ``extract(..., generate=N)``, capture
around ``model.generate`` with the KV cache, and ``compare(..., generate=N)``.

Expected weights come from one plain forward over the final sequence: transformers' eager
path (``output_attentions=True`` on an eager twin) for HF models, a separate ``extract`` of the
whole sequence as text for ``ref:induction`` (whose word tokenizer round-trips exactly).
"""

from __future__ import annotations

import copy

import pytest
import torch

import attnprobe as ap
from attnprobe.attribution.comparison import STEP_COLUMNS, compare
from attnprobe.attribution.methods import attribute
from attnprobe.attribution.views import attention_importance
from attnprobe.errors import InputError
from tests.integration.causal_lms import causal_lm, text

TOL = 1e-5
PROMPTS = [text(5, 6, 7, 8, 9, 10), text(11, 12), text(20, 21, 22, 23)]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def induction():
    return ap.load_model("ref:induction")


def eager_twin(model):
    twin = type(model)(copy.deepcopy(model.config)).eval()
    twin.load_state_dict(model.state_dict())
    twin.set_attn_implementation("eager")
    return twin


def one_forward(twin, ids):
    """Eager weights ``[layer, head, T, T]`` of one unpadded forward over ``ids`` ``[T]``."""
    with torch.no_grad():
        out = twin(input_ids=ids[None], output_attentions=True)
    return torch.stack([a[0] for a in out.attentions])


def ids_of(tokenizer, amap):
    return torch.tensor(tokenizer.convert_tokens_to_ids(list(amap.query_tokens)))


# ------------------------------------------------------------------ extract(generate=N)
@pytest.mark.parametrize("sample", [False, True])
@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2"])
def test_extract_generate_equals_one_forward_over_the_final_sequence(name, sample):
    model, tok = causal_lm(name)
    n = 5
    maps = ap.extract(model, tok, PROMPTS, generate=n, sample=sample, seed=3, batch_size=2)
    twin = eager_twin(model)
    assert [m.example_id for m in maps] == ["0", "1", "2"]
    for prompt, amap in zip(PROMPTS, maps, strict=True):
        real = tok(prompt)["input_ids"]
        assert amap.prompt_length == len(real) and amap.shape[2] == len(real) + n
        assert amap.generated == (False,) * len(real) + (True,) * n
        ids = ids_of(tok, amap)
        assert ids[:len(real)].tolist() == real
        want = one_forward(twin, ids)
        assert (amap.pattern - want).abs().max().item() <= TOL
        later = torch.ones(amap.shape[2], amap.shape[3], dtype=torch.bool).triu(1)
        assert amap.pattern[..., later].abs().max() == 0  # causal: exactly 0, not just small
    if not sample:  # greedy: every generated token is the top logit of its context
        for amap in maps:
            ids = ids_of(tok, amap)
            with torch.no_grad():
                logits = model(input_ids=ids[None]).logits[0]
            start = amap.prompt_length
            assert logits[start - 1:-1].argmax(-1).tolist() == ids[start:].tolist()


def test_sampling_is_seeded_and_differs_from_greedy():
    model, tok = causal_lm("gpt2")
    draw = [ap.extract(model, tok, PROMPTS[:1], generate=8, sample=True, seed=s)[0]
            for s in (1, 1, 2)]
    greedy = ap.extract(model, tok, PROMPTS[:1], generate=8)[0]
    assert draw[0].query_tokens == draw[1].query_tokens
    assert len({draw[0].query_tokens, draw[2].query_tokens, greedy.query_tokens}) == 3
    state = torch.get_rng_state()
    ap.extract(model, tok, PROMPTS[:1], generate=2, sample=True, seed=5)
    assert torch.equal(state, torch.get_rng_state())  # the caller's random state is untouched


@pytest.mark.parametrize("sample", [False, True])
def test_ref_induction_generates_and_copies(induction, sample):
    model, tok = induction
    segment = [f"t{i:02d}" for i in (3, 17, 42, 8, 29, 51, 11, 60, 34, 5)]
    prompt = " ".join(["t40", "t41", *segment, "t44", "t45", *segment[:3]])
    amap = ap.extract(model, tok, [prompt], generate=5, sample=sample, seed=0)[0]
    assert amap.prompt_length == 1 + 2 + 10 + 2 + 3 and amap.shape[2] == 23
    whole = ap.extract(model, tok, [" ".join(amap.query_tokens[1:])])[0]  # [BOS] re-added
    assert whole.query_tokens == amap.query_tokens
    assert (amap.pattern - whole.pattern).abs().max().item() <= TOL
    if not sample:  # the induction circuit continues the repeated segment
        assert amap.query_tokens[amap.prompt_length:] == tuple(segment[3:8])


def test_generate_then_views_read_the_generated_rows(induction):
    model, tok = induction
    amap = ap.extract(model, tok, ["t01 t02 t03 t04 t05 t06 t07 t08 t01 t02"], generate=3)[0]
    row = ap.attribution.raw(amap, 1)  # auto: the last row, a generated token's
    assert torch.allclose(row, amap.pattern[1, :, -1].mean(0).double())


def test_generate_errors_are_one_line(induction):
    model, tok = induction
    encoder, enc_tok = ap.load_model("ref:encoder")
    gpt2, gpt2_tok = causal_lm("gpt2")
    cases = [
        (lambda: ap.extract(encoder, enc_tok, ["the cat"], generate=2), "attends both ways"),
        (lambda: ap.extract(model, tok, ["t01"], generate=0), "positive integer"),
        (lambda: ap.extract(model, tok, ["t01"], generate=True), "positive integer"),
        (lambda: ap.extract(gpt2, gpt2_tok, [text(*range(5, 65))], generate=5),
         "text 0 has 60 tokens; with generate=5 the sequence needs 65 positions"),
        (lambda: ap.extract(gpt2, gpt2_tok, [text(5)], generate=64), "leaves no room"),
        (lambda: ap.extract(gpt2, gpt2_tok, [""], generate=2), "text 0 is empty"),
    ]
    for call, message in cases:
        with pytest.raises(InputError, match=message) as err:
            call()
        assert "\n" not in str(err.value)
    base = gpt2.transformer  # GPT2Model: causal, but no language-model head
    with pytest.raises(InputError, match="language-model head"):
        ap.extract(base, gpt2_tok, [text(5, 6)], generate=2)


def test_a_prompt_too_long_for_the_room_is_cut_or_skipped():
    model, tok = causal_lm("gpt2")
    long, short = text(*range(5, 70)), text(5, 6)  # 65 tokens: 60 leave room for 4
    cut = ap.extract(model, tok, [long], generate=4, truncation="cut")[0]
    assert cut.shape[2] == 64 and cut.prompt_length == 60
    kept = ap.extract(model, tok, [long, short], generate=4, truncation="skip")
    assert [m.example_id for m in kept] == ["1"]


# ----------------------------------------------------------- compare(generate=N)
def test_compare_explains_every_generated_token_from_its_context(induction):
    model, tok = induction
    prompt = "t01 t02 t03 t04 t05 t06 t07 t08 t09 t01 t02"
    n = 3
    result = compare(model, tok, [prompt], "next-token", generate=n,
                     methods=["saliency", "leave_one_out"], views=["raw", "rollout"])
    assert list(result.table.columns) == list(STEP_COLUMNS)
    amap = result.maps[0]
    assert amap.prompt_length == 12 and amap.shape[2] == 12 + n
    assert sorted(set(result.table.step)) == [1, 2, 3]
    by_step = result.table.groupby("step")
    for step, rows in by_step:
        position = 12 + step - 1
        assert set(rows.position) == {position}
        assert set(rows.token) == {amap.query_tokens[position]}
    # every importance vector equals the same analysis run on the context as a text
    vectors = {(a.example_id, a.method): a for a in result.attributions}
    for step in range(1, n + 1):
        position = 12 + step - 1
        context = " ".join(amap.query_tokens[1:position])
        token = tok.convert_tokens_to_ids([amap.query_tokens[position]])[0]
        target = f"next-token:{token}"
        for alone in attribute(model, tok, [context], target, ["saliency", "leave_one_out"]):
            got = vectors[(f"0:step{step}", alone.method)]
            assert got.target == target and got.tokens == alone.tokens
            assert torch.allclose(got.scores, alone.scores.abs(), atol=1e-6)
        for view in attention_importance(model, tok, context, views=["raw", "rollout"]):
            got = vectors[(f"0:step{step}", view.method)]
            assert torch.allclose(got.scores, view.scores, atol=1e-6)  # auto: the last row


def test_compare_generate_on_a_gpt2_lm(capsys):
    model, tok = causal_lm("gpt2")
    result = compare(model, tok, PROMPTS[:2], "next-token", generate=2,
                     methods=["saliency"], views=["raw", "attn_x_grad"], progress=True)
    # per text: the generation, then per generated token its method and its views: 2 × 5
    err = capsys.readouterr().err
    for piece in ("0/10", "text 0: generating", "1/10", "text 0 token 1: saliency",
                  "text 0 token 2: attention views", "text 1: generating", "10/10"):
        assert piece in err, piece
    assert set(result.table.example_id) == {"0", "1"}
    assert len(result.maps) == 2 and [m.prompt_length for m in result.maps] == [6, 2]
    # the step-1 view of text 1 reads the last prompt row: raw@L0 over its 2 tokens
    raw = next(a for a in result.attributions if a.example_id == "1:step1"
               and a.method == "raw@L0")
    want = result.maps[1].pattern[0, :, 1, :2].mean(0).double()
    assert torch.allclose(raw.scores, want)
    summary = result.summary()
    assert (summary.n == 4).all()  # 2 texts x 2 generated tokens


def test_compare_generate_errors(induction):
    model, tok = induction
    encoder, enc_tok = ap.load_model("ref:encoder")
    cases = [
        (lambda: compare(model, tok, ["t01 t02"], "class:1", generate=2), "target 'next-token'"),
        (lambda: compare(model, tok, ["t01 t02"], "next-token:5", generate=2),
         "target 'next-token'"),
        (lambda: compare(model, tok, ["t01 t02"], "next-token", generate=2,
                         truth=[[True, False, False]]), "cannot be combined with generate"),
        (lambda: compare(encoder, enc_tok, ["the cat"], "next-token", generate=2),
         "attends both ways"),
        (lambda: compare(model, tok, ["t01 t02"], "next-token", generate=-1),
         "positive integer"),
    ]
    for call, message in cases:
        with pytest.raises(InputError, match=message) as err:
            call()
        assert "\n" not in str(err.value)


# ------------------------------------------------------------------ the report
def test_the_report_view_marks_the_generated_tokens(induction, tmp_path):
    """In headless Chromium (skipped where it is absent): the generated tokens, and only
    they, are marked in both columns; the note is shown and the menu counts them."""
    import shutil

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium missing")
    if not (chromium and driver_path):
        pytest.skip("Chromium or ChromeDriver not installed")
    from selenium.webdriver.chrome.service import Service

    model, tok = induction
    amap = ap.extract(model, tok, ["t01 t02 t03 t04 t05 t06 t07 t08 t09 t01 t02"],
                      generate=3)[0]
    page = ap.report.build(maps=[amap]).save(tmp_path / "report.html")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        browser.get(page.resolve().as_uri())
        for column in ("left", "right"):
            tokens = browser.find_elements("css selector", f"#ap-view .{column} .tok")
            marked = ["gen" in t.get_attribute("class").split() for t in tokens]
            assert marked == [False] * 12 + [True] * 3
        assert browser.find_element("css selector", ".gen-note").is_displayed()
        assert "(+3 generated)" in browser.find_element("css selector", ".sel-sentence").text
    finally:
        browser.quit()
