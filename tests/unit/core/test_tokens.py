"""The vocabulary scan: punctuation and plain ids, read once per tokenizer and size."""

from attnprobe.core.tokens import token_classes, vocabulary_ids
from tests.helpers import bert_tokenizer, bert_vocab


def test_the_scan_sorts_the_vocabulary_into_punctuation_and_plain_ids():
    tok = bert_tokenizer(bert_vocab("the cat sat . , ##s"))
    found = vocabulary_ids(tok)
    vocab = tok.get_vocab()
    assert found.punctuation.tolist() == sorted([vocab["."], vocab[","]])
    # every token but the bracketed specials is plain; [UNK] stands for a word of the text
    brackets = {vocab[t] for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")}
    assert found.plain.tolist() == sorted(set(vocab.values()) - brackets)


def test_the_scan_is_read_once_and_again_after_tokens_are_added():
    tok = bert_tokenizer(bert_vocab("the cat sat ."))
    first = vocabulary_ids(tok)
    assert vocabulary_ids(tok) is first  # same tokenizer, same size: not scanned again
    tok.add_tokens(["!?"])
    again = vocabulary_ids(tok)
    assert again is not first
    assert tok.convert_tokens_to_ids("!?") in again.punctuation.tolist()
    assert tok.convert_tokens_to_ids("!?") in token_classes(tok)["punct"].tolist()
