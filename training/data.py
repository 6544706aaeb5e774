"""Parallel text from three sources behind one interface, and length-bucketed training batches.

Sources (`--dataset`):
    synthetic              the corpus training/synthetic.py generates (English -> German)
    tfds:NAME              a TFDS translation dataset, e.g. tfds:wmt14_translate/de-en
    DIR                    a folder of text files, one sentence per line: train.SRC / train.TGT,
                           and the dev and test splits under the names of --dev-split and
                           --test-split (Multi30k: val, test2016)

Every source gives each split as a `tf.data.Dataset` of (source, target) string pairs.
"""

import dataclasses
import os

import tensorflow as tf

from keras_transformer import BOS_ID, EOS_ID, PAD_ID
from training import synthetic

TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


@dataclasses.dataclass
class Corpus:
    """Parallel text in one direction.

    `pairs` holds the splits of an in-memory corpus (lists of (source, target) strings);
    `tfds_builder` stands in for them for a TFDS dataset.
    """

    name: str
    source_lang: str
    target_lang: str
    pairs: dict = None
    tfds_builder: object = None

    def dataset(self, split):
        """The split as a `tf.data.Dataset` of (source, target) scalar strings."""
        if self.tfds_builder is None:
            sources, targets = zip(*self.pairs[split]) if self.pairs[split] else ((), ())
            return tf.data.Dataset.from_tensor_slices((list(sources), list(targets)))
        examples = self.tfds_builder.as_dataset(split=TFDS_SPLITS[split], shuffle_files=False)
        return examples.map(lambda ex: (ex[self.source_lang], ex[self.target_lang]))

    def text_pairs(self, split, limit=None):
        """The split as a list of (source, target) Python strings (the first `limit`)."""
        if self.tfds_builder is None:
            return self.pairs[split][:limit]
        dataset = self.dataset(split)
        if limit is not None:
            dataset = dataset.take(limit)
        return [(s.decode("utf-8"), t.decode("utf-8")) for s, t in dataset.as_numpy_iterator()]


def load_corpus(dataset, source_lang=None, target_lang=None, dev_split="dev", test_split="test", data_dir=None, seed=0):
    """The `--dataset` named by a command line: synthetic, tfds:NAME, or a folder of text files."""
    if dataset == "synthetic":
        if (source_lang, target_lang) not in ((None, None), ("en", "de")):
            raise ValueError(f"--dataset synthetic is English -> German; got --source-lang {source_lang} "
                             f"--target-lang {target_lang}.")  # fmt: skip
        return Corpus("synthetic", "en", "de", pairs=synthetic.generate_splits(seed))
    if dataset.startswith("tfds:"):
        return tfds_corpus(dataset[len("tfds:") :], source_lang, target_lang, data_dir)
    if os.path.isdir(dataset):
        return text_file_corpus(dataset, source_lang, target_lang, {"dev": dev_split, "test": test_split})
    raise ValueError(
        f"Unknown --dataset {dataset!r}: use 'synthetic', 'tfds:NAME' (a TFDS translation dataset) "
        "or a folder of text files."
    )


def tfds_corpus(name, source_lang=None, target_lang=None, data_dir=None):
    """A TFDS translation dataset. The direction defaults to the dataset's supervised keys
    (input -> target); --source-lang / --target-lang choose it by feature name."""
    import tensorflow_datasets as tfds

    try:
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


def text_file_corpus(directory, source_lang, target_lang, split_names=None):
    """A folder with PREFIX.SRC / PREFIX.TGT files per split (train, and dev / test as named)."""
    if not source_lang or not target_lang:
        found = sorted(name for name in os.listdir(directory) if name.startswith("train."))
        raise ValueError(
            f"--source-lang and --target-lang are needed with the folder {directory} (it has {found})."
        )
    names = {"train": "train", "dev": "dev", "test": "test", **(split_names or {})}
    pairs = {}
    for split, prefix in names.items():
        source_path = os.path.join(directory, f"{prefix}.{source_lang}")
        target_path = os.path.join(directory, f"{prefix}.{target_lang}")
        if not os.path.exists(source_path) and split != "train":
            pairs[split] = []  # an optional split
            continue
        pairs[split] = read_parallel_files(source_path, target_path)
    return Corpus(directory, source_lang, target_lang, pairs=pairs)


def read_parallel_files(source_path, target_path):
    """Reads two line-aligned UTF-8 files; errors name the file and line."""
    sides = [_read_lines(source_path), _read_lines(target_path)]
    if len(sides[0]) != len(sides[1]):
        raise ValueError(
            f"{source_path} has {len(sides[0])} lines but {target_path} has {len(sides[1])}: "
            "the source and target files must be line-aligned."
        )
    return list(zip(*sides))


def _read_lines(path):
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist.")
    with open(path, "rb") as f:
        raw_lines = f.read().splitlines()
    if not raw_lines:
        raise ValueError(f"{path} is empty.")
    lines = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            lines.append(raw.decode("utf-8").strip())
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}, line {number}: not valid UTF-8 ({error.reason} at byte {error.start}).") from None
    return lines


def bucket_lengths(max_length):
    """Padded lengths of the buckets: steps of about 1.5x from 8 up to max_length."""
    lengths, length = [], 8
    while length < max_length:
        lengths.append(length)
        length = (length * 3 // 2 + 7) // 8 * 8
    return lengths + [max_length]


def tokenized_training_pairs(corpus, tokenizer, cache_path=None):
    """The training split as (source ids with end-of-sentence, target ids) pairs.

    With `cache_path`, the split is tokenized once into a TFRecord file there (written aside and
    renamed into place), and read back from it by every epoch and every resumed run: on an
    accelerator the host then only shuffles, buckets and pads. The file belongs to one
    tokenizer; `RunFolder.tokenized_path` names it after the tokenizer's hash.
    """

    def encode(source, target):
        return tokenizer.encode_source(source), tokenizer.tokenize(target)  # too long a pair is dropped below

    pairs = corpus.dataset("train").map(encode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if cache_path is None:
        return pairs
    if not tf.io.gfile.exists(cache_path):
        print(f"Tokenizing the training split of {corpus.name} once, into {cache_path}...", flush=True)
        # One record per pair: [len(source), *source, *target].
        records = pairs.map(lambda source, target: tf.io.serialize_tensor(tf.concat([tf.shape(source), source, target], 0)))
        tf.io.gfile.makedirs(os.path.dirname(cache_path) or ".")
        staging = f"{cache_path}.tmp-{os.getpid()}"
        tf.data.experimental.TFRecordWriter(staging).write(records)
        tf.io.gfile.rename(staging, cache_path, overwrite=True)

    def decode(record):
        ids = tf.ensure_shape(tf.io.parse_tensor(record, tf.int32), [None])
        return ids[1 : 1 + ids[0]], ids[1 + ids[0] :]

    return tf.data.TFRecordDataset(cache_path).map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def training_batches(
    corpus, tokenizer, *, batch_tokens, max_length, batch_multiple=1, seed=0, shuffle_buffer=20000, cache_path=None
):
    """Endless, shuffled, length-bucketed batches of the training split.

    Each batch pads every sentence to its bucket's length L (from `bucket_lengths`) and holds
    about `batch_tokens` source and `batch_tokens` target tokens (the paper: 25,000 each), so
    the compiled step sees one shape per bucket. Pairs longer than `max_length` tokens (the
    source with its end-of-sentence id, the target with one extra position) are dropped.

    Yields dicts of int tensors: `source`, `target_input`, `target_output` `[B, L]`;
    `batch_tokens` `[B]`, the batch's count of real target tokens on every row (so that each
    replica of a distributed step can normalise its loss by the global count); and
    `dropped_pairs` `[B]`, how many pairs were dropped so far. The count lives in the
    dataset's own state, so it survives checkpointing the iterator. `cache_path`: tokenize once
    (see `tokenized_training_pairs`); the batches are the same either way.
    """
    lengths = bucket_lengths(max_length)
    sizes = [max(batch_multiple, batch_tokens // length // batch_multiple * batch_multiple) for length in lengths]

    def count_dropped(dropped, pair):
        source_ids, target_ids = pair
        fits = (tf.size(source_ids) <= max_length) & (tf.size(target_ids) + 1 <= max_length)
        dropped += tf.cast(~fits, tf.int64)
        return dropped, (source_ids, target_ids, fits, dropped)

    def to_model_inputs(source_ids, target_ids, dropped):
        rows = tf.shape(target_ids)[0]
        target_output = _append_eos(target_ids)
        real_tokens = tf.reduce_sum(tf.cast(target_output != PAD_ID, tf.int32))
        return {
            "source": source_ids,
            "target_input": tf.concat([tf.fill([rows, 1], BOS_ID), target_ids[:, :-1]], axis=1),
            "target_output": target_output,
            "batch_tokens": tf.fill([rows], real_tokens),
            "dropped_pairs": tf.fill([rows], tf.reduce_max(dropped)),
        }

    dataset = tokenized_training_pairs(corpus, tokenizer, cache_path).shuffle(shuffle_buffer, seed=seed).repeat()
    dataset = dataset.scan(tf.constant(0, tf.int64), count_dropped)
    dataset = dataset.filter(lambda source, target, fits, dropped: fits)
    dataset = dataset.map(lambda source, target, fits, dropped: (source, target, dropped))
    dataset = dataset.bucket_by_sequence_length(
        lambda source_ids, target_ids, dropped: tf.maximum(tf.size(source_ids), tf.size(target_ids) + 1),
        bucket_boundaries=[length + 1 for length in lengths],
        bucket_batch_sizes=sizes + [sizes[-1]],
        pad_to_bucket_boundary=True,
        drop_remainder=True,
    )
    return dataset.map(to_model_inputs).prefetch(tf.data.AUTOTUNE)


def _append_eos(target_ids):
    """Writes EOS after the last real token of each padded row `[B, L]` (L leaves room for it)."""
    lengths = tf.reduce_sum(tf.cast(target_ids != PAD_ID, tf.int32), axis=1)
    return tf.where(tf.range(tf.shape(target_ids)[1])[None, :] == lengths[:, None], EOS_ID, target_ids)
