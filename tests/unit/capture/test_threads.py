"""Fault 1 of issue 11: captures of one model that overlap (threads, out-of-order exits, Ctrl-C)
always leave the model as it was, and each capture sees only its own forwards."""

from __future__ import annotations

import threading

import pytest
import torch

import attnprobe as ap
from attnprobe.capture import count_hooks
from attnprobe.models import build_reference
from tests.conftest import track
from tests.integration.hf_models import FAMILIES, build, build_pair, implementations
from tests.unit.capture.tiny import batch, eager_maps, hidden, registrations

WAIT = 60  # seconds a thread waits for the other before the test fails (never reached)
THREE = ("bert", "gpt2", "llama")


def _run(*targets) -> list[BaseException]:
    """Run each target in its own thread; the exceptions they raised."""
    errors: list[BaseException] = []

    def guarded(target):
        def run():
            try:
                target()
            except BaseException as exc:  # reported by the test, Ctrl-C included
                errors.append(exc)
        return run

    threads = [threading.Thread(target=guarded(t)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    return errors


def _assert_maps(cap, expected, layers=slice(None), heads=slice(None)):
    assert len(cap.maps) == len(expected)
    for amap, want in zip(cap.maps, expected, strict=True):
        want = want[layers][:, heads]
        assert amap.shape == tuple(want.shape)
        assert (amap.pattern - want).abs().max().item() <= 1e-6


def _a_in_b_in_a_out_b_out(model, a: dict, b: dict, *, forward_a, between, forward_b):
    """Thread A enters ``ap.capture(model, **a)``, thread B enters ``ap.capture(model, **b)``,
    A runs ``forward_a()`` and exits, B records ``between()``, runs ``forward_b()`` and exits.
    The exceptions the threads raised, and what they saw: "a" and "b" (each capture, when its
    exit did not raise) and "between"."""
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def thread_a():
        try:
            with torch.no_grad(), ap.capture(model, **a) as cap:
                a_in.set()
                assert b_in.wait(WAIT)
                forward_a()
            seen["a"] = cap
        finally:
            a_in.set()
            a_out.set()

    def thread_b():
        try:
            assert a_in.wait(WAIT)
            with torch.no_grad(), ap.capture(model, **b) as cap:
                b_in.set()
                assert a_out.wait(WAIT)
                seen["between"] = between()
                forward_b()
            seen["b"] = cap
        finally:
            b_in.set()

    return _run(thread_a, thread_b), seen


@pytest.mark.parametrize("name", THREE)
def test_a_in_b_in_a_out_b_out_restores_the_model(name):
    """A enters, B enters, A exits, B exits: both get their maps, the model is switched until
    B exits and then exactly as before (the old code left it on attnprobe_sdpa)."""
    model, twin = build_pair(name)
    inputs_a, inputs_b = batch(name, (7, 5)), batch(name, (4, 6, 3), seed=2)
    before = hidden(model, inputs_a)
    errors, seen = _a_in_b_in_a_out_b_out(
        model, {}, {"layers": [1], "heads": [0, 2]}, forward_a=lambda: model(**inputs_a),
        between=lambda: (implementations(model), registrations()),
        forward_b=lambda: model(**inputs_b))
    assert errors == []
    # after A left, B's capture was still in place: every config switched, function registered
    assert seen["between"] == ({"attnprobe_sdpa"}, {"attnprobe_sdpa"})
    _assert_maps(seen["a"], eager_maps(twin, inputs_a))
    _assert_maps(seen["b"], eager_maps(twin, inputs_b), slice(1, 2), [0, 2])
    assert implementations(model) == {"sdpa"}
    assert registrations() == set()
    assert torch.equal(hidden(model, inputs_a), before)  # a plain forward works, unchanged


def _configs(model) -> list:
    """Every config reachable from the model's modules and, recursively, their sub-configs."""
    found, todo = {}, [getattr(m, "config", None) for m in model.modules()]
    while todo:
        config = todo.pop()
        if config is not None and id(config) not in found:
            found[id(config)] = config
            todo.extend(getattr(config, k, None) for k in getattr(config, "sub_configs", {}))
    return list(found.values())


def test_overlapping_captures_restore_every_sub_config():
    """An encoder-decoder built from two BERT configs: the top config has sub-configs, and
    ``set_attn_implementation`` switches them all; all are restored after B exits."""
    import transformers

    def part(**kw):
        return transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=20, **kw)

    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(
        part(), part(is_decoder=True, add_cross_attention=True))
    config.decoder_start_token_id, config.pad_token_id = 2, 0
    torch.manual_seed(0)
    model = track(transformers.EncoderDecoderModel(config=config).eval())
    model.set_attn_implementation("sdpa")
    assert set(config.sub_configs) == {"encoder", "decoder"}
    assert {c._attn_implementation for c in _configs(model)} == {"sdpa"}
    ids = torch.randint(3, 50, (2, 5))
    errors, seen = _a_in_b_in_a_out_b_out(
        model, {}, {}, forward_a=lambda: None,
        between=lambda: {c._attn_implementation for c in _configs(model)},
        forward_b=lambda: model(input_ids=ids, decoder_input_ids=ids))
    # A never ran the model: its capture says so, after restoring nothing yet (B is open)
    assert [type(e).__name__ for e in errors] == ["HookNotFiredError"]
    assert seen["between"] == {"attnprobe_sdpa"}
    assert {(m.stack, m.kind) for m in seen["b"].maps} == {
        ("encoder.encoder.layer", "self"), ("decoder.bert.encoder.layer", "self"),
        ("decoder.bert.encoder.layer", "cross")}
    assert {c._attn_implementation for c in _configs(model)} == {"sdpa"}
    assert registrations() == set()
    with torch.no_grad():
        model(input_ids=ids, decoder_input_ids=ids)  # a plain forward works


def test_concurrent_forwards_each_reach_only_their_own_capture():
    """Two threads run forwards at the same time inside their own captures of one model."""
    model, twin = build_pair("bert")
    inputs = {"a": batch("bert", (7, 5)), "b": batch("bert", (3, 6, 4), seed=2)}
    barrier = threading.Barrier(2, timeout=WAIT)
    rounds = 4
    seen = {}

    def worker(key):
        def run():
            with torch.no_grad(), ap.capture(model) as cap:
                barrier.wait()
                for _ in range(rounds):
                    model(**inputs[key])
            seen[key] = cap
        return run

    assert _run(worker("a"), worker("b")) == []
    for key in ("a", "b"):
        _assert_maps(seen[key], eager_maps(twin, inputs[key]) * rounds)
    assert implementations(model) == {"sdpa"} and registrations() == set()


def test_hook_point_captures_in_two_threads_do_not_edit_each_other():
    """Forward hooks are shared by every thread: A's edit must not reach B's forward (the old
    code ablated B's output and recorded B's weights into A's maps)."""
    model, tok = build_reference("transformer")
    track(model)
    inputs = tok(["the cat sat on the mat", "a dog"])
    with torch.no_grad():
        plain = model(**inputs)
    a_in, b_done = threading.Event(), threading.Event()
    seen = {}

    def uniform(layer, pattern):
        return torch.full_like(pattern, 1 / pattern.shape[-1])

    def thread_a():
        try:
            with torch.no_grad(), ap.capture(model, layers=[0], edit=uniform) as cap:
                a_in.set()
                assert b_done.wait(WAIT)
                seen["a_out"] = model(**inputs)
            seen["a"] = cap
        finally:
            a_in.set()

    def thread_b():
        try:
            assert a_in.wait(WAIT)
            with torch.no_grad(), ap.capture(model) as cap:
                seen["b_out"] = model(**inputs)
            seen["b"] = cap
        finally:
            b_done.set()

    assert _run(thread_a, thread_b) == []
    assert torch.equal(seen["b_out"], plain)
    assert not torch.allclose(seen["a_out"], plain)
    width = inputs["input_ids"].shape[1]
    assert [m.layers for m in seen["a"].maps] == [(0,), (0,)]
    assert torch.allclose(seen["a"].maps[0].pattern, torch.full((), 1 / width))
    _, patterns = _manual_patterns(model, inputs)
    assert len(seen["b"].maps) == 2
    for b, amap in enumerate(seen["b"].maps):
        real = inputs["attention_mask"][b].bool()
        for i, layer in enumerate(amap.layers):
            want = patterns[f"blocks.{layer}.attn.hook_pattern"][b][:, real][..., real]
            assert torch.equal(amap.pattern[i], want)
    assert count_hooks(model) == 0


def _manual_patterns(model, inputs):
    """Every hook_pattern output of a plain forward, read by plain forward hooks."""
    seen = {}
    handles = [module.register_forward_hook(
        lambda m, a, out, name=name: seen.__setitem__(name, out))
        for name, module in model.named_modules() if name.endswith("hook_pattern")]
    try:
        with torch.no_grad():
            out = model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return out, seen


@pytest.mark.parametrize("name", THREE)
def test_captures_closed_out_of_order_in_one_thread(name):
    model, twin = build_pair(name)
    inputs = batch(name)
    outer, inner = ap.capture(model), ap.capture(model, layers=[1])
    with torch.no_grad():
        first = outer.__enter__()
        second = inner.__enter__()
        model(**inputs)
        outer.__exit__(None, None, None)  # the outer one closes first
        assert implementations(model) == {"attnprobe_sdpa"}
        model(**inputs)
        inner.__exit__(None, None, None)
    expected = eager_maps(twin, inputs)
    _assert_maps(first, expected)
    _assert_maps(second, expected * 2, slice(1, 2))
    assert implementations(model) == {"sdpa"} and registrations() == set()


def _interrupt(*_):
    raise KeyboardInterrupt


@pytest.mark.parametrize("name", THREE)
def test_ctrl_c_inside_the_forward_restores_the_model(name):
    model = build(name)
    inputs = batch(name)
    before = hidden(model, inputs)
    # the output projection right after layer 0's attention: Ctrl-C in mid-forward
    handle = model.get_submodule(FAMILIES[name].out_proj[0]).register_forward_hook(_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt), torch.no_grad(), \
                ap.capture(model, edit=lambda layer, p: p.flip(-1)):
            model(**inputs)
        assert implementations(model) == {"sdpa"}
        assert registrations() == set()
    finally:
        handle.remove()
    assert count_hooks(model) == 0
    assert torch.equal(hidden(model, inputs), before)


def test_ctrl_c_inside_a_hook_point_forward_removes_the_hooks():
    model, tok = build_reference("transformer")
    track(model)
    inputs = tok(["the cat sat"])
    handle = model.get_submodule("blocks.0.attn.hook_pattern").register_forward_hook(_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt), ap.capture(model, scores=True):
            model(**inputs)
    finally:
        handle.remove()
    assert count_hooks(model) == 0
    with ap.capture(model) as cap:  # and the model captures normally afterwards
        model(**inputs)
    assert len(cap.maps) == 1


def test_threads_generating_at_once_each_get_their_own_sequence():
    """Two threads run ``generate`` on one model inside their own captures, steps
    interleaved: each capture folds only its own steps, into its own map."""
    from tests.integration.causal_lms import causal_lm

    model, _ = causal_lm("gpt2")
    prompts = {"a": torch.tensor([[5, 6, 7, 8]]), "b": torch.tensor([[40, 41]])}
    turn = threading.Barrier(2, timeout=WAIT)
    seen = {}

    def step_in_turn(module, args, kwargs):  # the two threads take turns step by step
        turn.wait()

    def generate(name):
        def run():
            with torch.no_grad(), ap.capture(model) as cap:
                out = model.generate(input_ids=prompts[name], max_new_tokens=4,
                                     min_new_tokens=4, do_sample=False, pad_token_id=0)
            seen[name] = (cap.maps, out)
        return run

    handle = model.register_forward_pre_hook(step_in_turn, with_kwargs=True)
    try:
        assert _run(generate("a"), generate("b")) == []
    finally:
        handle.remove()
    for name, prompt in prompts.items():
        maps, out = seen[name]
        with torch.no_grad(), ap.capture(model) as alone:
            model(input_ids=out[:, :-1])
        assert len(maps) == 1 and maps[0].prompt_length == prompt.shape[1]
        assert maps[0].shape == alone.maps[0].shape
        assert (maps[0].pattern - alone.maps[0].pattern).abs().max() <= 1e-6
    assert count_hooks(model) == 0 and implementations(model) == {"sdpa"}


@pytest.mark.parametrize("family, gated", [("gpt2", ""), ("bloom", "h.0.self_attention")])
def test_a_capture_closed_while_another_forward_runs_its_pre_hooks(family, gated):
    """torch copies a module's pre-hooks before calling them and asks per hook whether it
    takes kwargs: a capture that closes in between (here while thread B waits in a pre-hook
    registered ahead of the capture's) leaves B calling the capture's hook without kwargs.
    B's forward runs on, unchanged, and A keeps the maps of its own forward."""
    from tests.integration import legacy_models

    if family == "bloom":  # its attention modules compute their own weights: module seam
        model, _ = legacy_models.build_pair(family)
        inputs = legacy_models.padded(family)
    else:
        model = build(family)
        inputs = batch(family)
    with torch.no_grad():
        plain = model(**inputs).last_hidden_state
    a_open, b_inside, a_closed = threading.Event(), threading.Event(), threading.Event()
    outcome = {}

    def gate(module, args):
        if threading.get_ident() == outcome.get("b thread"):
            b_inside.set()
            a_closed.wait(WAIT)

    def run_a():
        try:
            with torch.no_grad(), ap.capture(model) as cap:
                model(**inputs)
                a_open.set()
                b_inside.wait(WAIT)
            outcome["a"] = cap
        finally:
            a_open.set()
            a_closed.set()

    def run_b():
        outcome["b thread"] = threading.get_ident()
        a_open.wait(WAIT)
        with torch.no_grad():
            outcome["b"] = model(**inputs).last_hidden_state

    handle = model.get_submodule(gated).register_forward_pre_hook(gate, prepend=True)
    try:
        assert _run(run_a, run_b) == []
    finally:
        handle.remove()
    assert torch.equal(outcome["b"], plain)
    assert len(outcome["a"].maps) == len(inputs["input_ids"])
    assert count_hooks(model) == 0
