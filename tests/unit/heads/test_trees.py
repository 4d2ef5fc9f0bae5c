from pathlib import Path

import pytest

from attnprobe import InputError
from attnprobe.heads.trees import Tree, parse, read_conllu, write_conllu

DATA = Path(__file__).resolve().parents[2] / "data"
MINI = DATA / "mini.conllu"


def conllu(*rows, sent_id="bad1"):
    """CoNLL-U text of one sentence; each row is the 10 columns (or fewer, for errors)."""
    lines = [f"# sent_id = {sent_id}"] + ["\t".join(str(c) for c in row) for row in rows]
    return "\n".join(lines) + "\n\n"


def word(i, form, head, rel):
    return (i, form, "_", "_", "_", "_", head, rel, "_", "_")


def test_reads_ids_text_words_heads_relations():
    trees = read_conllu(MINI)
    assert [t.sentence_id for t in trees] == ["s1", "s2", "3"]  # third: no sent_id comment
    s1 = trees[0]
    assert s1.text == "The cat chased a small mouse."
    assert s1.words == ("The", "cat", "chased", "a", "small", "mouse", ".")
    assert s1.heads == (2, 3, 0, 6, 6, 3, 3)
    assert s1.relations == ("det", "nsubj", "root", "det", "amod", "obj", "punct")
    # the multiword token line 2-3 is skipped; its syntactic words are kept
    assert trees[1].words == ("We", "do", "n't", "see", "it", "in", "the", "house", ".")
    assert trees[1].relations[5] == "case"
    # the empty node 5.1 is skipped
    assert trees[2].words == ("Sue", "bought", "apples", "and", "John", "pears", ".")
    assert trees[2].heads == (2, 0, 2, 5, 2, 5, 2)
    assert len(trees[2]) == 7


def test_path_as_str_and_text_give_the_same_trees():
    assert read_conllu(str(MINI)) == read_conllu(MINI.read_text(encoding="utf-8"))


def test_write_read_round_trip():
    trees = read_conllu(MINI)
    text = write_conllu(trees)
    assert read_conllu(text) == trees
    assert write_conllu(read_conllu(text)) == text


def test_round_trip_keeps_unicode_and_subtype_labels(tmp_path):
    tree = Tree("é-1", ("Ça", "marche", "très", "bien"), (2, 0, 4, 2),
                ("nsubj", "root", "advmod", "advmod:emph"), "Ça marche très bien")
    path = tmp_path / "u.conllu"
    path.write_text(write_conllu([tree]), encoding="utf-8")
    assert read_conllu(path) == [tree]


@pytest.mark.parametrize(("text", "match"), [
    (conllu(word(1, "a", 0, "root"), (2, "b", "_", "_", "_", "_", 1, "dep", "_")),
     r"sentence bad1, line 3: expected 10 tab-separated columns, found 9"),
    (conllu(word("x", "a", 0, "root")), r"sentence bad1, line 2: ID 'x'"),
    (conllu(word(1, "a", 0, "root"), word(2, "b", "_", "dep")),
     r"sentence bad1, line 3: .*HEAD '_'"),
    (conllu(word(1, "a", 0, "root"), word(3, "b", 1, "dep")),
     r"sentence bad1, line 3: word ID 3 out of order \(expected 2"),
    (conllu(word(2, "a", 0, "root")), r"sentence bad1, line 2: word ID 2 out of order"),
    (conllu(word(1, "a", 0, "root"), word(2, "b", 9, "dep")),
     r"sentence bad1, line 3: head 9 is outside 0..2"),
    (conllu(word(1, "a", 0, "root"), word(2, "b", 2, "dep")),
     r"sentence bad1, line 3: head 2 is the word itself"),
    (conllu(word(1, "a", -1, "root")), r"sentence bad1, line 2: head -1 is outside"),
])
def test_malformed_input_names_sentence_and_line(text, match):
    with pytest.raises(InputError, match=match):
        read_conllu(text)


def test_malformed_second_sentence_is_named_by_its_count():
    text = conllu(word(1, "a", 0, "root"), sent_id="ok") + "1\ta\t_\t_\t_\t_\t0\troot\t_\n"
    with pytest.raises(InputError, match=r"sentence 2, line 4"):
        read_conllu(text)


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.conllu"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(InputError, match="no sentences"):
        read_conllu(empty)
    only_comments = tmp_path / "comments.conllu"
    only_comments.write_text("# newdoc\n\n", encoding="utf-8")
    with pytest.raises(InputError, match="no sentences"):
        read_conllu(only_comments)
    with pytest.raises(InputError, match="not found"):
        read_conllu(tmp_path / "missing.conllu")


def test_non_utf8_file_is_an_input_error(tmp_path):
    path = tmp_path / "latin1.conllu"
    path.write_bytes("1\tça\t_\t_\t_\t_\t0\troot\t_\t_\n".encode("latin-1"))
    with pytest.raises(InputError, match="UTF-8"):
        read_conllu(path)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"words": ()}, "at least one word"),
    ({"heads": (0,)}, "2 words but 1 heads"),
    ({"heads": (0, 3)}, "head 3 outside 0..2"),
    ({"heads": (0, 2)}, "its own head"),
    ({"words": ("a", "b\tc")}, "without tabs"),
    ({"relations": ("root", "")}, "empty relation"),
])
def test_tree_validates_on_construction(kwargs, match):
    fields = {"sentence_id": "t7", "words": ("a", "b"), "heads": (0, 1),
              "relations": ("root", "dep")} | kwargs
    if not fields["words"]:
        fields |= {"heads": (), "relations": ()}
    with pytest.raises(InputError, match=f"sentence t7: .*{match}"):
        Tree(**fields)


def test_several_roots_are_allowed():
    tree = Tree("two", ("Hi", ".", "Bye"), (0, 1, 0), ("root", "punct", "root"))
    assert tree.heads.count(0) == 2


def test_parse_with_spacy():
    (tree,) = parse(["The cat chased a mouse."])
    assert tree.sentence_id == "1"
    assert tree.text == "The cat chased a mouse."
    assert tree.words == ("The", "cat", "chased", "a", "mouse", ".")
    rel = dict(zip(tree.words, zip(tree.relations, tree.heads, strict=True), strict=True))
    assert rel["The"] == ("det", 2)      # -> cat
    assert rel["a"] == ("det", 5)        # -> mouse
    assert rel["cat"] == ("nsubj", 3)    # -> chased
    assert rel["chased"] == ("root", 0)
    assert all(r == r.lower() for r in tree.relations)


def test_parse_keeps_one_tree_per_text_with_several_roots():
    trees = parse(["Hello world. This is a second sentence!", "Dogs  bark."])
    assert len(trees) == 2
    assert trees[0].heads.count(0) == 2
    assert [trees[0].relations[i] for i, h in enumerate(trees[0].heads) if h == 0] == \
        ["root", "root"]
    assert trees[1].words == ("Dogs", "bark", ".")  # the extra space token is dropped


def test_parse_rejects_blank_text_and_a_bare_string():
    with pytest.raises(InputError, match=r"texts\[1\]"):
        parse(["Fine.", "   "])
    with pytest.raises(InputError, match="list of strings"):
        parse("The cat sat.")


def test_bom_and_windows_line_endings(tmp_path):
    path = tmp_path / "bom.conllu"
    path.write_bytes("\ufeff# sent_id = b1\r\n1\tHi\t_\t_\t_\t_\t0\troot\t_\t_\r\n\r\n"
                     .encode("utf-8"))
    assert read_conllu(path) == [Tree("b1", ("Hi",), (0,), ("root",))]


def test_text_with_line_breaks_is_written_on_one_line():
    tree = Tree("n1", ("Hi", "there"), (0, 1), ("root", "dep"), "Hi\nthere")
    (back,) = read_conllu(write_conllu([tree]))
    assert back.text == "Hi there" and back.words == tree.words


# ----------------------------------------------------------- trees that are not trees
@pytest.mark.parametrize(("rows", "match"), [
    # 1 -> 2 -> 3 -> 1: no root at all
    ((word(1, "a", 2, "dep"), word(2, "b", 3, "dep"), word(3, "c", 1, "dep")),
     r"sentence bad1, lines 2-4: no word has head 0; a sentence needs exactly one root"),
    # a root, and 2 <-> 3 cut off from it
    ((word(1, "a", 0, "root"), word(2, "b", 3, "dep"), word(3, "c", 2, "dep")),
     r"sentence bad1, line 3: the heads of words 2 -> 3 -> 2 form a cycle and never reach "
     r"the root"),
    ((word(1, "a", 0, "root"), word(2, "b", 1, "dep"), word(3, "c", 0, "root")),
     r"sentence bad1, line 4: a second root \(head 0; the first is on line 2\)"),
])
def test_cyclic_rootless_and_multi_root_sentences_are_refused(rows, match):
    with pytest.raises(InputError, match=match):
        read_conllu(conllu(*rows))


def test_a_cycle_in_a_later_sentence_names_its_line():
    text = (conllu(word(1, "a", 0, "root"), sent_id="ok")
            + conllu(word(1, "x", 0, "root"), word(2, "y", 4, "dep"), word(3, "z", 2, "dep"),
                     word(4, "w", 3, "dep"), sent_id="loop"))
    # line 1 comment, 2 word, 3 blank, 4 comment, 5..8 words: the cycle starts at word 2
    with pytest.raises(InputError, match=r"sentence loop, line 6: the heads of words "
                                         r"2 -> 4 -> 3 -> 2 form a cycle"):
        read_conllu(text)


@pytest.mark.parametrize(("heads", "match"), [
    ((2.5, 0), r"heads must be integers; got \(2\.5, 0\)"),
    ((2.0, 0), r"heads must be integers"),  # a float is refused, not silently cut
    ((True, 0), r"heads must be integers"),
    (("2", 0), r"heads must be integers"),
    ((2, 1), r"no word has head 0; a tree needs a root"),
    ((0, 3, 2), r"the heads of words 2 -> 3 -> 2 form a cycle"),
])
def test_tree_refuses_non_integer_heads_and_cycles(heads, match):
    words = tuple("abc"[:len(heads)])
    with pytest.raises(InputError, match=f"sentence t9: {match}"):
        Tree("t9", words, heads, ("dep",) * len(heads))


def test_tree_takes_numpy_integer_heads():
    import numpy as np

    tree = Tree("np", ("a", "b"), np.array([0, 1]), ("root", "dep"))
    assert tree.heads == (0, 1) and all(type(h) is int for h in tree.heads)


def test_head_cycle_by_construction():
    from attnprobe.heads.trees import head_cycle

    assert head_cycle((0, 1, 2, 3)) == []           # a chain down from the root
    assert head_cycle((2, 0, 2, 3)) == []
    assert head_cycle((0, 3, 4, 2)) == [2, 3, 4]    # 2 -> 3 -> 4 -> 2
    assert head_cycle((2, 1)) == [1, 2]
    n = 20_000  # word i's head is i + 1 and the last word is the root: one deep walk
    assert head_cycle((*range(2, n + 1), 0)) == []
    assert head_cycle((*range(2, n + 1), 1)) == list(range(1, n + 1))
