"""The training split tokenized: one TFRecord file per text shard,
DIR/data/tokenized-HASH/shard-NNNNN.tfrecord, each written aside and renamed into place by a
background thread; training reads the files it needs, waiting for any not yet written, so the
first steps do not wait for the whole split. A run killed while writing leaves nothing that a
later run trusts.
"""

import math
import os
import threading
import time

import tensorflow as tf

from training import records
from training.files import remove_abandoned, staging_path
from training.progress import PROGRESS_SECONDS, Progress
from training.shards import PAIRS_PER_SHARD

_TOKENIZE_BATCH = 256  # sentences tokenized by one op: batched, SentencePiece is 6x faster


class TokenizedShards:
    """The training split tokenized: one TFRecord file per text shard in `directory`, written by
    a background thread while training reads them.

    A record is one pair (`training.records`).

    Args:
        text: the `TextShards` to tokenize.
        tokenizer: a `training.tokenizer.Tokenizer`; `directory` belongs to it alone.
        directory: where the files go (`RunFolder.tokenized_dir`).
        seed: the order in which shards and pairs are read, a new one each epoch.
        worker, num_workers: this worker reads (and writes) the shards i with i % num_workers == worker.
        show_progress: whether the writer prints its progress (one worker speaks for all).
    """

    def __init__(self, text, tokenizer, directory, seed=0, worker=0, num_workers=1, show_progress=True):
        if not 0 <= worker < num_workers:
            raise ValueError(f"worker {worker} is not one of {num_workers} workers.")
        if text.num_shards < num_workers:
            raise ValueError(
                f"The training split has {text.num_shards} shard(s) of up to {max(text.shard_sizes):,} pairs, fewer than "
                f"the {num_workers} processes that would each read a share of them: train with at most "
                f"{text.num_shards} processes, or on more pairs (a folder's files are cut into shards of "
                f"{PAIRS_PER_SHARD:,} pairs; the built-in and TFDS corpora into one shard a process at least)."
            )
        self.text, self.tokenizer, self.directory, self.seed = text, tokenizer, directory, seed
        # An epoch's reads of this worker's shards: a shard that a mixture weighs more, more than once.
        self.share = [shard for shard in range(worker, text.num_shards, num_workers) for _ in range(text.reads(shard))]
        self.show_progress = show_progress
        self._writer = None
        self._error = None
        self._stop = threading.Event()

    def path(self, shard):
        return os.path.join(self.directory, f"shard-{shard:05d}.tfrecord")

    def missing(self):
        """The shards of this worker's share not written yet, in the order the first epoch reads them."""
        first_epoch = list(dict.fromkeys(int(shard) for shard in self._shard_order()))
        return [shard for shard in first_epoch if not tf.io.gfile.exists(self.path(shard))]

    def _shard_order(self):
        """This worker's shards, in a new order each time the dataset is repeated; its first
        order is the same for every new dataset (the seed is fixed), which the writer follows."""
        return tf.data.Dataset.from_tensor_slices(tf.constant(self.share, tf.int64)).shuffle(len(self.share), seed=self.seed)

    # Writing.

    def start_writing(self):
        """Starts tokenizing the missing shards of this worker's share in a background thread,
        in the order the first epoch reads them. Returns at once."""
        missing = self.missing()
        if missing and self._writer is None:
            self._writer = threading.Thread(target=self._write_all, args=(missing,), daemon=True, name="tokenize")
            self._writer.start()

    def close(self):
        """Stops the writer (a shard being written is dropped)."""
        self._stop.set()
        if self._writer is not None:
            self._writer.join()

    def write_all(self):
        """Tokenizes every missing shard of this worker's share now (in this thread)."""
        self._write_all(self.missing())
        if self._error:
            raise self._error

    def _write_all(self, missing):
        tf.io.gfile.makedirs(self.directory)
        remove_abandoned(self.directory)
        total = sum(self.text.shard_sizes[shard] for shard in missing)
        progress = Progress("Tokenizing the training split", total, every=PROGRESS_SECONDS if self.show_progress else math.inf)
        try:
            for shard in missing:
                if not self._write(shard, progress) or self._stop.is_set():
                    return
            progress.finish()
        except Exception as error:  # noqa: BLE001 - the reader raises it (see _wait_for)
            self._error = error

    def _write(self, shard, progress):
        """Writes one shard aside and renames it into place; False if stopped first."""
        staging = staging_path(self.path(shard))
        tokenizer = self.tokenizer
        batches = self.text.pairs(shard).batch(_TOKENIZE_BATCH).map(
            lambda sources, targets: (tokenizer.encode_source(sources), tokenizer.target.tokenize(targets)),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        pairs = 0
        with tf.io.TFRecordWriter(staging) as writer:
            for sources, targets in batches:
                if self._stop.is_set():
                    break
                for record in records.encode(sources, targets):
                    writer.write(record)
                rows = int(sources.nrows())
                pairs += rows
                progress.update(progress.done + rows)
        if self._stop.is_set():
            tf.io.gfile.remove(staging)
            return False
        if pairs != self.text.shard_sizes[shard]:
            raise ValueError(f"Shard {shard} of the training split gave {pairs} pairs, not {self.text.shard_sizes[shard]}.")
        tf.io.gfile.rename(staging, self.path(shard), overwrite=True)
        return True

    # Reading.

    def _wait_for(self, path):
        path = path.numpy().decode()
        while not tf.io.gfile.exists(path):
            if self._error is not None:
                raise RuntimeError(f"Tokenizing the training split failed: {self._error}")
            if self._writer is None or not self._writer.is_alive():
                raise RuntimeError(f"{path} is not written and no writer is running (call start_writing).")
            time.sleep(0.05)
        return path

    def dataset(self, shuffle_buffer=20_000, cycle_length=8):
        """This worker's pairs, shuffled, endlessly: `(source ids, target ids)` int32 `[None]` each.

        Each epoch reads this worker's shards in a new order (`_shard_order`), `cycle_length`
        of them interleaved, through a shuffle buffer of `shuffle_buffer` pairs that epochs do
        not share (`shuffle().repeat()`: a small corpus is a new permutation each epoch). A shard
        that is not written yet is waited for. Starts the writer if shards are missing.
        """
        self.start_writing()
        every_path = tf.constant([self.path(shard) for shard in range(self.text.num_shards)])
        paths = self._shard_order().map(lambda shard: tf.gather(every_path, shard))
        # The wait is a Python call, so tf.data calls the pipeline stateful and will not checkpoint
        # it unless told to ignore that (below): the call holds no state, and the files do not change.
        paths = paths.map(lambda path: tf.ensure_shape(tf.py_function(self._wait_for, [path], tf.string), []))
        # Parallel reads pay where reading waits on a network (a bucket); on a local disk the
        # threads cost more than they save (bench.pipeline: about 15% of the throughput on 2 cores).
        parallel = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": True} if "://" in self.directory else {}
        files = paths.interleave(tf.data.TFRecordDataset, cycle_length=min(cycle_length, len(self.share)), **parallel)
        pairs = files.map(records.decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        options = tf.data.Options()
        options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        return pairs.shuffle(shuffle_buffer, seed=self.seed).repeat().with_options(options)
