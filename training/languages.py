"""Several language pairs in one model, as Google's multilingual NMT does (Johnson et al., 2017):
each source starts with a token that names the language to write, `<2de>`, so that one model
serves every direction it was trained on. The token is text in the source, one piece of the
shared SentencePiece vocabulary (a user-defined symbol), so a CTranslate2 conversion reads it
as ours does.

    parse_pairs("en-de,en-fr")        the directions of a --pairs flag
    load_corpora(dataset, ...)         {(source, target): data.Corpus} of a run's directions
    tag("de")                          "<2de>": the token that asks for German
    languages(tokenizer)               the target languages whose tags a vocabulary holds
    pair_weights(sizes, temperature)   each pair's share of the training batches
    MultilingualShards(splits, T)      several pairs' training splits as one, their sources tagged,
                                       an epoch reading each pair as much as its weight asks

A run of one pair tags nothing (its vocabulary has no tags), unless it starts from a run that
did (`--init-from`): then its sources are tagged as the model learned them.
"""

import os
import re

import numpy as np
import tensorflow as tf
from sentencepiece import sentencepiece_model_pb2

from training import data
from training.shards import TOKENIZER_SAMPLE, TextShards

LANGUAGE = re.compile(r"[a-z]{2,3}(_[A-Za-z]+)?")  # ISO 639 codes, and a script or region after _ (zh_Hant)
TAG = re.compile(rf"<2({LANGUAGE.pattern})>")


def tag(language):
    """The token in front of a source that asks for a translation into `language`."""
    return f"<2{language}>"


def tagged(source, language):
    """`source` (a string, or a string tensor) asking for `language`: its tag, a space, the text."""
    if isinstance(source, str):
        return f"{tag(language)} {source}"
    return tf.strings.join([tag(language), source], separator=" ")


def languages(tokenizer):
    """The languages whose tags are user-defined pieces of `tokenizer`'s source vocabulary (a run
    that learned to write them, `train_sentencepiece(..., symbols=)`), or its OPUS-MT tags
    (`>>fra<<`, which `<2fra>` reads as: training/tokenizer.py), in its order; () for none."""
    if tokenizer.source.mapped_pieces is not None:
        return tokenizer.source.language_tags
    model = sentencepiece_model_pb2.ModelProto.FromString(tokenizer.source.model_proto)
    user_defined = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    return tuple(m.group(1) for piece in model.pieces if piece.type == user_defined and (m := TAG.fullmatch(piece.piece)))


def check_vocabulary(tokenizer, targets, where):
    """Refuses (ValueError) target languages whose tag the vocabulary of `tokenizer` (`where`, its
    path) lacks: a model never asked for them."""
    known = languages(tokenizer)
    missing = [language for language in targets if language not in known]
    if missing:
        has = f"has the tags of {', '.join(known)}" if known else "has no language tags (a run of one pair)"
        raise ValueError(f"The vocabulary of {where} {has}: it lacks {', '.join(map(tag, missing))}, so the model "
                         "cannot be asked for that language. Train a new run with it among its pairs.")  # fmt: skip


def pair_name(pair):
    """ "en-de" for ("en", "de")."""
    return "-".join(pair)


def requested_pairs(source_lang=None, target_lang=None, pairs=None):
    """The directions that training.train's flags ask for: `--pairs`, or `--source-lang` with each
    of `--target-lang`'s comma-separated languages; None for one direction (the dataset's default
    where a language is not given)."""
    if pairs:
        if source_lang or target_lang:
            raise ValueError("--pairs names every language: give it without --source-lang and --target-lang.")
        return parse_pairs(pairs)
    if target_lang is None or "," not in target_lang:
        return None
    if not source_lang:
        raise ValueError(f"--target-lang {target_lang} needs --source-lang (or give --pairs).")
    for language in target_lang.split(","):
        if not LANGUAGE.fullmatch(language.strip()):
            raise ValueError(f"--target-lang: {language.strip()!r} is not a language code (e.g. de).")
    return parse_pairs(",".join(f"{source_lang}-{language.strip()}" for language in target_lang.split(",")), "--target-lang")


def load_corpora(dataset, source_lang=None, target_lang=None, pairs=None, **options):
    """{(source, target): `data.Corpus`} of the directions of `requested_pairs(source_lang,
    target_lang, pairs)` (`pairs` a string or a tuple of pairs), each from `dataset` (see
    `data.load_corpus`, which takes `options`). A pair whose data is missing is named."""
    if isinstance(pairs, str) or pairs is None:
        pairs = requested_pairs(source_lang, target_lang, pairs)
    if pairs is None:
        corpus = data.load_corpus(dataset, source_lang, target_lang, **options)
        return {(corpus.source_lang, corpus.target_lang): corpus}
    corpora = {}
    for pair in pairs:
        try:
            corpora[pair] = data.load_corpus(dataset, *pair, **options)
        except ValueError as error:
            raise ValueError(f"The pair {pair_name(pair)}: {error}") from None
    return corpora


def tagging(pairs, tokenizer, where):
    """Whether a run of `pairs` with `tokenizer` (its path: `where`) tags its sources: when its
    vocabulary has tags (several pairs; or one, from a run of several). Refuses a target
    language whose tag it lacks (`check_vocabulary`)."""
    if len(pairs) > 1 or languages(tokenizer):
        check_vocabulary(tokenizer, [target for _, target in pairs], where)
        return True
    return False


def tags(pairs):
    """The tags of the target languages of `pairs`, each once, in order: the symbols of a new
    vocabulary of several pairs (none for one)."""
    return list(dict.fromkeys(tag(target) for _, target in pairs)) if len(pairs) > 1 else []


def training_split(corpora, directory, *, tagged, temperature=1.0, sample_size=TOKENIZER_SAMPLE, **options):
    """The training split of a run of `corpora` ({pair: data.Corpus}): the one corpus' own
    (`data.Corpus.training_split`, a folder cut into `directory`), or with `tagged` the
    `MultilingualShards` of all (each folder cut into `directory`/SRC-TGT/ when there are
    several), `sample_size` pairs for the tokenizer over all. `options`: the rest of
    `data.Corpus.training_split`'s."""
    if not tagged:
        (corpus,) = corpora.values()
        return corpus.training_split(directory, sample_size, **options)
    splits = {pair: corpus.training_split(directory if len(corpora) == 1 else os.path.join(directory, pair_name(pair)),
                                          sample_size // len(corpora), **options)
              for pair, corpus in corpora.items()}  # fmt: skip
    return MultilingualShards(splits, temperature, sample_size)


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
