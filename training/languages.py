"""Several language pairs in one model, as Google's multilingual NMT does (Johnson et al., 2017):
each source starts with a token that names the language to write, `<2de>`, so that one model
serves every direction it was trained on. The token is text in the source, one piece of the
shared SentencePiece vocabulary (a user-defined symbol), so a CTranslate2 conversion reads it
as ours does.

    parse_pairs("en-de,en-fr")        the directions of a --pairs flag
    tag("de")                          "<2de>": the token that asks for German
    pair_weights(sizes, temperature)   each pair's share of the training batches
    MultilingualShards(splits, T)      several pairs' training splits as one, their sources tagged,
                                       an epoch reading each pair as much as its weight asks
"""

import re

import numpy as np
import tensorflow as tf

from training.shards import TOKENIZER_SAMPLE, TextShards

LANGUAGE = re.compile(r"[a-z]{2,3}(_[A-Za-z]+)?")  # ISO 639 codes, and a script or region after _ (zh_Hant)


def tag(language):
    """The token in front of a source that asks for a translation into `language`."""
    return f"<2{language}>"


def tagged(source, language):
    """`source` (a string, or a string tensor) asking for `language`: its tag, a space, the text."""
    if isinstance(source, str):
        return f"{tag(language)} {source}"
    return tf.strings.join([tag(language), source], separator=" ")


def parse_pairs(value, flag="--pairs"):
    """The directions of `value`, "SRC-TGT,SRC-TGT...", as ((source, target), ...) in its order;
    a ValueError names `flag` and the first entry that is not two language codes joined by "-",
    or that is given twice."""
    pairs = []
    for entry in value.split(","):
        source, _, target = entry.strip().partition("-")
        if not (LANGUAGE.fullmatch(source) and LANGUAGE.fullmatch(target)) or source == target:
            raise ValueError(f"{flag}: {entry.strip()!r} is not SRC-TGT, two different language codes (e.g. en-de).")
        if (source, target) in pairs:
            raise ValueError(f"{flag}: {entry.strip()} is given twice.")
        pairs.append((source, target))
    return tuple(pairs)


def pair_weights(sizes, temperature=1.0):
    """The share of the training batches that each pair of `sizes` (its pairs) gets: its share of
    the data to the power 1 / `temperature`, normalized. 1 is proportional to size; a larger
    temperature evens the pairs out (every pair alike as it grows)."""
    if temperature <= 0 or not np.isfinite(temperature):
        raise ValueError(f"--pair-temperature must be positive and finite; got {temperature}.")
    sizes = np.asarray(sizes, np.float64)
    if not len(sizes) or np.any(sizes <= 0):
        raise ValueError(f"every pair needs training pairs; got sizes {sizes.tolist()}.")
    weights = (sizes / sizes.sum()) ** (1.0 / temperature)
    return weights / weights.sum()


class MultilingualShards(TextShards):
    """The training splits of several pairs as one `TextShards`: the first pair's shards, then the
    next's, each source tagged with its pair's target language. An epoch reads every shard of
    the pair that its weight favours least once, and each other pair's shards as many times as
    bring its share of the epoch nearest its weight (`pair_weights`; at least once). The
    tokenizer's sample takes as many pairs from each pair's own sample (up to `sample_size` in
    all), so that a small pair's script is not crowded out of the shared vocabulary.

    Args:
        splits: {(source language, target language): its `TextShards`}, in the run's order.
        temperature: `pair_weights`' (1: each pair as often as its size gives).
        sample_size: the pairs of the tokenizer's sample, over all pairs.
    """

    def __init__(self, splits, temperature=1.0, sample_size=TOKENIZER_SAMPLE):
        self.splits = dict(splits)
        self.sample_size = sample_size
        self._shards = [(pair, shard) for pair, split in self.splits.items() for shard in range(split.num_shards)]
        self.shard_sizes = [self.splits[pair].shard_sizes[shard] for pair, shard in self._shards]
        sizes = [split.num_pairs for split in self.splits.values()]
        per_pair = pair_weights(sizes, temperature) / sizes  # how often to read each sentence pair, up to a factor
        self.pair_reads = dict(zip(self.splits, np.maximum(1, np.round(per_pair / per_pair.min())).astype(int).tolist()))

    def reads(self, shard):
        return self.pair_reads[self.pair_of(shard)]

    def pair_of(self, shard):
        """The (source, target) languages of one of the shards."""
        return self._shards[shard][0]

    def pairs(self, shard):
        pair, index = self._shards[shard]
        return self.splits[pair].pairs(index).map(lambda source, target: (tagged(source, pair[1]), target))

    def sample(self):
        quota = self.sample_size // len(self.splits)
        sample = []
        for (_, language), split in self.splits.items():
            own = split.sample()
            spread = np.linspace(0, len(own) - 1, min(quota, len(own))).round().astype(int)  # over all of it
            sample += [(tagged(own[i][0], language), own[i][1]) for i in spread]
        return sample
