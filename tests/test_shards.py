"""The training split streamed in shards (training/shards.py): the cut of text files
(training/cut.py), the tokenizer's sample, the tokenized shards written while training reads them
(training/tokenized.py), and the progress a long phase prints (training/progress.py)."""

import collections
import gzip
import os
import re
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from training import cut, data, shards
from training.progress import Progress
from training.tokenized import TokenizedShards
from training.tokenizer import Tokenizer, train_sentencepiece

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_folder(folder, pairs, compress=False, raw_target_lines=None):
    """train.en / train.de (gzipped if `compress`) of `pairs`, and a val split of 2 pairs."""
    os.makedirs(folder, exist_ok=True)
    for side, lang in enumerate(("en", "de")):
        for split, rows in (("train", pairs), ("val", pairs[:2])):
            content = "".join(pair[side] + "\n" for pair in rows).encode()
            if split == "train" and side == 1 and raw_target_lines is not None:
                content = raw_target_lines
            name = os.path.join(folder, f"{split}.{lang}" + (".gz" if compress else ""))
            with gzip.open(name, "wb") if compress else open(name, "wb") as f:
                f.write(content)
    return str(folder)


def _awkward_pairs(count):
    """Pairs with white space at the ends, non-ASCII text and an empty line."""
    pairs = [(f"  sentence {i} über Straßen ", f"Satz {i} 中文\t") for i in range(count)]
    pairs[5] = ("", "")
    return pairs


def _streamed(text):
    return [(s.decode(), t.decode()) for shard in range(text.num_shards) for s, t in text.pairs(shard).as_numpy_iterator()]


def test_a_folder_is_cut_into_shards_that_hold_the_pairs_read_in_memory(tmp_path, monkeypatch):
    folder = _write_folder(tmp_path / "corpus", _awkward_pairs(47))
    expected = data.read_parallel_files(os.path.join(folder, "train.en"), os.path.join(folder, "train.de"))
    assert expected[0] == ("sentence 0 über Straßen", "Satz 0 中文") and expected[5] == ("", "")
    monkeypatch.setattr(cut, "_READ_BYTES", 64)  # many blocks, and shards that straddle them
    corpus = data.load_corpus(folder, "en", "de", dev_split="val")
    text = corpus.training_split(str(tmp_path / "cut"), sample_size=10, pairs_per_shard=7)
    assert text.shard_sizes == [7] * 6 + [5]
    assert _streamed(text) == expected
    # Nothing holds the training pairs: the corpus keeps the dev split only, the shards their sizes.
    assert set(corpus.pairs) == {"dev", "test"} and corpus.train_files
    assert not any(isinstance(value, (list, tuple)) and len(value) >= len(expected) for value in vars(text).values())
    sample = text.sample()
    assert len(sample) == len(set(sample)) == 10 and set(sample) <= set(expected)
    # A second run reads the cut; files that changed since are refused.
    monkeypatch.setattr(cut, "_cut", None)
    assert _streamed(corpus.training_split(str(tmp_path / "cut"), sample_size=10, pairs_per_shard=7)) == expected
    with open(os.path.join(folder, "train.en"), "ab") as f:
        f.write(b"one more\n")
    with pytest.raises(ValueError, match=r"the training files changed since this run started"):
        corpus.training_split(str(tmp_path / "cut"))


def test_gzip_compressed_files_read_like_plain_ones(tmp_path):
    pairs = _awkward_pairs(30)
    plain = data.load_corpus(_write_folder(tmp_path / "plain", pairs), "en", "de", dev_split="val")
    zipped = data.load_corpus(_write_folder(tmp_path / "zipped", pairs, compress=True), "en", "de", dev_split="val")
    assert zipped.train_files[0].endswith("train.en.gz")
    cuts = [corpus.training_split(str(tmp_path / f"cut-{i}"), sample_size=8, pairs_per_shard=9)
            for i, corpus in enumerate((plain, zipped))]  # fmt: skip
    assert _streamed(cuts[1]) == _streamed(cuts[0]) == data.read_parallel_files(*plain.train_files)
    assert cuts[1].sample() == cuts[0].sample()
    assert zipped.text_pairs("dev") == plain.text_pairs("dev") and zipped.text_pairs("train", 3) == plain.text_pairs("train", 3)


def test_the_tokenizer_sample_covers_the_whole_file(tmp_path):
    """The first and second halves of the corpus use disjoint words: pieces of both halves'
    words are in the vocabulary (a tokenizer of the first pairs of the file would miss half)."""
    rng = np.random.default_rng(0)
    halves = [["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"], ["kilo", "lima", "mike", "november", "oscar", "papa"]]
    pairs = []
    for words in halves:
        for _ in range(1500):
            sentence = " ".join(rng.choice(words, 5))
            pairs.append((sentence, " ".join(reversed(sentence.split()))))
    corpus = data.load_corpus(_write_folder(tmp_path / "corpus", pairs), "en", "de")
    text = corpus.training_split(str(tmp_path / "cut"), sample_size=300, seed=1)

    def pieces(sample):
        model = sentencepiece.SentencePieceProcessor(model_proto=train_sentencepiece([t for p in sample for t in p], 150))
        return {model.id_to_piece(i) for i in range(model.get_piece_size())}

    whole_words = {"▁" + word for words in halves for word in words}
    assert whole_words <= pieces(text.sample())
    assert not whole_words <= pieces(corpus.text_pairs("train", 300)), "the test should tell a sample from a prefix"


def _ids(tokenizer, pairs):
    sources = tokenizer.encode_source(tf.constant([p[0] for p in pairs])).to_list()
    targets = tokenizer.target.tokenize(tf.constant([p[1] for p in pairs])).to_list()
    return collections.Counter((tuple(s), tuple(t)) for s, t in zip(sources, targets))


def _read(dataset, count):
    return [(tuple(s.tolist()), tuple(t.tolist())) for s, t in dataset.take(count).as_numpy_iterator()]


def test_tokenized_shards_hold_every_pair_once_and_workers_read_disjoint_shares(synthetic_corpus, synthetic_tokenizer, tokenize):
    pairs = synthetic_corpus.text_pairs("train", 230)
    corpus = data.Corpus("small", "en", "de", pairs={"train": pairs})
    tokenized = tokenize(corpus, synthetic_tokenizer, pairs_per_shard=50, seed=4)
    epochs = _read(tokenized.dataset(), 2 * len(pairs))
    expected = _ids(synthetic_tokenizer, pairs)
    assert collections.Counter(epochs[: len(pairs)]) == collections.Counter(epochs[len(pairs) :]) == expected
    assert epochs[: len(pairs)] != epochs[len(pairs) :], "each epoch reads the shards in a new order"
    assert sorted(os.listdir(tokenized.directory)) == [f"shard-{i:05d}.tfrecord" for i in range(5)]
    for shard, size in enumerate(tokenized.text.shard_sizes):
        assert sum(1 for _ in tf.data.TFRecordDataset(tokenized.path(shard))) == size

    shares = [TokenizedShards(tokenized.text, synthetic_tokenizer, tokenized.directory, 4, worker, 2) for worker in (0, 1)]
    assert [share.share for share in shares] == [[0, 2, 4], [1, 3]]
    first_epochs = [_read(share.dataset(), sum(tokenized.text.shard_sizes[i] for i in share.share)) for share in shares]
    assert collections.Counter(first_epochs[0]) + collections.Counter(first_epochs[1]) == expected
    with pytest.raises(ValueError, match=r"has 5 shard\(s\) of up to 50 pairs, fewer than the 6 processes .* at most 5 processes"):
        TokenizedShards(tokenized.text, synthetic_tokenizer, tokenized.directory, num_workers=6)


KILLED_WRITER = """
import os, signal, sys
from training import data, records, tokenized
from training.tokenizer import Tokenizer

folder, cut, tokenized_dir = sys.argv[1:]
text = data.load_corpus(folder, "en", "de").training_split(cut, pairs_per_shard=300)
tokenizer = Tokenizer(open(os.path.join(folder, "tokenizer.model"), "rb").read())
encode, calls = records.encode, []

def records_then_killed(sources, targets):
    calls.append(1)
    if len(calls) == 6:  # the second batch of the third shard: its first is in the file being written
        os.kill(os.getpid(), signal.SIGKILL)
    return encode(sources, targets)

records.encode = records_then_killed
tokenized.TokenizedShards(text, tokenizer, tokenized_dir, seed=7).write_all()
"""


@pytest.mark.slow
def test_a_run_killed_while_writing_shards_leaves_none_that_the_next_run_trusts(synthetic_corpus, synthetic_sentencepiece, tmp_path):
    folder = _write_folder(tmp_path / "corpus", synthetic_corpus.text_pairs("train", 1200))
    with open(os.path.join(folder, "tokenizer.model"), "wb") as f:
        f.write(synthetic_sentencepiece)
    cut, directory = str(tmp_path / "cut"), str(tmp_path / "tokenized")
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, folder, cut, directory], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    left = sorted(os.listdir(directory))
    assert len([name for name in left if name.endswith(".tfrecord")]) == 2 and any(".tmp-" in name for name in left), left

    tokenizer = Tokenizer(synthetic_sentencepiece)
    text = data.load_corpus(folder, "en", "de").training_split(cut, pairs_per_shard=300)
    resumed = TokenizedShards(text, tokenizer, directory, seed=7)
    assert len(resumed.missing()) == 2
    fresh = TokenizedShards(text, tokenizer, str(tmp_path / "fresh"), seed=7)
    settings = dict(batch_tokens=256, max_length=24, shuffle_buffer=500)
    try:
        batches = [list(data.training_batches(t, **settings).take(40).as_numpy_iterator()) for t in (resumed, fresh)]
    finally:
        resumed.close()
        fresh.close()
    for a, b in zip(*batches):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    assert sorted(os.listdir(directory)) == [f"shard-{i:05d}.tfrecord" for i in range(4)]  # the dead writer's file is gone
    assert collections.Counter(_read(resumed.dataset(), 1200)) == _ids(tokenizer, synthetic_corpus.text_pairs("train", 1200))


@pytest.mark.slow
def test_an_iterator_saved_while_the_shards_are_written_resumes_with_the_same_batches(synthetic_corpus, synthetic_tokenizer,
                                                                                      tmp_path):  # fmt: skip
    text = _Slow(synthetic_corpus.text_pairs("train", 20000), pairs_per_shard=100)
    tokenized = TokenizedShards(text, synthetic_tokenizer, str(tmp_path / "tokenized"))
    settings = dict(batch_tokens=256, max_length=24, shuffle_buffer=300)
    iterator = iter(data.training_batches(tokenized, **settings))
    for _ in range(3):
        next(iterator)
    assert tokenized.missing(), "the checkpoint should be taken while shards are still being written"
    path = tf.train.Checkpoint(data=iterator).write(str(tmp_path / "checkpoint" / "data"))
    expected = [next(iterator) for _ in range(30)]
    again = TokenizedShards(tokenized.text, synthetic_tokenizer, tokenized.directory)
    restored = iter(data.training_batches(again, **settings))
    tf.train.Checkpoint(data=restored).read(path).assert_consumed()
    for a in expected:
        b = next(restored)
        for name in a:
            np.testing.assert_array_equal(a[name].numpy(), b[name].numpy())
    tokenized.close()
    again.close()


class _Slow(shards.InMemoryShards):
    """Shards that take a while to tokenize."""

    def pairs(self, shard):
        time.sleep(0.1)
        return super().pairs(shard)


class _Broken(shards.InMemoryShards):
    def pairs(self, shard):
        if shard == 1:
            raise OSError("disk on fire")
        return super().pairs(shard)


def test_a_writer_that_fails_ends_the_reader_with_its_error(synthetic_corpus, synthetic_tokenizer, tmp_path):
    text = _Broken(synthetic_corpus.text_pairs("train", 40), pairs_per_shard=10)
    tokenized = TokenizedShards(text, synthetic_tokenizer, str(tmp_path), seed=0)
    with pytest.raises(tf.errors.OpError, match="Tokenizing the training split failed: disk on fire"):
        _read(tokenized.dataset(), 40)
    tokenized.close()


class _Builder:
    """A TFDS builder's surface that `TfdsShards` uses, over a list (tfds.testing.mock_data
    ignores split slicing and has no split sizes)."""

    def __init__(self, pairs):
        self.examples = [{"en": s.encode(), "de": t.encode()} for s, t in pairs]
        self.info = types.SimpleNamespace(splits={"train": types.SimpleNamespace(num_examples=len(pairs))})

    def as_dataset(self, split, shuffle_files):
        start, end = map(int, re.fullmatch(r"train\[(\d+):(\d+)\]", split).groups())
        rows = self.examples[start:end]
        return tf.data.Dataset.from_tensor_slices({lang: [row[lang] for row in rows] for lang in ("en", "de")})


def test_a_tfds_training_split_is_read_in_ranges_and_sampled_from_every_range(synthetic_corpus):
    pairs = synthetic_corpus.text_pairs("train", 23)
    text = data.Corpus("tfds:x", "en", "de", tfds_builder=_Builder(pairs)).training_split("unused", sample_size=6,
                                                                                         pairs_per_shard=5)  # fmt: skip
    assert text.shard_sizes == [5] * 4 + [3]
    assert _streamed(text) == pairs
    sample = text.sample()
    assert len(sample) == 6 and set(sample) <= set(pairs)
    assert {pairs.index(pair) // 5 for pair in sample} == set(range(5)), "the sample should come from every range"


def test_progress_says_pairs_rate_and_time_left(capsys):
    progress = Progress("Tokenizing", 1000, every=0)
    progress.update(250)
    line = capsys.readouterr().out
    assert line.startswith("Tokenizing: 250 pairs (25%), ") and " pairs/s, ETA " in line
    Progress("Reading", None, every=0).update(1200, 0.5)
    assert "Reading: 1,200 pairs (50%)" in capsys.readouterr().out


def _numbered_files(folder, count, width=0):
    """train.en / train.de of `count` pairs whose lines hold their index (padded with `width` x's)."""
    os.makedirs(folder, exist_ok=True)
    for lang in ("en", "de"):
        with open(os.path.join(folder, f"train.{lang}"), "w") as f:
            f.writelines(f"{i} {lang} {'x' * width}\n" for i in range(count))
    return [os.path.join(folder, f"train.{lang}") for lang in ("en", "de")]


def test_a_corpus_of_tens_of_megabytes_is_cut_in_a_few_megabytes(tmp_path, monkeypatch):
    import tracemalloc

    source, target = _numbered_files(tmp_path / "corpus", 250_000, width=70)  # 20 MB a side
    assert os.path.getsize(source) > 20e6
    monkeypatch.setattr(cut, "_READ_BYTES", 256 << 10)
    tracemalloc.start()
    try:
        text = cut.cut_text_files(source, target, str(tmp_path / "cut"), sample_size=100, pairs_per_shard=100_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert text.shard_sizes == [100_000, 100_000, 50_000]
    # A block of each side and its joined copy, a shard's writers: a few read blocks, not the files.
    assert peak < 8e6, f"the cut held {peak / 1e6:.1f} MB at its peak"


def test_the_tokenizer_sample_is_uniform_over_the_files_read_in_many_blocks(tmp_path, monkeypatch):
    import scipy.stats

    count, size = 40_000, 2_000
    source, target = _numbered_files(tmp_path / "corpus", count)
    monkeypatch.setattr(cut, "_READ_BYTES", 4096)  # about 400 lines a block: 100 blocks
    sample = cut.cut_text_files(source, target, str(tmp_path / "cut"), sample_size=size, seed=3).sample()
    indices = [int(s.split()[0]) for s, _ in sample]
    assert len(set(indices)) == size and all(s.split()[0] == t.split()[0] for s, t in sample)
    deciles = np.bincount(np.array(indices) * 10 // count, minlength=10)
    assert scipy.stats.chisquare(deciles).pvalue > 1e-3, deciles


def test_an_interrupted_cut_is_made_again_and_changed_files_of_the_same_size_are_refused(tmp_path, monkeypatch):
    source, target = _numbered_files(tmp_path / "corpus", 1000)
    directory = str(tmp_path / "cut")
    reservoir_add = cut._Reservoir.add
    blocks = []

    def killed_on_the_fourth_block(self, *args):
        blocks.append(1)
        if len(blocks) == 4:
            raise KeyboardInterrupt  # as a kill leaves it: shards written, no index.json
        return reservoir_add(self, *args)

    monkeypatch.setattr(cut, "_READ_BYTES", 1024)
    monkeypatch.setattr(cut._Reservoir, "add", killed_on_the_fourth_block)
    with pytest.raises(KeyboardInterrupt):
        cut.cut_text_files(source, target, directory, pairs_per_shard=100)
    assert not os.path.exists(os.path.join(directory, "index.json")) and os.path.exists(os.path.join(directory, "shard-00001.src"))
    monkeypatch.setattr(cut._Reservoir, "add", reservoir_add)
    text = cut.cut_text_files(source, target, directory, pairs_per_shard=100)
    assert text.shard_sizes == [100] * 10
    assert _streamed(text) == data.read_parallel_files(source, target)

    # A copy of the files (a new modification time, the same bytes) is the same corpus.
    with open(target, "rb") as f:
        content = f.read()
    with open(target, "wb") as f:
        f.write(content)
    os.utime(target, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert cut.cut_text_files(source, target, directory, pairs_per_shard=100).shard_sizes == [100] * 10
    # An edit that keeps the size is not.
    with open(target, "wb") as f:
        f.write(content.replace(b"7 de", b"8 de", 1))
    os.utime(target, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    with pytest.raises(ValueError, match="the training files changed since this run started"):
        cut.cut_text_files(source, target, directory, pairs_per_shard=100)
