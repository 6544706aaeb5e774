"""Parallel text from three sources behind one interface, and length-bucketed training batches.

Sources (`--dataset`):
    synthetic              the corpus training/synthetic.py generates (English -> German, and
                           English -> qaa for tests of several target languages)
    tfds:NAME              a TFDS translation dataset, e.g. tfds:wmt14_translate/de-en; without
                           a config (tfds:wmt14_translate), the config of the two languages
    DIR                    a folder of text files, one sentence per line: train.SRC / train.TGT,
                           and the dev and test splits under the names of --dev-split and
                           --test-split (Multi30k: val, test2016); in DIR/SRC-TGT/ if there is
                           such a folder (a run of several pairs from several corpora)

Every source gives its dev and test splits as lists or `tf.data.Dataset`s of (source, target)
strings, and its training split as shards (`training/shards.py`), streamed, never whole in memory.
"""

import dataclasses
import itertools
import os

import tensorflow as tf

from keras_transformer import BOS_ID, EOS_ID, PAD_ID
from training import files, shards, synthetic
from training.cut import cut_text_files

TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


@dataclasses.dataclass
class Corpus:
    """Parallel text in one direction.

    `pairs` holds the splits of an in-memory corpus (lists of (source, target) strings: the
    synthetic corpus, the dev and test splits of a folder); `tfds_builder` stands in for them for
    a TFDS dataset; `train_files`, (source path, target path), is a folder's training split,
    which is streamed and never read whole (`training_split`).
    """

    name: str
    source_lang: str
    target_lang: str
    pairs: dict = None
    tfds_builder: object = None
    train_files: tuple = None

    def dataset(self, split):
        """The split as a `tf.data.Dataset` of (source, target) scalar strings (not the
        training split of a folder: `training_split` streams that)."""
        if self.tfds_builder is None:
            sources, targets = zip(*self.pairs[split]) if self.pairs[split] else ((), ())
            return tf.data.Dataset.from_tensor_slices((list(sources), list(targets)))
        examples = self.tfds_builder.as_dataset(split=TFDS_SPLITS[split], shuffle_files=False)
        return examples.map(lambda ex: (ex[self.source_lang], ex[self.target_lang]))

    def text_pairs(self, split, limit=None):
        """The split as a list of (source, target) Python strings (the first `limit`)."""
        if split == "train" and self.train_files:
            return _first_pairs(*self.train_files, limit)
        if self.tfds_builder is None:
            return self.pairs[split][:limit]
        dataset = self.dataset(split)
        if limit is not None:
            dataset = dataset.take(limit)
        return [(s.decode("utf-8"), t.decode("utf-8")) for s, t in dataset.as_numpy_iterator()]

    def training_split(self, directory, sample_size=shards.TOKENIZER_SAMPLE, seed=0, pairs_per_shard=shards.PAIRS_PER_SHARD,
                       cut=True, shares=1):  # fmt: skip
        """The training split as `shards.TextShards`, with a tokenizer sample of `sample_size`
        pairs. A folder's files are cut into `directory` in one pass (once: a later call reads
        the cut; with `cut=False`, another process cuts them and this one waits); the other
        sources write nothing, and are split into at least `shares` shards (one for each
        process that reads a share of them) where they have that many pairs."""
        if self.train_files:
            return cut_text_files(*self.train_files, directory, sample_size, seed, pairs_per_shard, cut)
        if self.tfds_builder is not None:
            size = _shard_size(self.tfds_builder.info.splits["train"].num_examples, pairs_per_shard, shares)
            return shards.TfdsShards(self.tfds_builder, self.source_lang, self.target_lang, sample_size, size)
        size = _shard_size(len(self.pairs["train"]), pairs_per_shard, shares)
        return shards.InMemoryShards(self.pairs["train"], sample_size, seed, size)


def load_corpus(dataset, source_lang=None, target_lang=None, dev_split="dev", test_split="test", data_dir=None, seed=0):
    """The `--dataset` named by a command line: synthetic, tfds:NAME, or a folder of text files."""
    if dataset == "synthetic":
        if source_lang not in (None, "en") or target_lang not in (None, *synthetic.TARGETS):
            raise ValueError(f"--dataset synthetic is English -> {' or '.join(synthetic.TARGETS)}; got --source-lang "
                             f"{source_lang} --target-lang {target_lang}.")  # fmt: skip
        target_lang = target_lang or "de"
        return Corpus("synthetic", "en", target_lang, pairs=synthetic.generate_splits(seed, target=target_lang))
    if dataset.startswith("tfds:"):
        return tfds_corpus(dataset[len("tfds:") :], source_lang, target_lang, data_dir)
    if os.path.isdir(dataset):
        of_pair = os.path.join(dataset, f"{source_lang}-{target_lang}")
        folder = of_pair if os.path.isdir(of_pair) else dataset
        return text_file_corpus(folder, source_lang, target_lang, {"dev": dev_split, "test": test_split})
    raise ValueError(
        f"Unknown --dataset {dataset!r}: use 'synthetic', 'tfds:NAME' (a TFDS translation dataset) "
        "or a folder of text files."
    )


def tfds_corpus(name, source_lang=None, target_lang=None, data_dir=None):
    """A TFDS translation dataset. The direction defaults to the dataset's supervised keys
    (input -> target); --source-lang / --target-lang choose it by feature name, and the config
    of a NAME given without one (wmt14_translate: de-en for en -> de, where it has one)."""
    import tensorflow_datasets as tfds

    try:
        if "/" not in name and source_lang and target_lang:
            configs = [config.name for config in getattr(tfds.builder_cls(name), "BUILDER_CONFIGS", ())]
            name = next((f"{name}/{c}" for c in (f"{source_lang}-{target_lang}", f"{target_lang}-{source_lang}")
                         if c in configs), name)  # fmt: skip
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as error:
        raise ValueError(f"--dataset tfds:{name}: no such TFDS dataset ({error}).") from None
    languages = sorted(builder.info.features.keys())
    supervised = builder.info.supervised_keys or ()
    source_lang = source_lang or (supervised[0] if supervised else None)
    target_lang = target_lang or (supervised[1] if supervised else None)
    for flag, lang in (("--source-lang", source_lang), ("--target-lang", target_lang)):
        if lang not in languages:
            raise ValueError(f"{flag} {lang!r} is not a language of tfds:{name}; it has {languages}.")
    builder.download_and_prepare()
    return Corpus(f"tfds:{name}", source_lang, target_lang, tfds_builder=builder)


def _shard_size(num_pairs, pairs_per_shard, shares):
    """At most `pairs_per_shard`, and small enough for at least `shares` shards of `num_pairs` pairs."""
    return max(1, min(pairs_per_shard, num_pairs // shares))


def text_file_corpus(directory, source_lang, target_lang, split_names=None):
    """A folder with PREFIX.SRC / PREFIX.TGT files per split (train, and dev / test as named),
    each plain or gzip-compressed (PREFIX.SRC.gz). The dev and test splits are read into memory;
    the training split is streamed (`Corpus.training_split`)."""
    if not source_lang or not target_lang:
        found = sorted(name for name in os.listdir(directory) if name.startswith("train."))
        raise ValueError(
            f"--source-lang and --target-lang are needed with the folder {directory} (it has {found})."
        )
    names = {"train": "train", "dev": "dev", "test": "test", **(split_names or {})}
    paths = {split: [_find(directory, f"{prefix}.{lang}") for lang in (source_lang, target_lang)] for split, prefix in names.items()}
    pairs = {}
    for split in ("dev", "test"):
        pairs[split] = read_parallel_files(*paths[split]) if os.path.exists(paths[split][0]) else []  # optional
    for path in paths["train"]:
        if not os.path.exists(path):
            raise ValueError(f"{path} does not exist.")
    return Corpus(directory, source_lang, target_lang, pairs=pairs, train_files=tuple(paths["train"]))


def _find(directory, name):
    """DIR/NAME, or DIR/NAME.gz if only that exists."""
    path = os.path.join(directory, name)
    return path + ".gz" if not os.path.exists(path) and os.path.exists(path + ".gz") else path


def read_parallel_files(source_path, target_path):
    """Reads two line-aligned UTF-8 files (plain or .gz) into a list of pairs; errors name the
    file and line. For the dev and test splits: the training split is streamed."""
    sides = [_read_lines(source_path), _read_lines(target_path)]
    if len(sides[0]) != len(sides[1]):
        raise ValueError(
            f"{source_path} has {len(sides[0])} lines but {target_path} has {len(sides[1])}: "
            "the source and target files must be line-aligned."
        )
    return list(zip(*sides))


def _read_lines(path):
    """The lines of a file, split at \\n and stripped of white space at both ends, as the
    training split's are (`training.cut.cut_text_files`)."""
    with files.open_text(path) as f:
        raw_lines = f.readlines()
    if not raw_lines:
        raise ValueError(f"{path} is empty.")
    files.check_utf8(b"".join(raw_lines), path, 1)
    return [line.strip().decode("utf-8") for line in raw_lines]


def _first_pairs(source_path, target_path, limit):
    """The first `limit` pairs of two files (all if None), streamed."""
    with files.open_text(source_path) as source, files.open_text(target_path) as target:
        lines = list(itertools.islice(zip(source, target), limit))
    for side, path in enumerate((source_path, target_path)):
        files.check_utf8(b"".join(pair[side] for pair in lines), path, 1)
    return [(s.strip().decode("utf-8"), t.strip().decode("utf-8")) for s, t in lines]


def bucket_lengths(max_length):
    """Padded lengths of the buckets: steps of about 1.5x from 8 up to max_length."""
    lengths, length = [], 8
    while length < max_length:
        lengths.append(length)
        length = (length * 3 // 2 + 7) // 8 * 8
    return lengths + [max_length]


@dataclasses.dataclass(frozen=True)
class BucketSchedule:
    """The buckets that processes reading different shares draw every batch from in one seeded
    order, so that at each step all of them make a batch of the same shape (one compiled step
    over the global batch: training across hosts).

    `lengths[i]` is bucket i's padded length (the last is `max_length`) and `weights[i]` how
    often it is drawn: its share of the pairs over its rows per batch, so that every bucket's
    reader goes through its share of the split at the same pace.
    """

    lengths: tuple
    weights: tuple


# A scheduled bucket must hold this many pairs of each share's sample; a rarer one joins the next
# larger bucket (its pairs padded further), so that no reader waits long for a bucket's pairs.
MIN_PAIRS_PER_SCHEDULED_BUCKET = 4
SCHEDULE_SHARDS_PER_SHARE, SCHEDULE_PAIRS_PER_SHARD = 4, 256


def bucket_schedule(text, tokenizer, *, batch_tokens, max_length, num_shares):
    """The `BucketSchedule` of the shares of `text` (`shards.TextShards`) that `num_shares`
    processes read (share p: the shards i with i % num_shares == p, as `tokenized.TokenizedShards`).

    The same in every process: it counts the bucket lengths of the first
    SCHEDULE_PAIRS_PER_SHARD pairs of SCHEDULE_SHARDS_PER_SHARE shards spread over each share.
    `batch_tokens` is each process' (its rows of the global batch).
    """
    lengths = bucket_lengths(max_length)
    counts = []  # [share][bucket]
    for share in range(num_shares):
        shard_ids = list(range(share, text.num_shards, num_shares))
        picked = sorted({shard_ids[i * len(shard_ids) // SCHEDULE_SHARDS_PER_SHARE] for i in range(SCHEDULE_SHARDS_PER_SHARE)})
        pairs = [pair for shard in picked for pair in text.pairs(shard).take(SCHEDULE_PAIRS_PER_SHARD)]
        sources, targets = zip(*pairs)
        source_lengths = tokenizer.encode_source(tf.stack(sources)).row_lengths().numpy()
        target_lengths = tokenizer.target.tokenize(tf.stack(targets)).row_lengths().numpy() + 1
        keys = [max(s, t) for s, t in zip(source_lengths, target_lengths)]
        counts.append([sum(1 for key in keys if low < key <= high) for low, high in zip([0, *lengths], lengths)])
    # Rare buckets join the next larger one; a rare last bucket takes in the ones below it.
    kept, pending = [], [0] * num_shares
    for bucket, length in enumerate(lengths):
        pending = [total + share[bucket] for total, share in zip(pending, counts)]
        if min(pending) >= MIN_PAIRS_PER_SCHEDULED_BUCKET or bucket == len(lengths) - 1:
            kept.append((length, pending))
            pending = [0] * num_shares
    while len(kept) > 1 and min(kept[-1][1]) < MIN_PAIRS_PER_SCHEDULED_BUCKET:
        kept[-2:] = [(kept[-1][0], [a + b for a, b in zip(kept[-2][1], kept[-1][1])])]
    if min(kept[-1][1]) == 0:
        raise ValueError(f"The sample of the training split holds no pair of at most {max_length} tokens in some "
                         f"share of {num_shares}: raise --max-length.")  # fmt: skip
    frequencies = [sum(per_share) for _, per_share in kept]
    weights = [count / rows_per_batch(length, batch_tokens) for count, (length, _) in zip(frequencies, kept)]
    return BucketSchedule(tuple(length for length, _ in kept), tuple(w / sum(weights) for w in weights))


def rows_per_batch(length, batch_tokens, batch_multiple=1):
    """Rows of a batch of sentences padded to `length`: about `batch_tokens` tokens, a multiple
    of `batch_multiple` (at least one row per replica)."""
    return max(batch_multiple, batch_tokens // length // batch_multiple * batch_multiple)


def training_batches(tokenized, *, batch_tokens, max_length, batch_multiple=1, shuffle_buffer=20000, schedule=None):
    """Endless, shuffled, length-bucketed batches of the training split.

    `tokenized` is a `tokenized.TokenizedShards`, whose seed orders and shuffles its pairs (with a
    buffer of `shuffle_buffer`: the shards hold the corpus in its own order). Each batch pads
    every sentence to its bucket's length L (from `bucket_lengths`) and holds about
    `batch_tokens` source and `batch_tokens` target tokens (the paper: 25,000 each), so the
    compiled step sees one shape per bucket. Pairs longer than `max_length` tokens (the source
    with its end-of-sentence id, the target with one extra position) are dropped.

    Batches come in the order their buckets fill, from one reading of the pairs. With a
    `schedule` (`BucketSchedule`, for processes that read different shares) they come in the
    schedule's seeded order instead: each bucket has a reader of its own that skips the pairs
    of other buckets.

    Yields dicts of int tensors: `source`, `target_input`, `target_output` `[B, L]`; and
    `dropped_pairs` `[B]`, how many pairs were dropped so far (by the batch's reader, under a
    schedule). The count lives in the dataset's own state, so it survives checkpointing the
    iterator.
    """

    def count_dropped(dropped, pair):
        source_ids, target_ids = pair
        fits = (tf.size(source_ids) <= max_length) & (tf.size(target_ids) + 1 <= max_length)
        dropped += tf.cast(~fits, tf.int64)
        return dropped, (source_ids, target_ids, fits, dropped)

    def to_model_inputs(source_ids, target_ids, dropped):
        rows = tf.shape(target_ids)[0]
        return {
            "source": source_ids,
            "target_input": tf.concat([tf.fill([rows, 1], BOS_ID), target_ids[:, :-1]], axis=1),
            "target_output": _append_eos(target_ids),
            "dropped_pairs": tf.fill([rows], tf.reduce_max(dropped)),
        }

    def fitting_pairs():
        pairs = tokenized.dataset(shuffle_buffer).scan(tf.constant(0, tf.int64), count_dropped)
        pairs = pairs.filter(lambda source, target, fits, dropped: fits)
        return pairs.map(lambda source, target, fits, dropped: (source, target, dropped))

    def bucket_key(source_ids, target_ids, dropped):
        return tf.maximum(tf.size(source_ids), tf.size(target_ids) + 1)

    if schedule is None:
        lengths = bucket_lengths(max_length)
        sizes = [rows_per_batch(length, batch_tokens, batch_multiple) for length in lengths]
        dataset = fitting_pairs().bucket_by_sequence_length(
            bucket_key,
            bucket_boundaries=[length + 1 for length in lengths],
            bucket_batch_sizes=sizes + [sizes[-1]],
            pad_to_bucket_boundary=True,
            drop_remainder=True,
        )
    else:

        def between(low, high):
            def keep(*pair):
                key = bucket_key(*pair)
                return (key > low) & (key <= high)

            return keep

        def draw_bucket(draw):  # Dataset.random's integers are uniform over [0, 2**32)
            fraction = tf.cast(draw % 2**24, tf.float64) / 2**24
            return tf.searchsorted(cumulative, [fraction], side="right", out_type=tf.int64)[0]

        buckets = []
        for low, high in zip((0, *schedule.lengths), schedule.lengths):
            rows = rows_per_batch(high, batch_tokens, batch_multiple)
            in_bucket = fitting_pairs().filter(between(low, high))
            buckets.append(in_bucket.padded_batch(rows, padded_shapes=([high], [high], []), drop_remainder=True))
        cumulative = tf.constant(list(itertools.accumulate(schedule.weights))[:-1], tf.float64)
        choices = tf.data.Dataset.random(seed=tokenized.seed).map(draw_bucket)
        dataset = tf.data.Dataset.choose_from_datasets(buckets, choices)
    return dataset.map(to_model_inputs).prefetch(tf.data.AUTOTUNE)


def _append_eos(target_ids):
    """Writes EOS after the last real token of each padded row `[B, L]` (L leaves room for it)."""
    lengths = tf.reduce_sum(tf.cast(target_ids != PAD_ID, tf.int32), axis=1)
    return tf.where(tf.range(tf.shape(target_ids)[1])[None, :] == lengths[:, None], EOS_ID, target_ids)
