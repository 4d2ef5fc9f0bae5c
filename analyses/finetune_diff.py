"""What does fine-tuning change in MiniLM's attention? A checkpoint diff, head by head.

Kovaleva et al. (2019 §4.3) fine-tuned BERT on GLUE tasks and compared each head's attention
before and after (cosine similarity of the flattened maps, averaged over dev examples): the
last two layers changed most (all tasks but QQP). This script repeats the question on
all-MiniLM-L6-v2 (6 layers x 12 heads) with :func:`attnprobe.heads.diff`.

Task (built from ``data/census_sentences.txt``, nothing downloaded): **word order** — is a
sentence as written (label 1) or are its words shuffled (label 0; a final ``.``/``?``/``!``
stays at the end, the model is uncased, so no capital or full stop gives it away)? The first
``n_train`` sentences, each in both versions, train MiniLM with a linear head on its
mean-pooled output (Adam, ``lr``, ``steps`` minibatches of ``batch_size``, seeded dropout and
order: :func:`attnprobe.tasks.classification.train_classifier`; the word-embedding table is
frozen, every attention and feed-forward weight trains). The next ``n_eval`` sentences,
never trained on, give the held-out accuracy (both versions) and are the diff's corpus (as
written). The fine-tuned encoder stays in memory; nothing is saved.

The diff runs the head census on both checkpoints (labels, every score, syntax from the spaCy
parse when ``syntax``) and both models side by side on the same batches: per head the mean
Jensen–Shannon divergence between their attention rows (nats, at most ln 2) and Kovaleva's
cosine.

Tables (``runs/finetune_diff/<stamp>/``): ``training`` (steps, seconds, loss, accuracy before
and after), ``layers`` (per layer: mean JS and its rank, most changed head, mean cosine and
1 − cosine, labels changed), ``heads`` (every head: labels before/after, JS, cosine, every
score change), ``label_changes`` (the heads whose label changed), ``scores`` (long form:
score, a, b, change), ``verdict`` (does the last-layers claim hold, by JS and by cosine) and
``summary``. Figures: ``layer_js.png`` (mean JS per layer with every head), ``head_js.png``
(layer x head heatmap of JS).

Run: ``python analyses/finetune_diff.py [--smoke] [--out DIR]`` (training takes about 2 CPU
seconds a step, so about 4 minutes on 2 free cores; ``--smoke``: a tiny random BERT with
MiniLM's tokenizer, a few steps, seconds).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from harness.runs import analysis_main
from torch import nn

import attnprobe
from attnprobe.core.lines import split_lines
from attnprobe.heads.checkpoint_diff import diff
from attnprobe.tasks.classification import accuracy, train_classifier
from attnprobe.tasks.keytoken import KeyTokenData

DATA = Path(__file__).resolve().parent / "data"
CLAIM = "fine-tuning changes the last two layers most (Kovaleva et al. 2019 §4.3)"


@dataclass
class Config:
    model: str = "minilm"  # or "tiny-bert": a random 2 x 2 BERT with MiniLM's tokenizer
    corpus: str = "census_sentences.txt"  # under analyses/data/
    n_train: int = 800  # sentences to train on (each as written and shuffled)
    n_eval: int = 200  # held-out sentences: accuracy and the diff's corpus
    steps: int = 150  # 150 x 16 = 2,400 examples, 1.5 passes over the 1,600
    batch_size: int = 16
    lr: float = 5e-5
    seed: int = 0
    diff_batch_size: int = 32
    syntax: bool = True  # parse the diff corpus so syntax scores and labels are compared

    @classmethod
    def smoke(cls) -> Config:
        return cls(model="tiny-bert", n_train=16, n_eval=8, steps=3, batch_size=8, lr=1e-3,
                   syntax=False)


class MeanPooledClassifier(nn.Module):
    """An encoder with a linear head on its attention-masked mean output (MiniLM's pooling)."""

    def __init__(self, encoder: nn.Module, n_classes: int = 2) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.config.hidden_size, n_classes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
        mask = attention_mask[..., None].to(hidden.dtype)
        return self.head((hidden * mask).sum(1) / mask.sum(1).clamp(min=1))


def load(cfg: Config) -> tuple[nn.Module, object]:
    if cfg.model != "tiny-bert":
        return attnprobe.load_model(cfg.model)
    import transformers

    from attnprobe.loading import minilm_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(cfg.seed)
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32,
                                     num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=128)
    return transformers.BertModel(config).eval(), tokenizer


def shuffled(sentence: str, generator: torch.Generator) -> str:
    """The words in another order (a final . ? ! stays at the end)."""
    words = sentence.split()
    mark = ""
    if words and words[-1][-1:] in ".?!" and len(words[-1]) > 1:
        words[-1], mark = words[-1][:-1], words[-1][-1]
    for _ in range(10):  # a draw that leaves the order unchanged is drawn again
        order = torch.randperm(len(words), generator=generator).tolist()
        if order != sorted(order):
            break
    return " ".join(words[i] for i in order) + mark


def word_order_task(sentences: list[str], seed: int) -> KeyTokenData:
    """Each sentence as written (label 1) and shuffled (label 0), interleaved."""
    generator = torch.Generator().manual_seed(seed)
    texts, labels = [], []
    for sentence in sentences:
        texts += [sentence, shuffled(sentence, generator)]
        labels += [1, 0]
    return KeyTokenData(task="word_order", texts=texts, labels=torch.tensor(labels),
                        decisive=[torch.zeros(len(t.split()), dtype=torch.bool) for t in texts],
                        vocab=())


def _sentences(cfg: Config) -> tuple[list[str], list[str]]:
    lines = [line.strip() for line in split_lines((DATA / cfg.corpus).read_text(encoding="utf-8"))]
    texts = [line for line in lines if len(line.split()) >= 3]
    if len(texts) < cfg.n_train + cfg.n_eval:
        raise ValueError(f"{cfg.corpus} has {len(texts)} sentences of 3+ words, fewer than "
                         f"{cfg.n_train + cfg.n_eval}")
    return texts[:cfg.n_train], texts[cfg.n_train:cfg.n_train + cfg.n_eval]


def fine_tune(cfg: Config, base: nn.Module, tokenizer: object, train: KeyTokenData,
              held_out: KeyTokenData) -> tuple[nn.Module, dict]:
    """A fine-tuned copy of ``base`` (left untouched) and the training record."""
    torch.manual_seed(cfg.seed)  # the head's initial weights
    classifier = MeanPooledClassifier(copy.deepcopy(base))
    classifier.encoder.get_input_embeddings().weight.requires_grad_(False)
    before = accuracy(classifier, tokenizer, held_out)
    result = train_classifier(classifier, tokenizer, train, steps=cfg.steps,
                              batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed,
                              held_out=held_out)
    record = {"task": "word_order", "train_examples": len(train),
              "held_out_examples": len(held_out), "steps": result["steps"],
              "seconds": round(result["seconds"], 2), "final_loss": result["final_loss"],
              "train_accuracy": result["train_accuracy"],
              "held_out_accuracy_before": before,
              "held_out_accuracy_after": result["held_out_accuracy"]}
    return classifier.encoder.eval(), record


def verdict(layers: pd.DataFrame) -> pd.DataFrame:
    """Is the change largest in the last two layers, by JS and by Kovaleva's 1 − cosine?"""
    last_two = sorted(layers["layer"])[-2:]
    rows = []
    for measure in ("js", "one_minus_cosine"):
        ranked = layers.sort_values(measure, ascending=False, kind="stable")["layer"].tolist()
        share = layers.loc[layers["layer"].isin(last_two), measure].sum() / \
            max(layers[measure].sum(), 1e-300)
        rows.append({"claim": CLAIM, "measure": measure,
                     "layers_by_change": " > ".join(str(x) for x in ranked),
                     "last_two_share": share, "equal_share": len(last_two) / len(layers),
                     "holds": set(ranked[:2]) == set(last_two)})
    return pd.DataFrame(rows)


def run(cfg: Config) -> dict[str, pd.DataFrame]:
    """Fine-tune, diff before vs after, build every table (nothing is printed)."""
    start = time.perf_counter()
    base, tokenizer = load(cfg)
    train_sentences, eval_sentences = _sentences(cfg)
    train = word_order_task(train_sentences, cfg.seed + 1)
    held_out = word_order_task(eval_sentences, cfg.seed + 2)
    tuned, record = fine_tune(cfg, base, tokenizer, train, held_out)
    diff_start = time.perf_counter()
    result = diff(base, tuned, tokenizer, eval_sentences, batch_size=cfg.diff_batch_size,
                  seed=cfg.seed, syntax=cfg.syntax)
    diff_s = time.perf_counter() - diff_start
    heads = result.heads()
    layers = result.layers()
    layers["one_minus_cosine"] = 1 - layers["cosine"]
    changed = heads.loc[heads["label_changed"], ["head_id", "label_a", "label_b", "js",
                                                 "cosine"]].reset_index(drop=True)
    summary = pd.DataFrame([
        {"item": "model", "value": cfg.model},
        {"item": "diff sentences (held out, as written)", "value": result.n_sentences},
        {"item": "heads", "value": len(heads)},
        {"item": "mean JS over heads (nats)", "value": float(heads["js"].mean())},
        {"item": "most changed head", "value": heads.loc[heads["js"].idxmax(), "head_id"]},
        {"item": "labels changed", "value": int(heads["label_changed"].sum())},
        {"item": "training seconds", "value": record["seconds"]},
        {"item": "diff seconds", "value": round(diff_s, 2)},
        {"item": "total seconds", "value": round(time.perf_counter() - start, 2)},
    ])
    return {"training": pd.DataFrame([record]), "layers": layers, "verdict": verdict(layers),
            "label_changes": changed, "heads": heads, "scores": result.scores(),
            "summary": summary}


# ----------------------------------------------------------------------------------- plots
def plot(tables: dict[str, pd.DataFrame], path: Path) -> list[Path]:
    """``layer_js.png``: mean JS per layer (bars) with every head (dots) and 1 − cosine;
    ``head_js.png``: layer x head heatmap of JS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    heads, layers = tables["heads"], tables["layers"]
    written = []
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    ax.bar(layers["layer"], layers["js"], color="tab:blue", alpha=0.6, label="mean JS")
    ax.scatter(heads["layer"], heads["js"], color="black", s=10, zorder=3, label="one head")
    for row in layers.itertuples():
        ax.annotate(f"{row.label_changed}/{row.n_heads}", (row.layer, row.js_top),
                    xytext=(0, 4), textcoords="offset points", ha="center", fontsize=7)
    ax.set_xlabel("layer")
    ax.set_ylabel("Jensen–Shannon divergence (nats)")
    ax.set_xticks(layers["layer"])
    twin = ax.twinx()
    twin.plot(layers["layer"], layers["one_minus_cosine"], "r--o", label="1 − cosine (Kovaleva)")
    twin.set_ylabel("1 − cosine", color="tab:red")
    ax.set_ylim(0, 1.35 * max(heads["js"].max(), 1e-12))
    twin.set_ylim(0, 1.35 * max(layers["one_minus_cosine"].max(), 1e-12))
    handles, names = ax.get_legend_handles_labels()
    more, more_names = twin.get_legend_handles_labels()
    ax.legend(handles + more, names + more_names, fontsize=8, loc="upper center", ncol=3)
    ax.set_title("Attention change after fine-tuning, per layer (labels changed / heads)")
    fig.tight_layout()
    written.append(path / "layer_js.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    grid = heads.pivot(index="layer", columns="head", values="js").sort_index()
    fig, ax = plt.subplots(figsize=(1.2 + 0.65 * grid.shape[1], 1.0 + 0.55 * grid.shape[0]))
    sns.heatmap(grid, ax=ax, annot=True, fmt=".3f", annot_kws={"fontsize": 6}, cmap="viridis",
                vmin=0, cbar_kws={"label": "JS (nats)"})
    ax.set_title("Attention change per head (mean JS over query rows)")
    fig.tight_layout()
    written.append(path / "head_js.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> None:
    analysis_main("finetune_diff", __doc__, Config, run, plot, argv,
                  show=["training", "layers", "verdict", "label_changes", "summary"])


if __name__ == "__main__":
    main()
