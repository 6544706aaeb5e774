import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from keras_transformer import BOS_ID, EOS_ID, PAD_ID
from training import cut, data, shards
from training.tokenized import TokenizedShards

MULTI30K = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "multi30k")


def _write(path, content):
    with open(path, "wb") as f:
        f.write(content)
    return str(path)


def test_files_of_different_lengths_are_named(tmp_path):
    source = _write(tmp_path / "train.en", b"a\nb\nc\n")
    target = _write(tmp_path / "train.de", b"x\ny\n")
    with pytest.raises(ValueError, match=rf"{source} has 3 lines but {target} has 2"):
        data.read_parallel_files(source, target)
    # The training split is streamed: the same message, from the pass that cuts it into shards.
    with pytest.raises(ValueError, match=rf"{source} has 3 lines but {target} has 2"):
        cut.cut_text_files(source, target, str(tmp_path / "cut"))
    with pytest.raises(ValueError, match=rf"{target} has 2 lines but {source} has 3"):
        cut.cut_text_files(target, source, str(tmp_path / "cut"))
    assert not os.path.exists(tmp_path / "cut" / "index.json")  # no cut that a later run would read


def test_an_empty_file_is_named(tmp_path):
    source = _write(tmp_path / "train.en", b"")
    target = _write(tmp_path / "train.de", b"x\n")
    with pytest.raises(ValueError, match=rf"{source} is empty"):
        data.read_parallel_files(source, target)


def test_a_line_that_is_not_utf8_is_named(tmp_path, monkeypatch):
    lines = [f"line {i}".encode() for i in range(1, 300)]
    lines[216] = b"bad \xff byte"
    source = _write(tmp_path / "train.en", b"\n".join(lines) + b"\n")
    target = _write(tmp_path / "train.de", b"x\n" * len(lines))
    with pytest.raises(ValueError, match=rf"{source}, line 217: not valid UTF-8 \(invalid start byte at byte 4\)"):
        data.read_parallel_files(source, target)
    monkeypatch.setattr(cut, "_READ_BYTES", 100)  # the bad line in a later block than the first
    with pytest.raises(ValueError, match=rf"{source}, line 217: not valid UTF-8 \(invalid start byte at byte 4\)"):
        cut.cut_text_files(source, target, str(tmp_path / "cut"))


def test_unknown_dataset_and_missing_languages_are_explained(tmp_path):
    with pytest.raises(ValueError, match="Unknown --dataset 'wmt99'"):
        data.load_corpus("wmt99")
    _write(tmp_path / "train.en", b"a\n")
    _write(tmp_path / "train.de", b"b\n")
    with pytest.raises(ValueError, match=r"--source-lang and --target-lang are needed .*train\.de"):
        data.load_corpus(str(tmp_path))
    with pytest.raises(ValueError, match="no such TFDS dataset"):
        data.load_corpus("tfds:no_such_dataset_anywhere")


def test_a_folder_of_text_files(tmp_path):
    for split, lines in (("train", 3), ("val", 2)):
        _write(tmp_path / f"{split}.en", "".join(f"{split} en {i}\n" for i in range(lines)).encode())
        _write(tmp_path / f"{split}.de", "".join(f"{split} de {i}\n" for i in range(lines)).encode())
    corpus = data.load_corpus(str(tmp_path), "de", "en", dev_split="val")
    assert "train" not in corpus.pairs  # streamed from the files
    assert corpus.text_pairs("train") == [(f"train de {i}", f"train en {i}") for i in range(3)]
    assert corpus.text_pairs("dev") == [("val de 0", "val en 0"), ("val de 1", "val en 1")]
    assert corpus.text_pairs("test") == []
    assert [tuple(x.decode() for x in pair) for pair in corpus.dataset("dev").as_numpy_iterator()] == corpus.text_pairs("dev")


@pytest.mark.skipif(not os.path.isdir(MULTI30K), reason="../shared/data/multi30k is not beside this checkout")
def test_multi30k_reads_by_path():
    corpus = data.load_corpus(MULTI30K, "en", "de", dev_split="val", test_split="test2016")
    assert [len(corpus.text_pairs(split)) for split in ("train", "dev", "test")] == [29000, 1014, 1000]
    assert corpus.text_pairs("test", 1)[0][0].startswith("A man in an orange hat")


@pytest.mark.parametrize(
    "name, languages, expected",
    [
        ("wmt14_translate/de-en", (None, None), ("de", "en")),  # the supervised keys' order
        ("wmt14_translate/de-en", ("en", "de"), ("en", "de")),
        ("ted_hrlr_translate/pt_to_en", (None, None), ("pt", "en")),
    ],
)
def test_tfds_datasets_by_name_and_direction(name, languages, expected, tmp_path):
    with tfds.testing.mock_data(num_examples=6, data_dir=str(tmp_path)):
        corpus = data.load_corpus(f"tfds:{name}", *languages)
        assert (corpus.source_lang, corpus.target_lang) == expected
        builder = tfds.builder(name)
        examples = list(builder.as_dataset(split="validation").take(3).as_numpy_iterator())
        pairs = corpus.text_pairs("dev", 3)
    assert pairs == [(ex[expected[0]].decode(), ex[expected[1]].decode()) for ex in examples]


def test_tfds_rejects_a_language_the_dataset_lacks(tmp_path):
    with tfds.testing.mock_data(num_examples=2, data_dir=str(tmp_path)):
        with pytest.raises(ValueError, match=r"--target-lang 'fr' is not a language of tfds:wmt14_translate/de-en"):
            data.load_corpus("tfds:wmt14_translate/de-en", "en", "fr")


def test_scheduled_batches_of_two_shares_agree_in_shape_and_hold_every_pair_of_their_share(
    synthetic_corpus, synthetic_tokenizer, tokenize
):
    corpus = data.Corpus("small", "en", "de", pairs={"train": synthetic_corpus.text_pairs("train", 600)})
    shares = [tokenize(corpus, synthetic_tokenizer, pairs_per_shard=100, worker=w, num_workers=2) for w in range(2)]
    settings = dict(batch_tokens=128, max_length=24)
    schedule = data.bucket_schedule(shares[0].text, synthetic_tokenizer, num_shares=2, **settings)
    assert schedule == data.bucket_schedule(shares[1].text, synthetic_tokenizer, num_shares=2, **settings)
    assert schedule.lengths[-1] == 24 and abs(sum(schedule.weights) - 1) < 1e-9
    streams = [data.training_batches(share, schedule=schedule, batch_multiple=2, **settings).take(150) for share in shares]
    seen = [set(), set()]
    for first, second in zip(*(stream.as_numpy_iterator() for stream in streams)):
        assert first["source"].shape == second["source"].shape  # one global batch shape per step
        assert first["source"].shape[1] in schedule.lengths and first["source"].shape[0] % 2 == 0
        for share, batch in enumerate((first, second)):
            seen[share].update(tuple(row[row != PAD_ID]) for row in batch["source"])
    for share, tokenized in enumerate(shares):
        expected = {tuple(source) for source, _ in tokenized.dataset(1).take(300).as_numpy_iterator()}
        assert seen[share] == expected  # every pair of the share, and none of the other's
    assert not seen[0] & seen[1]


def test_rare_buckets_join_the_next_larger_and_a_rare_last_bucket_takes_in_the_one_below(
    synthetic_corpus, synthetic_tokenizer
):
    pairs = synthetic_corpus.text_pairs("train", 200)
    long = " ".join(pairs[0][0] for _ in range(5))  # one pair of a longer bucket than the rest
    text = shards.InMemoryShards(pairs + [(long, long)], pairs_per_shard=1000)
    lengths = data.bucket_lengths(64)
    keys = [max(len(synthetic_tokenizer.source.tokenize(s)) + 1, len(synthetic_tokenizer.target.tokenize(t)) + 1) for s, t in pairs]
    assert max(keys) < 40 < len(synthetic_tokenizer.source.tokenize(long)) + 1 <= 64
    schedule = data.bucket_schedule(text, synthetic_tokenizer, batch_tokens=512, max_length=64, num_shares=1)
    assert max(keys) > 16
    # 40 is empty (joins 64); 64 holds one pair, too few alone, so it takes in 24's pairs.
    assert schedule.lengths[-2:] == (16, 64) and set(schedule.lengths) < set(lengths)


def test_bucket_lengths():
    assert data.bucket_lengths(64) == [8, 16, 24, 40, 64]
    assert data.bucket_lengths(256)[-1] == 256


def test_batches_have_bucket_shapes_token_budgets_and_shifted_targets(synthetic_corpus, synthetic_tokenizer, tokenize):
    corpus = data.Corpus("mixed", "en", "de", pairs={"train": synthetic_corpus.text_pairs("train", 400) + [("a " * 50, "b")]})
    batches = data.training_batches(tokenize(corpus, synthetic_tokenizer, pairs_per_shard=100), batch_tokens=256,
                                    max_length=24, batch_multiple=2)  # fmt: skip
    shapes = set()
    for batch in batches.take(40):
        source, target_input, target_output = (batch[k].numpy() for k in ("source", "target_input", "target_output"))
        rows, length = source.shape
        shapes.add((rows, length))
        assert target_input.shape == target_output.shape == (rows, length)
        assert rows == 256 // length // 2 * 2
        np.testing.assert_array_equal(target_input[:, 0], BOS_ID)
        for row in range(rows):
            real = target_output[row][target_output[row] != PAD_ID]
            assert real[-1] == EOS_ID and EOS_ID not in real[:-1]
            np.testing.assert_array_equal(target_input[row, 1 : len(real)], real[:-1])
            assert source[row][source[row] != PAD_ID][-1] == EOS_ID
    assert shapes <= {(256 // length // 2 * 2, length) for length in data.bucket_lengths(24)}
    # The 50-word pair is over --max-length: dropped and counted, once per pass over the data.
    assert batch["dropped_pairs"].numpy()[0] >= 1


def test_the_built_in_and_tfds_corpora_split_into_a_shard_for_each_process(synthetic_corpus, tmp_path):
    """`--processes 2` on the default corpus: each process reads a share of at least one shard
    (a folder's files are cut into shards of their own size)."""
    one = synthetic_corpus.training_split(str(tmp_path / "1"))
    assert one.shard_sizes == [len(synthetic_corpus.pairs["train"])]  # one process: as before
    for processes in (2, 3):
        split = synthetic_corpus.training_split(str(tmp_path / str(processes)), shares=processes)
        assert split.num_shards >= processes and sum(split.shard_sizes) == len(synthetic_corpus.pairs["train"])
        for worker in range(processes):  # would raise with fewer shards than processes
            assert TokenizedShards(split, None, str(tmp_path / "tokenized"), worker=worker, num_workers=processes).share
    six = data.Corpus("six", "en", "de", pairs={"train": [(f"s{i}", f"t{i}") for i in range(6)]})
    assert six.training_split(str(tmp_path / "six"), shares=4).shard_sizes == [1] * 6
