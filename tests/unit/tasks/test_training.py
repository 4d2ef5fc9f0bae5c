import torch

from attnprobe.models.seq2seq import Seq2Seq, Seq2SeqConfig
from attnprobe.tasks import make_batch
from attnprobe.tasks.synthetic import EOS
from attnprobe.tasks.training import decode_scores, strip_eos, train_seq2seq


class Oracle(torch.nn.Module):
    """Generates a fixed answer: the references, or a corrupted copy of them."""

    def __init__(self, answer):
        super().__init__()
        self.answer = answer

    def generate(self, source, mask, *, max_new_tokens, bos_id, eos_id):
        return self.answer


def test_decode_scores_by_construction():
    batch = make_batch("copy", 4, min_len=4, max_len=6, seed=3)
    perfect = decode_scores(Oracle(batch.labels), batch, max_new_tokens=10)
    assert perfect == {"bleu": 100.0, "sequence_accuracy": 1.0, "token_accuracy": 1.0}
    wrong = batch.labels.clone()
    wrong[0, 0] = 31 if wrong[0, 0] != 31 else 30
    scores = decode_scores(Oracle(wrong), batch, max_new_tokens=10)
    assert scores["sequence_accuracy"] == 0.75
    n_tokens = int((batch.labels != 0).sum()) - 4  # EOS excluded
    assert scores["token_accuracy"] == (n_tokens - 1) / n_tokens
    assert strip_eos([5, 6, EOS, 7]) == [5, 6]


def test_training_lowers_the_loss():
    torch.manual_seed(0)
    model = Seq2Seq(Seq2SeqConfig(vocab_size=12, d_embed=8, d_hidden=16, attention="bahdanau"))
    curve = train_seq2seq(model, lambda step: make_batch("copy", 16, min_len=3, max_len=4,
                                                         vocab_size=12, seed=step),
                          steps=150, lr=2e-2, log_every=50)
    assert [p["step"] for p in curve] == [50, 100, 150]
    assert curve[-1]["loss"] < 0.5 * curve[0]["loss"]
    assert not model.training
