"""The training split in shards of text pairs, streamed, never held whole in memory.

    TextFileShards   a folder's train.SRC / train.TGT, cut into shards of `PAIRS_PER_SHARD`
                     pairs in DIR/data/text/ (`training.cut.cut_text_files`)
    TfdsShards       ranges of a TFDS dataset's train split (TFDS reads each from its own files)
    InMemoryShards   slices of a list of pairs (the synthetic corpus, tests)

The shards of worker w of W are those whose index i has i % W == w: each worker (or host) reads,
and tokenizes (`training.tokenized.TokenizedShards`), a disjoint share, and together all.
"""

import json
import os
import random

import tensorflow as tf

PAIRS_PER_SHARD = 20_000  # about a second of tokenizing on one core: the first steps wait for a few
TOKENIZER_SAMPLE = 1_000_000  # pairs SentencePiece learns from (`--tokenizer-sample`)


class TextShards:
    """The training split as `num_shards` shards of (source, target) text pairs.

    `shard_sizes[i]` is the number of pairs in shard i; `pairs(i)` streams them as a
    `tf.data.Dataset` of scalar strings; `sample()` is the tokenizer's sample, a list of
    (source, target) strings spread uniformly over the split; `reads(i)` is how many times an
    epoch reads shard i (1; more where a split mixes corpora by weight).
    """

    shard_sizes = ()

    @property
    def num_shards(self):
        return len(self.shard_sizes)

    @property
    def num_pairs(self):
        return sum(self.shard_sizes)

    def pairs(self, shard):
        raise NotImplementedError

    def sample(self):
        raise NotImplementedError

    def reads(self, shard):
        return 1


def _sizes(num_pairs, pairs_per_shard):
    full, rest = divmod(num_pairs, pairs_per_shard)
    return [pairs_per_shard] * full + ([rest] if rest else [])


class InMemoryShards(TextShards):
    """Slices of a list of (source, target) strings."""

    def __init__(self, pairs, sample_size=TOKENIZER_SAMPLE, seed=0, pairs_per_shard=PAIRS_PER_SHARD):
        if not pairs:
            raise ValueError("The training split is empty.")
        self._pairs, self.sample_size, self.seed = pairs, sample_size, seed
        self.shard_sizes = _sizes(len(pairs), pairs_per_shard)
        self.pairs_per_shard = pairs_per_shard

    def pairs(self, shard):
        start = shard * self.pairs_per_shard
        sources, targets = zip(*self._pairs[start : start + self.shard_sizes[shard]])
        return tf.data.Dataset.from_tensor_slices((list(sources), list(targets)))

    def sample(self):
        if len(self._pairs) <= self.sample_size:
            return list(self._pairs)
        return random.Random(self.seed).sample(self._pairs, self.sample_size)


class TfdsShards(TextShards):
    """Consecutive ranges of a TFDS dataset's train split (`train[a:b]`)."""

    def __init__(self, builder, source_lang, target_lang, sample_size=TOKENIZER_SAMPLE, pairs_per_shard=PAIRS_PER_SHARD):
        self.builder, self.languages, self.sample_size = builder, (source_lang, target_lang), sample_size
        self.shard_sizes = _sizes(builder.info.splits["train"].num_examples, pairs_per_shard)
        self.pairs_per_shard = pairs_per_shard

    def _range(self, start, size):
        split = f"train[{start}:{start + size}]"
        examples = self.builder.as_dataset(split=split, shuffle_files=False)
        source, target = self.languages
        return examples.map(lambda example: (example[source], example[target]))

    def pairs(self, shard):
        return self._range(shard * self.pairs_per_shard, self.shard_sizes[shard])

    def sample(self):
        """The first pairs of every shard, as many from each: spread over the whole split
        (WMT's train split concatenates its sources), and read without a pass over all of it."""
        pairs, quota = [], lambda shard: self.sample_size * shard // self.num_shards
        for shard, size in enumerate(self.shard_sizes):
            dataset = self._range(shard * self.pairs_per_shard, min(quota(shard + 1) - quota(shard), size))
            pairs += [(s.decode("utf-8"), t.decode("utf-8")) for s, t in dataset.as_numpy_iterator()]
        return pairs


class TextFileShards(TextShards):
    """Shards cut from a pair of line-aligned text files into `directory` (see `cut_text_files`):

        index.json                  the cut: pairs, shard sizes, the files it read (their sizes,
                                    modification times and SHA-256)
        shard-NNNNN.src / .tgt      the pairs, one per line, in the files' order (stripped of
                                    white space at both ends when read, as bytes.strip does)
        sample.src / sample.tgt     the tokenizer's sample
    """

    def __init__(self, directory):
        with tf.io.gfile.GFile(os.path.join(directory, "index.json")) as f:
            self.index = json.load(f)
        self.directory = directory
        self.shard_sizes = self.index["shard_sizes"]

    def _lines(self, name):
        return tf.data.TextLineDataset(os.path.join(self.directory, name))

    def pairs(self, shard):
        lines = tf.data.Dataset.zip(self._lines(f"shard-{shard:05d}.src"), self._lines(f"shard-{shard:05d}.tgt"))
        return lines.map(lambda source, target: (tf.strings.strip(source), tf.strings.strip(target)))

    def sample(self):
        sides = []
        for suffix in ("src", "tgt"):
            with tf.io.gfile.GFile(os.path.join(self.directory, f"sample.{suffix}"), "rb") as f:
                sides.append([line.strip().decode("utf-8") for line in f.read().split(b"\n")[:-1]])
        return list(zip(*sides))
