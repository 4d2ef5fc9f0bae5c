"""The metric vocabulary on hand-made logits: every expected number is computed here by
indexing the logits directly (or with torch's own cross-entropy), never by the module."""

from __future__ import annotations

import pytest
import torch

from attnprobe.core.metric import Metric, parse_metric, positions_mask
from attnprobe.errors import InputError
from tests.integration.causal_lms import word_tokenizer

VOCAB = 100
LOGITS = torch.randn(2, 5, VOCAB, generator=torch.Generator().manual_seed(0))
IDS = torch.tensor([[0, 0, 7, 8, 9], [4, 5, 6, 7, 8]])  # example 0 is left-padded
MASK = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
BATCH = {"input_ids": IDS, "attention_mask": MASK}
TOK = word_tokenizer(bos=True)  # words w4 .. w99 have ids 4 .. 99


class Output:
    logits = LOGITS


def test_a_token_logit_is_read_at_the_last_real_position():
    value = parse_metric("logit:w42", TOK)(Output(), BATCH)
    torch.testing.assert_close(value, LOGITS[:, 4, 42])
    by_id = parse_metric("logit:42")(Output(), BATCH)
    torch.testing.assert_close(by_id, value)


def test_probabilities_and_log_probabilities():
    prob = parse_metric("prob:w42", TOK)(Output(), BATCH)
    torch.testing.assert_close(prob, LOGITS[:, 4].softmax(-1)[:, 42])
    logprob = parse_metric("logprob:w42", TOK)(Output(), BATCH)
    torch.testing.assert_close(logprob, LOGITS[:, 4].log_softmax(-1)[:, 42])


def test_logit_difference_and_its_terms_sum_to_it():
    metric = parse_metric("logit_diff:w42,w7", TOK)
    value = metric(Output(), BATCH)
    torch.testing.assert_close(value, LOGITS[:, 4, 42] - LOGITS[:, 4, 7])
    terms = metric.logit_terms(BATCH)
    rebuilt = torch.zeros(2).index_add(
        0, terms.example, terms.coeff * LOGITS[terms.example, terms.position, terms.token])
    torch.testing.assert_close(rebuilt, value)


def test_one_pair_per_example():
    metric = parse_metric("logit_diff", TOK, pairs=[("w42", "w7"), (10, 11)])
    torch.testing.assert_close(metric(Output(), BATCH), torch.stack(
        [LOGITS[0, 4, 42] - LOGITS[0, 4, 7], LOGITS[1, 4, 10] - LOGITS[1, 4, 11]]))


def test_next_token_metrics_read_the_input_own_next_token():
    """Example 0's real tokens sit at slots 2..4: positions 0 and 1 predict slots 3 and 4."""
    value = parse_metric("logit:next", positions="all")(Output(), BATCH)
    want0 = (LOGITS[0, 2, 8] + LOGITS[0, 3, 9]) / 2
    want1 = sum(LOGITS[1, p, IDS[1, p + 1]] for p in range(4)) / 4
    torch.testing.assert_close(value, torch.stack([want0, want1]))
    loss = parse_metric("loss")(Output(), BATCH)
    ce1 = torch.nn.functional.cross_entropy(LOGITS[1, :4], IDS[1, 1:])
    ce0 = torch.nn.functional.cross_entropy(LOGITS[0, 2:4], IDS[0, 3:])
    torch.testing.assert_close(loss, torch.stack([ce0, ce1]))


def test_chosen_positions_count_real_tokens():
    value = parse_metric("logit:w42", TOK, positions=[0, -1])(Output(), BATCH)
    torch.testing.assert_close(value, torch.stack([(LOGITS[0, 2, 42] + LOGITS[0, 4, 42]) / 2,
                                                   (LOGITS[1, 0, 42] + LOGITS[1, 4, 42]) / 2]))
    per_example = parse_metric("logit:42", positions=[[1], [3]])(Output(), BATCH)
    torch.testing.assert_close(per_example, torch.stack([LOGITS[0, 3, 42], LOGITS[1, 3, 42]]))


def test_next_token_is_fixed_on_the_reference_run():
    metric = parse_metric("next-token")
    assert not metric.ready
    with pytest.raises(InputError, match="not fixed yet"):
        metric(Output(), BATCH)
    fixed = metric.fixed(Output(), BATCH)
    top = LOGITS[:, 4].argmax(-1)
    torch.testing.assert_close(fixed(Output(), BATCH), LOGITS[[0, 1], 4, top])
    shifted = type("Shifted", (), {"logits": LOGITS + 1.0})()
    torch.testing.assert_close(fixed(shifted, BATCH), LOGITS[[0, 1], 4, top] + 1.0)


def test_a_callable_is_a_custom_metric():
    metric = parse_metric(lambda output, batch: output.logits[:, 0, 0])
    assert metric.spec == "custom" and not metric.linear
    torch.testing.assert_close(metric(Output(), BATCH), LOGITS[:, 0, 0])
    with pytest.raises(InputError, match="not a sum of logits"):
        metric.logit_terms(BATCH)


@pytest.mark.parametrize(("spec", "kwargs", "match"), [
    ("logit_dif:a,b", {}, "metric kind"),
    ("logit_diff:w42", {}, "needs two tokens"),
    ("logit:w42 w43", {"tokenizer": TOK}, "is 2 tokens, not one"),
    ("logit:", {}, "needs a token"),
    ("logit:w42", {}, "pass a tokenizer or an id"),
    ("logit:next", {}, "has no next token"),
    ("logit:5", {"positions": [9]}, "out of range"),
    ("logit:5", {"positions": "middle"}, "positions"),
    ("loss:x", {}, "takes no argument"),
])
def test_bad_metrics_are_one_line_errors(spec, kwargs, match):
    with pytest.raises(InputError, match=match) as err:
        parse_metric(spec, kwargs.pop("tokenizer", None), **kwargs)(Output(), BATCH)
    assert "\n" not in str(err.value)


def test_a_metric_must_return_one_number_per_example():
    with pytest.raises(InputError, match="one number per example"):
        Metric("custom", lambda output, batch: output.logits[:, :, 0])(Output(), BATCH)


def test_positions_mask_skips_padding():
    mask = positions_mask("last", BATCH)
    assert mask.tolist() == [[False] * 4 + [True], [False] * 4 + [True]]
    assert positions_mask("all", BATCH, needs_next=True)[0].tolist() == [False, False, True,
                                                                          True, False]
