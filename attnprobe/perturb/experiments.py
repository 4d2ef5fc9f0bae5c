"""Perturbation experiments as tidy tables: ``run(model, tokenizer, texts, experiment)``.

Every experiment is one function and one parameter dataclass registered together in
:data:`EXPERIMENTS` (:func:`~attnprobe.perturb.job.register_experiment`); the dataclass is
the one place its options live: it checks them in :func:`run`, makes the flags of
``attnprobe perturb`` and fills the parameter columns. Every experiment returns the columns
:data:`RUN_COLUMNS` first, so tables concatenate over experiments, models and runs.

The experiments — :data:`EXPERIMENTS`, discovered from the modules of :mod:`attnprobe.perturb`
(each declares ``RANK`` and registers itself with a one-line summary) — with their options and
defaults are listed by ``attnprobe perturb --help`` and by the README's generated table
(``make readme``); the module that registers an experiment documents it (``permute`` and
``dirichlet`` in :mod:`~attnprobe.perturb.draws`, ``uniform``, ``ablate`` and ``mean`` in
:mod:`~attnprobe.perturb.edits` ...), and :func:`params_of` gives its parameter dataclass.

**Metric** (``metric=``, :mod:`attnprobe.perturb.scoring`): ``"next-token"`` (default) is the
distributional change of the output each experiment reports below (``tvd``, ``jsd``,
``flip``, ``top_prob``; ``cosine_distance``, ``l2_distance`` for embeddings). Any other spec
of the one metric vocabulary (:mod:`attnprobe.core.metric`: ``logit:T``, ``prob:T``,
``logprob:T``, ``logit_diff:A,B``, ``loss``, ``logit:next`` ..., ``next-token:ID``) or a
callable ``(output, batch) -> Tensor[batch]`` is read on the unperturbed and the perturbed
output of each example: ``metric`` is the spec, ``baseline`` / ``perturbed`` its values,
``change`` their difference, ``positions`` (``positions=``; default the last real token,
every position for ``loss``) where it was read. Which experiments take one is
:func:`reads_metric` (the README's table marks them; the random draws give one row per
``summary``: median, mean, min, max over the draws); the others measure something else and
refuse it.

**Shared options** (keywords of :func:`run`, the same for every experiment): ``scope``,
``batch_size`` (rows per forward, default 16: texts, texts × heads in a sweep, or what the
experiment's module says: draws of one text for the random draws, erasure steps of one text
for ``erase``), ``truncation``, ``max_length``, ``seed``, ``progress``, ``distributed`` (the
corpus options: one :class:`~attnprobe.core.corpus_options.CorpusOptions` or its keywords),
``output``, ``target``, ``metric``, ``positions`` and ``sweep`` (below).

**Columns** (:mod:`attnprobe.perturb.table` documents each): :data:`RUN_COLUMNS` —
``experiment``, ``perturbation``, ``scope`` (the heads the row's perturbation acted on),
``layer`` and ``head`` (integers when it acted on one layer / one head, else ``<NA>``),
``example_id`` (the text's index in the caller's list, as a string; ``"all"`` for rows about
the whole corpus), ``step`` (keys erased by ``erase``, heads pruned by ``importance``;
``<NA>`` for experiments without steps), ``metric``, ``baseline`` (the metric without the
perturbation), ``perturbed`` (with it) and ``change = perturbed − baseline`` — then one
column per parameter: the experiment's options, the seed when it draws, and what is
particular to the row. Distances and scores of the perturbation itself (``tvd``, ``jsd``,
``flip``, ``cosine_distance``, ``importance`` ...) have ``baseline = 0``, so
``change == perturbed``.

**Sweeps** (``sweep="head"`` or ``"layer"``; the experiments registered with ``sweeps=True``,
:attr:`~attnprobe.core.experiments.Experiment.sweeps`): every
head (every layer's scoped heads) of ``scope`` perturbed *alone*, the text batch repeated once
per head in one forward (:mod:`attnprobe.perturb.sweeps`); one row per head, text and metric,
equal to the rows of a run with ``scope="head:L.H"`` up to float rounding.
``batch_size`` is then the rows of a forward (texts × heads).

**Outputs** (``output=``): ``"classifier"``, ``"lm"``, ``"embedding"`` or ``"auto"``; what each
reads and which metrics it reports is in :mod:`attnprobe.perturb.readout`.

**Each forward goes through the capture seam** (:func:`attnprobe.capture`), the unperturbed
one too, so baseline and perturbed outputs come from the same attention implementation and a
model whose attention cannot be reached fails at once: ``AttentionUnavailableError`` (no hook
points, a transformers model that bypasses AttentionInterface) or ``HookNotFiredError`` (a
scoped layer never ran), with the experiment named in the message. An edit that changed no
weight is ``EditNotAppliedError`` for ``uniform``/``ablate``/``mean``/``erase``. The
exception is ``permute`` (and ``dirichlet``): permuting a uniform row, or a row whose weight
sits on one key, is an identity, and "the output does not care" is then the measurement, so
such an example reports exactly zero change (the seam demonstrably ran: otherwise one of the
errors above is raised).

**Memory** is estimated before the first forward (:mod:`attnprobe.perturb.budget`); a run
beyond the budget is an InputError that says which option to lower, and to what.

**Reproducible from ``seed``, on one process or many.** Draw ``j`` of text ``i`` uses its own
CPU generator seeded from ``(seed, i, j)``, ``i`` the text's index in the caller's list: the
same call gives the same table, and neither batching (``batch_size``) nor splitting the texts
over the ranks of a ``torch.distributed`` group changes any draw. Split runs return the
single-process table on every rank; corpus quantities (``mean``'s head means,
``importance``'s gradients and curve) are summed per batch and added in batch order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pandas as pd
import torch
from torch import nn

from attnprobe.capture import capture
from attnprobe.capture.info import attention_sizes, model_scope
from attnprobe.core.corpus_options import CorpusOptions
from attnprobe.core.distributed import rank_and_world
from attnprobe.errors import InputError
from attnprobe.inputs.text import prepare_corpus
from attnprobe.inputs.token_ids import check_inputs
from attnprobe.perturb.budget import Footprint, check_budget
from attnprobe.perturb.job import (
    CORPUS,
    EXPERIMENTS,
    RUN_COLUMNS,
    SWEEPS,
    Experiment,
    Job,
    named_errors,
)
from attnprobe.perturb.params import SHARED
from attnprobe.perturb.readout import OUTPUTS, OutputChoice, Reader, pick_reader
from attnprobe.perturb.run_checks import (
    check_metric,
    check_model,
    check_sweep,
    check_target,
    experiment_named,
    longest_tokens,
    option_names,
    params_of,
    reads_metric,
    reads_target,
)
from attnprobe.perturb.scoring import DEFAULT_METRIC, scalar_metric
from attnprobe.perturb.sweeps import forward_rows, sweep_units
from attnprobe.perturb.table import tidy

__all__ = ["CORPUS", "EXPERIMENTS", "OUTPUTS", "RUN_COLUMNS", "SHARED", "SWEEPS", "Experiment",
           "knockout", "params_of", "reads_metric", "reads_target", "run"]


def run(model: nn.Module, tokenizer: Any, texts: Sequence[str] | str, experiment: str, *,
        corpus: CorpusOptions | None = None, output: OutputChoice = "auto", target: Any = None,
        metric: Any = DEFAULT_METRIC, positions: Any = None, sweep: str | None = None,
        **keywords: Any) -> pd.DataFrame:
    """Run one perturbation experiment over ``texts`` and return a tidy table.

    The corpus options (``scope``, ``batch_size``, ``truncation``, ``seed``, ``progress``,
    ``max_length``, ``distributed``) come as one ``corpus=``
    :class:`~attnprobe.core.corpus_options.CorpusOptions` or as keywords; the other
    keywords are the experiment's own options.

    What the corpus options mean here:

    - ``scope``: which heads are perturbed, in the scope language (``"all"``, ``"layer:3"``,
      ``"heads:0.2,1.8"``, ``"L3H5"`` ...) or a :class:`~attnprobe.core.scope.Scope`.
    - ``batch_size``: rows per forward (default 16; module docstring). Part of the shared
      signature: ``adversarial`` optimises its ``n_adversaries`` as one batch instead.
    - ``truncation``: ``"error"`` (default), ``"cut"`` or ``"skip"`` for texts longer than the
      model allows (skipped texts keep their index out of ``example_id``).
    - ``seed``: seeds every random choice (permutations, draws, the random erasure order,
      adversary initialisations); the same call gives the same table. ``uniform``,
      ``ablate``, ``mean`` and ``importance`` draw nothing (their table has no
      ``seed`` column).
    - ``progress``: a progress bar (tqdm) over the texts or batches (over the draws for
      ``permute`` / ``dirichlet``, with the time left).
    - ``max_length``: a cap on tokens per text below the model's own limit (``truncation``
      says what happens to longer texts).
    - ``distributed``: split the texts over the ranks of an initialised ``torch.distributed``
      group and return the single-process table on every rank (default: when a group
      is initialised; ``True`` without one is an error).

    Args:
        model / tokenizer: an attnprobe reference model or a transformers model (any
            attention backend), in eval mode, and its tokenizer.
        texts: the examples (one row group per text; ``example_id`` is the index).
        experiment: a name in :data:`EXPERIMENTS` (see the module docstring).
        sweep: ``"head"``: each head of ``scope`` perturbed alone, one row per head, text
            and metric; ``"layer"``: each layer's scoped heads together (``uniform``,
            ``ablate``, ``mean``; batched, module docstring). Default: the whole scope at
            once.
        output: ``"auto"``, ``"classifier"``, ``"lm"`` or ``"embedding"`` (module docstring).
        target: ``erase``: what the attribution ranking explains (default: the predicted
            class ``class:K``, ``next-token``, or ``similarity:<the text itself>`` for
            embedding models); ``importance``: the loss is ``−target`` (default: the
            cross-entropy of the model's own prediction; embedding models need
            ``similarity:TEXT``). A spec such as ``"class:1"``, a Target or a callable.
            The other experiments (and ``erase`` with only the ``attention`` / ``random``
            rankings) measure the whole output and refuse a target
            (:func:`reads_target`).
        metric: what is measured: ``"next-token"`` (default: the output's distributional
            change, as ``output`` reads it), any spec of :mod:`attnprobe.core.metric`
            (``"logit_diff:Paris,Rome"``, ``"loss"``, ``"logit:next"`` ...), a ready
            ``Metric`` or a callable ``(output, batch) -> Tensor[batch]`` (module
            docstring; :func:`reads_metric` says which experiments take one).
        positions: where a metric spec reads: ``"last"`` (default; ``"all"`` for
            ``loss``), ``"all"``, a list of positions, or one list per text of ``texts``
            (positions count real tokens; negative from the end).
        corpus: the corpus options as one object (keywords of the same names override it);
            ``budget`` is refused (the memory budget is estimated, module docstring).
        **keywords: the corpus options above, and the experiment's own options, its
            parameter dataclass's fields
            (:func:`params_of`; the module docstring lists them), e.g. ``n_permutations=20``
            for ``permute`` or ``eps=0.05`` for ``adversarial``.

    Returns:
        A DataFrame with columns :data:`RUN_COLUMNS` (see the module docstring for each
        experiment's metrics).

    Raises:
        InputError: unknown experiment, an option the experiment does not take or out of
            its bounds, an option or a target that would change nothing (``n_steps``
            without an Integrated Gradients ranking, a target for an experiment that reads
            none), a sweep the experiment does not run, empty texts, a bad scope or one
            out of range, a model in training mode, an output the model does not give, a run
            beyond the memory budget.
        AttentionUnavailableError / HookNotFiredError: the model's attention cannot be
            reached through the capture seam (the experiment and example are named).
        EditNotAppliedError: a deterministic perturbation changed no weight (not raised by
            permute / dirichlet, which report zero change).

    Example:
        >>> model, tok = ap.load_model("ref:bilstm-classifier")
        >>> table = ap.perturb.run(model, tok, ["the cat sat on the red mat"], "permute",
        ...                        n_permutations=20)
        >>> table.pivot(index="example_id", columns="metric", values="perturbed")
        >>> ablated = ap.perturb.run(model, tok, texts, "ablate", sweep="head")
        >>> ablated[ablated.metric == "tvd"].pivot_table("change", "layer", "head")
    """
    given, options = CorpusOptions.split(keywords)
    corpus = CorpusOptions.merged(corpus, given)
    if corpus.budget is not None:
        raise InputError("perturb.run takes no budget: the memory a run needs is estimated "
                         "before the first forward (lower batch_size instead)")
    spec = experiment_named(experiment)
    params = spec.params.build(spec.name, options)
    missing = params.missing()
    if missing is not None:
        raise InputError(missing)
    check_sweep(spec, sweep)
    batch_size, mode, max_length = corpus.batch(), corpus.truncation_mode, corpus.max_length
    check_model(model, output)
    rank_and_world(corpus.distributed)  # distributed=True without a process group fails here
    check_target(spec.name, params, target)
    texts = check_inputs(texts)  # None, a number ...: the one-line error every entry point gives
    scalar = scalar_metric(metric, tokenizer, positions, len(texts))
    check_metric(spec.name, params, output, scalar)
    prepared = prepare_corpus(model, tokenizer, texts, truncation=mode, max_length=max_length)
    scope = model_scope(model, corpus.scope)
    seq = longest_tokens(model, tokenizer, prepared.texts, mode, max_length)
    need = params.footprint(batch_size, len(prepared.texts), seq)
    if sweep is not None:  # the text batch repeated once per head: b texts x c heads rows
        n_units = len(sweep_units(scope, *attention_sizes(model), sweep))
        texts_per, units_per = forward_rows(batch_size, len(prepared.texts), n_units)
        need = Footprint(texts_per * units_per)
    check_budget(model, spec.name, need, seq, option_names(spec.params))
    job = Job(spec.name, model, tokenizer, prepared.texts, tuple(int(i) for i in prepared.ids),
              scope, Reader("classifier"), params, corpus.seed, target, batch_size,
              "cut" if mode == "cut" else "error", max_length, corpus.progress,
              corpus.distributed, sweep, scalar)
    first = job.encode(prepared.texts[:1])
    with named_errors(job, "unperturbed forward"), torch.no_grad(), \
            capture(model, scope, parts=[]):
        first_output = model(**first)
    if scalar is None:
        reader = pick_reader(model, output, first_output)
        reader(first_output, first)  # a clear error now when the output does not fit the kind
        job = replace(job, reader=reader)
    else:  # a clear error now when the metric cannot read this model's output
        scalar.read(first_output, first, job.ids[:1])
    rows = spec.fn(job)
    table = tidy(spec.name, rows, *attention_sizes(model))
    if scalar is not None:  # the ids of the tokens the metric column names
        table.attrs["metric_ids"] = scalar.metric.token_ids
    return table


def knockout(model: nn.Module, tokenizer: Any, texts: Sequence[str] | str, edges: Any, *,
             corpus: CorpusOptions | None = None, metric: Any = DEFAULT_METRIC,
             positions: Any = None, sweep: str | None = None,
             **keywords: Any) -> pd.DataFrame:
    """Attention knockout (Geva et al. 2023): ``edges`` blocked before the softmax in the
    scoped heads, and the change of ``metric`` per text — ``run(..., "knockout",
    edges=edges)``.

    Args:
        edges: ``"to:POSITIONS"`` (no query may read those keys), ``"from:POSITIONS"``
            (those queries read only themselves), ``"last-to:POSITIONS"`` (the last real
            token may not read those keys: Geva et al.'s last-to-subject knockout),
            ``"edge:Q>K,..."`` (exactly those edges) or a callable ``(example, layer, head)
            -> bool [query, key]`` over the example's real tokens (True = blocked).
            Positions count each text's real tokens from 0; ``-1`` / ``last`` is the last.
            The named kinds never block a token's edge to itself
            (:mod:`attnprobe.perturb.edges`).
        metric / positions: what is measured and where (:func:`run`); default the
            distributional change of the next-token prediction.
        sweep: ``"layer"`` (``"head"``): each layer's scoped heads (each head) knocked out
            alone, batched; one row per layer (head), text and metric.
        corpus / **keywords: the corpus options (``scope``: the layers and heads whose edges
            are blocked; ``batch_size``, ``truncation``, ``seed``, ``progress``,
            ``distributed``, ``max_length``), as for :func:`run`.

    Returns:
        The :func:`run` table: ``experiment`` and ``perturbation`` ``knockout``, ``scope``,
        ``layer``, ``head``, ``example_id``, ``metric``, ``baseline``, ``perturbed``,
        ``change``, then ``edges`` (and ``positions`` with a scalar metric).

    Raises:
        InputError: a bad edges spec, a position out of range for a text, a knockout that
            leaves a real row no key, an unknown metric kind or token, and :func:`run`'s.
        EditNotAppliedError: a text none of whose scoped rows loses an edge it could see.

    Example:
        >>> table = ap.perturb.knockout(lm, lm_tok, [prompt], "to:0", metric="loss")
        >>> table[["metric", "baseline", "perturbed", "change", "positions"]]
        >>> last = ap.perturb.knockout(lm, lm_tok, [prompt], "last-to:1-8", sweep="layer",
        ...                            metric="logit:t05")
        >>> last[["layer", "baseline", "perturbed", "change"]]  # one row per layer
    """
    corpus = CorpusOptions.merged(corpus, keywords, owner="perturb.knockout")
    return run(model, tokenizer, texts, "knockout", corpus=corpus, metric=metric,
               positions=positions, sweep=sweep, edges=edges)
