"""``logit:T``, ``prob:T``, ``logprob:T`` (and ``:next``): one token's logit, probability or
log-probability at the chosen positions."""

from __future__ import annotations

from attnprobe.core.metric_build import reading
from attnprobe.core.metric_kind import MetricKind, metric_kind

RANK = 10

_WHAT = {"logit": "logit", "prob": "probability (softmax over the vocabulary)",
         "logprob": "log-probability"}


def _reads_next(argument: str) -> bool:
    return argument.strip() == "next"


for _rank, (_how, _what) in enumerate(_WHAT.items()):
    metric_kind(MetricKind(
        _how, reading(_how), forms=(f"{_how}:T", f"{_how}:next"),
        help=f"token T's {_what} (T a word, a vocabulary string or an id); {_how}:next the "
             "same for the input's own next token (positions whose next token is real)",
        example=f"{_how}:t05", rank=RANK + _rank, reads_next=_reads_next))
