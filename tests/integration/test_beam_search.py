"""Beam search reorders its hypotheses between decoding steps, so the rows of the captured
steps are no sequences: the maps are refused with one line (greedy and sampled decoding of
the same models still give maps)."""

from __future__ import annotations

import pytest
import torch

import attnprobe as ap
from tests.integration.causal_lms import causal_lm


@pytest.mark.parametrize("name", ["gpt2", "llama", "mistral"])  # mistral: a sliding window
def test_maps_of_beam_search_are_refused(name):
    model, tok = causal_lm(name)
    prompt = tok(["w5 w6 w7 w8 w9"], return_tensors="pt")
    with torch.no_grad(), ap.capture(model) as cap:
        model.generate(**prompt, max_new_tokens=6, num_beams=3, num_return_sequences=3,
                       do_sample=False)
    with pytest.raises(ap.InputError, match="beam search") as err:
        cap.maps  # noqa: B018 - maps are built on first read
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["gpt2", "mistral"])
def test_greedy_decoding_of_a_padded_batch_is_not_taken_for_beams(name):
    model, tok = causal_lm(name)
    tok.padding_side = "left"
    prompt = tok(["w5 w6 w7 w8 w9 w10", "w11 w12"], return_tensors="pt", padding=True)
    with torch.no_grad(), ap.capture(model) as cap:
        out = model.generate(**prompt, max_new_tokens=6, do_sample=False)
    assert len(cap.maps) == 2
    assert all(amap.prompt_length is not None for amap in cap.maps)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 6
