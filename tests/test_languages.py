"""training/languages.py: the directions of --pairs, the target-language tag, the pairs' weights
and several pairs' training splits as one."""

import os

import numpy as np
import pytest
import tensorflow as tf

from training.languages import MultilingualShards, pair_weights, parse_pairs, tag, tagged
from training.shards import InMemoryShards
from training.tokenized import TokenizedShards
from training.tokenizer import Tokenizer, train_sentencepiece


def test_pairs_are_read_in_order_and_a_bad_entry_is_named():
    assert parse_pairs("en-de, de-en,en-fr") == (("en", "de"), ("de", "en"), ("en", "fr"))
    assert parse_pairs("en-zh_Hant") == (("en", "zh_Hant"),)
    for value, entry in [("en-de,ende", "'ende'"), ("en-de,en-", "'en-'"), ("en-en", "'en-en'"), ("EN-de", "'EN-de'"),
                         ("en-de-fr", "'en-de-fr'"), ("en-de,", "''")]:  # fmt: skip
        with pytest.raises(ValueError, match=f"--pairs: {entry} is not SRC-TGT"):
            parse_pairs(value)
    with pytest.raises(ValueError, match="--pairs: en-de is given twice"):
        parse_pairs("en-de,en-fr,en-de")


def test_a_tag_is_the_language_to_write_in_front_of_the_source_as_text_and_in_the_graph():
    assert tag("de") == "<2de>" and tagged("A dog.", "fr") == "<2fr> A dog."
    assert tagged(tf.constant(["A dog.", ""]), "cs").numpy().tolist() == [b"<2cs> A dog.", b"<2cs> "]


def test_pair_weights_follow_the_temperature_formula():
    sizes = [4_500_000, 36_000_000, 29_000]
    np.testing.assert_allclose(pair_weights(sizes), np.array(sizes) / sum(sizes))  # 1: proportional to size
    shares = np.array(sizes) / sum(sizes)
    for temperature in (2.0, 5.0):  # p_i proportional to (n_i / N) ** (1 / T), by hand
        expected = [share ** (1 / temperature) / sum(s ** (1 / temperature) for s in shares) for share in shares]
        np.testing.assert_allclose(pair_weights(sizes, temperature), expected)
    assert pair_weights(sizes, 5.0)[2] > 5 * pair_weights(sizes)[2]  # the small pair gains
    np.testing.assert_allclose(pair_weights(sizes, 1e9), [1 / 3] * 3, rtol=1e-6)  # evened out
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="--pair-temperature must be positive and finite"):
            pair_weights(sizes, bad)
    with pytest.raises(ValueError, match="every pair needs training pairs"):
        pair_weights([10, 0])


def _split(language, count, per_shard):
    pairs = [(f"source {i}", f"{language} {i}") for i in range(count)]
    return InMemoryShards(pairs, pairs_per_shard=per_shard)


def test_several_pairs_read_as_one_split_each_source_tagged_with_its_target_language():
    shards = MultilingualShards({("en", "de"): _split("de", 5, 2), ("en", "cs"): _split("cs", 3, 2)})
    assert shards.shard_sizes == [2, 2, 1, 2, 1] and shards.num_pairs == 8
    assert [shards.pair_of(i) for i in range(5)] == [("en", "de")] * 3 + [("en", "cs")] * 2
    read = [(s.decode(), t.decode()) for i in range(5) for s, t in shards.pairs(i).as_numpy_iterator()]
    expected = [(f"<2{lang}> source {i}", f"{lang} {i}") for lang, count in (("de", 5), ("cs", 3)) for i in range(count)]
    assert read == expected


def test_the_tokenizer_sample_takes_as_many_pairs_of_each_spread_over_it():
    big, small = _split("de", 1000, 100), _split("cs", 30, 100)
    sample = MultilingualShards({("en", "de"): big, ("en", "cs"): small}, sample_size=40).sample()
    sources = [source for source, _ in sample]
    assert sum(s.startswith("<2de> ") for s in sources) == 20 == sum(s.startswith("<2cs> ") for s in sources)
    numbers = sorted(int(target.split()[1]) for _, target in sample if target.startswith("de "))
    assert numbers[0] < 100 and numbers[-1] > 900  # the big pair's over its whole sample, not its first 20
    assert len(MultilingualShards({("en", "de"): big, ("en", "cs"): small}, sample_size=1000).sample()) == 500 + 30


def test_a_tag_is_one_piece_of_a_vocabulary_that_declares_it():
    sentences = [tagged(s, lang) for s in ("a dog sees a cat", "the red car", "hello world") for lang in ("de", "fr")] * 50
    tokenizer = Tokenizer(train_sentencepiece(sentences, 60, symbols=[tag("de"), tag("fr")]))
    pieces = tokenizer.pieces(tokenizer.tokenize(tf.constant(["<2de> a dog", "<2fr> the car"])).to_tensor()).numpy()
    assert [row[1] for row in pieces] == [b"<2de>", b"<2fr>"]  # after SentencePiece's word boundary
    assert tokenizer.detokenize(tokenizer.tokenize(tf.constant(["<2fr> the car"]))).numpy().tolist() == [b"<2fr> the car"]


def test_an_epoch_reads_each_pair_as_often_as_its_weight_asks(tmp_path):
    splits = {("en", "de"): _split("de", 40, 4), ("en", "cs"): _split("cs", 4, 4)}
    assert MultilingualShards(splits).pair_reads == {("en", "de"): 1, ("en", "cs"): 1}  # 1: as the sizes give
    # T = 2: weights 0.76 and 0.24 (pair_weights), for 40 and 4 pairs: the small one 3.2 times as often a pair.
    assert MultilingualShards(splits, temperature=2.0).pair_reads == {("en", "de"): 1, ("en", "cs"): 3}
    shards = MultilingualShards(splits, temperature=1e9)  # evened out: half of an epoch each
    assert shards.pair_reads == {("en", "de"): 1, ("en", "cs"): 10}
    tokenizer = Tokenizer(train_sentencepiece([t for pair in shards.sample() for t in pair], 60, symbols=[tag("de"), tag("cs")]))
    tokenized = TokenizedShards(shards, tokenizer, str(tmp_path / "tokenized"))
    try:
        epoch = [target for _, target in tokenized.dataset().take(80).as_numpy_iterator()]  # 40 + 10 x 4 pairs
    finally:
        tokenized.close()
    targets = tokenizer.detokenize(tf.ragged.constant(epoch)).numpy()
    assert sum(t.startswith(b"de ") for t in targets) == 40 == sum(t.startswith(b"cs ") for t in targets)
    assert len(set(targets)) == 44  # every pair, the small one's ten times each
    assert sorted(os.listdir(tmp_path / "tokenized")) == [f"shard-{i:05d}.tfrecord" for i in range(11)]  # each written once
