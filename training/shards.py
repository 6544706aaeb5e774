"""The training split in shards: text that is streamed, never held whole in memory, and its
tokenized form, written while training reads it.

    TextFileShards   a folder's train.SRC / train.TGT (plain or .gz) cut, in one pass, into
                     shards of `PAIRS_PER_SHARD` pairs in DIR/data/text/; the same pass checks
                     every line and draws the tokenizer's sample
    TfdsShards       ranges of a TFDS dataset's train split (TFDS reads each from its own files)
    InMemoryShards   slices of a list of pairs (the synthetic corpus, tests)
    TokenizedShards  one TFRecord file per text shard, DIR/data/tokenized-HASH/shard-NNNNN.tfrecord,
                     each written aside and renamed into place by a background thread; training
                     reads the files it needs, waiting for any not yet written, so the first
                     steps do not wait for the whole split

Every file written is renamed into place when complete, and a cut's index.json is written after
its shards: a run killed while writing leaves nothing that a later run trusts. The shards of worker w of W are those whose index i has
i % W == w: each worker (or host) reads, and tokenizes, a disjoint share, and together all.
"""

import gzip
import hashlib
import itertools
import json
import math
import os
import random
import socket
import threading
import time

import numpy as np
import tensorflow as tf

PAIRS_PER_SHARD = 20_000  # about a second of tokenizing on one core: the first steps wait for a few
TOKENIZER_SAMPLE = 1_000_000  # pairs SentencePiece learns from (`--tokenizer-sample`)
PROGRESS_SECONDS = 15  # a long phase prints a line at most this often
_READ_BYTES = 1 << 20  # lines read from a text file at a time (about)
_TOKENIZE_BATCH = 256  # sentences tokenized by one op: batched, SentencePiece is 6x faster
_HOST = socket.gethostname().replace("-", "_")  # in the names of files being written


class Progress:
    """Prints `what: done of total unit (percent), rate unit/s, ETA` every `PROGRESS_SECONDS`
    while a phase runs, and how long it took at the end if that was long enough to show."""

    def __init__(self, what, total, unit="pairs", every=PROGRESS_SECONDS):
        self.what, self.total, self.unit, self.every = what, total, unit, every
        self.start = self.last = time.monotonic()
        self.done = 0

    def update(self, done, measure=None):
        """`done` units so far; `measure` (0-1) is the share done when `done` alone does not say it."""
        self.done = done
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        share = measure if measure is not None else done / self.total if self.total else None
        line = f"{self.what}: {done:,} {self.unit}"
        if share:
            line += f" ({100 * share:.0f}%), {rate:,.0f} {self.unit}/s, ETA {_duration((now - self.start) * (1 - share) / share)}"
        else:
            line += f", {rate:,.0f} {self.unit}/s"
        print(line, flush=True)

    def finish(self):
        seconds = time.monotonic() - self.start
        if seconds >= self.every:
            print(f"{self.what}: {self.done:,} {self.unit} in {_duration(seconds)}.", flush=True)


def _duration(seconds):
    return f"{seconds / 60:.0f} min {seconds % 60:.0f} s" if seconds >= 60 else f"{seconds:.0f} s"


class TextShards:
    """The training split as `num_shards` shards of (source, target) text pairs.

    `shard_sizes[i]` is the number of pairs in shard i; `pairs(i)` streams them as a
    `tf.data.Dataset` of scalar strings; `sample()` is the tokenizer's sample, a list of
    (source, target) strings spread uniformly over the split.
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


def cut_text_files(source_path, target_path, directory, sample_size=TOKENIZER_SAMPLE, seed=0,
                   pairs_per_shard=PAIRS_PER_SHARD, cut=True):  # fmt: skip
    """The shards of two line-aligned UTF-8 text files (gzip-compressed if named `.gz`), cut into
    `directory` in one streamed pass unless a complete cut of the same files is there already.

    The pass checks every line (line counts, UTF-8; errors name the file and line) and draws
    `sample_size` pairs uniformly at random (a seeded reservoir) for the tokenizer. Its
    index.json is written last: a folder without one is an interrupted cut, made again. (No
    folder is renamed: on a bucket a rename copies every file.) With `cut=False`, the
    cut is another process' (training across hosts): this one waits for it. Returns a
    `TextFileShards`.
    """
    files = {"source": os.path.abspath(source_path), "target": os.path.abspath(target_path)}
    stats = {side: os.stat(path) for side, path in files.items()}
    sizes = {side: stat.st_size for side, stat in stats.items()}
    index_path = os.path.join(directory, "index.json")
    if not cut:
        wait_for(index_path, "process 0 to cut the training files")
    if tf.io.gfile.exists(index_path):
        existing = TextFileShards(directory)
        if existing.index["files"] == files and _unchanged(existing.index, files, stats):
            return existing
        raise ValueError(
            f"{directory} holds the training split cut from {existing.index['files']} "
            f"({existing.index['file_sizes']} bytes), not from {files} ({sizes} bytes): the training files "
            "changed since this run started. Use a new --run-dir (or delete that folder to cut them again)."
        )
    if tf.io.gfile.exists(directory):  # a cut that was interrupted: it has no index.json
        tf.io.gfile.rmtree(directory)
    tf.io.gfile.makedirs(directory)
    shard_sizes, sample, digests = _cut(files["source"], files["target"], directory, sample_size, seed, pairs_per_shard)
    for suffix, lines in (("src", sample[0]), ("tgt", sample[1])):
        with tf.io.gfile.GFile(os.path.join(directory, f"sample.{suffix}"), "wb") as f:
            f.write(b"".join(lines))
    index = {"files": files, "file_sizes": sizes, "file_mtimes_ns": {side: stat.st_mtime_ns for side, stat in stats.items()},
             "file_sha256": dict(zip(files, digests)), "shard_sizes": shard_sizes, "sample_pairs": len(sample[0]),
             "seed": seed}  # fmt: skip
    with tf.io.gfile.GFile(aside(index_path), "w") as f:
        json.dump(index, f, indent=2)
    tf.io.gfile.rename(aside(index_path), index_path, overwrite=True)  # last: the cut is complete
    return TextFileShards(directory)


def _unchanged(index, files, stats):
    """Whether `files` hold what the cut of `index` read: the same sizes, and the same
    modification times or else the same SHA-256 (a copy). A cut of an earlier version, with
    sizes only, is checked by size."""
    if index["file_sizes"] != {side: stat.st_size for side, stat in stats.items()}:
        return False
    if "file_sha256" not in index or index["file_mtimes_ns"] == {side: stat.st_mtime_ns for side, stat in stats.items()}:
        return True
    return index["file_sha256"] == {side: _sha256(path) for side, path in files.items()}


def _sha256(path):
    """The SHA-256 of a text file's lines as the cut reads them: gunzipped, each ending in a newline."""
    digest, last = hashlib.sha256(), b"\n"
    with open_text(path) as f:
        while block := f.read(_READ_BYTES):
            digest.update(block)
            last = block[-1:]
    if last != b"\n":
        digest.update(b"\n")
    return digest.hexdigest()


def aside(path, tag="tmp"):
    """Where `path` is written before it is renamed into place: DIR/.NAME.TAG. Not DIR/NAME.TAG,
    which some filesystems (TensorFlow's ram://) take for a folder holding DIR/NAME."""
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.{tag}")


# How long a process waits for another's file before it gives up.
WAIT_MINUTES = 60


def wait_for(path, what, minutes=WAIT_MINUTES):
    """Waits until `path` exists: another process (`what` it waits for) makes it in a folder that
    all share. Says so every minute; raises after `minutes`."""
    start = time.monotonic()
    while not tf.io.gfile.exists(path):
        waited = time.monotonic() - start
        if waited > 60 * minutes:
            raise TimeoutError(f"Waited {minutes} minutes for {what} ({path}): do all processes share the run "
                               "folder (a bucket, for several hosts)?")  # fmt: skip
        if waited // 60 > (waited - 1) // 60:
            print(f"Waiting for {what} ({_duration(waited)} so far).", flush=True)
        time.sleep(1)


def open_text(path):
    """A text file for reading bytes, gunzipped on the fly if its name ends in .gz."""
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist.")
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def check_utf8(joined, path, first_line):
    """Raises a ValueError naming `path` and the line if a line of `joined` (whole lines, as
    bytes; the first is line `first_line`) is not UTF-8. Checks them at once: a line at a time is
    slow."""
    try:
        joined.decode("utf-8")
    except UnicodeDecodeError as error:
        line = first_line + joined.count(b"\n", 0, error.start)
        byte = error.start - joined.rfind(b"\n", 0, error.start) - 1
        raise ValueError(f"{path}, line {line}: not valid UTF-8 ({error.reason} at byte {byte}).") from None


def _lines_left(f):
    return sum(1 for _ in f)


def _cut(source_path, target_path, directory, sample_size, seed, pairs_per_shard):
    """The streamed pass of `cut_text_files`; returns (shard sizes, (source sample, target
    sample), the files' `_sha256`), the sample's lines as bytes with their newlines."""
    reservoir, digests = _Reservoir(sample_size, seed), (hashlib.sha256(), hashlib.sha256())
    shard_sizes, out = [], None
    total_bytes = os.path.getsize(source_path)
    progress = Progress(f"Reading {source_path} and {target_path}", None)
    read = 0
    with open_text(source_path) as source_file, open_text(target_path) as target_file:
        while True:
            sources = source_file.readlines(_READ_BYTES)  # lines with their newlines: stripped when read
            targets = list(itertools.islice(target_file, len(sources)))
            if len(targets) < len(sources) or not sources and target_file.readline():  # one file ended first
                source_lines = read + len(sources) + _lines_left(source_file)
                target_lines = read + len(targets) + (not sources) + _lines_left(target_file)
                raise ValueError(f"{source_path} has {source_lines} lines but {target_path} has {target_lines}: "
                                 "the source and target files must be line-aligned.")  # fmt: skip
            if not sources:
                break
            sides = (sources, targets)
            for lines in sides:
                if not lines[-1].endswith(b"\n"):  # the last line of a file
                    lines[-1] += b"\n"
            blocks = [b"".join(lines) for lines in sides]
            check_utf8(blocks[0], source_path, read + 1)
            check_utf8(blocks[1], target_path, read + 1)
            for digest, block in zip(digests, blocks):
                digest.update(block)
            reservoir.add(sources, targets, read)
            start, offsets = 0, [0, 0]
            while start < len(sources):  # fill the current shard, then the next
                if out is None:
                    names = [os.path.join(directory, f"shard-{len(shard_sizes):05d}.{suffix}") for suffix in ("src", "tgt")]
                    out = [tf.io.gfile.GFile(name, "wb") for name in names]
                    shard_sizes.append(0)
                take = min(pairs_per_shard - shard_sizes[-1], len(sources) - start)
                for side, (f, lines, block) in enumerate(zip(out, sides, blocks)):
                    size = len(block) if take == len(lines) else sum(map(len, lines[start : start + take]))
                    f.write(block[offsets[side] : offsets[side] + size] if size < len(block) else block)
                    offsets[side] += size
                shard_sizes[-1] += take
                start += take
                if shard_sizes[-1] == pairs_per_shard:
                    for f in out:
                        f.close()
                    out = None
            read += len(sources)
            position = source_file.fileobj.tell() if hasattr(source_file, "fileobj") else source_file.tell()
            progress.update(read, position / total_bytes)
    if out is not None:
        for f in out:
            f.close()
    if not read:
        raise ValueError(f"{source_path} is empty.")
    progress.finish()
    return shard_sizes, reservoir.sample(), [digest.hexdigest() for digest in digests]


class _Reservoir:
    """A uniform random sample of `size` pairs from a stream, in one pass (Vitter's algorithm R:
    pair n, counted from 1, enters with probability size / n, in a random slot), block by block."""

    def __init__(self, size, seed):
        self.size, self.rng, self.count = size, np.random.default_rng(seed), 0
        self.sides = (np.empty(size, object), np.empty(size, object))

    def add(self, sources, targets, seen):
        """Offers a block of pairs (lists of bytes) after `seen` pairs."""
        fill = max(0, min(self.size - self.count, len(sources)))
        for side, lines in zip(self.sides, (sources, targets)):
            side[self.count : self.count + fill] = lines[:fill]
        self.count += fill
        if fill == len(sources):
            return
        positions = np.arange(seen + fill + 1, seen + len(sources) + 1)
        chosen = np.nonzero(self.rng.random(len(positions)) * positions < self.size)[0] + fill
        slots = self.rng.integers(self.size, size=len(chosen))
        # A slot drawn twice in one block keeps the later pair, as one pair at a time would.
        last = len(slots) - 1 - np.unique(slots[::-1], return_index=True)[1]
        for side, lines in zip(self.sides, (sources, targets)):
            side[slots[last]] = np.array(lines, dtype=object)[chosen[last]]

    def sample(self):
        return tuple(side[: self.count].tolist() for side in self.sides)


class TokenizedShards:
    """The training split tokenized: one TFRecord file per text shard in `directory`, written by
    a background thread while training reads them.

    A record is one pair, little-endian int32 `[len(source), *source, *target]`: the source's
    pieces and end-of-sentence id (`Tokenizer.encode_source`), then the target's pieces.

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
        self.share = list(range(worker, text.num_shards, num_workers))
        self.show_progress = show_progress
        self._writer = None
        self._error = None
        self._stop = threading.Event()

    def path(self, shard):
        return os.path.join(self.directory, f"shard-{shard:05d}.tfrecord")

    def missing(self):
        """The shards of this worker's share not written yet, in the order the first epoch reads them."""
        first_epoch = [int(shard) for shard in self._shard_order()]
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
        for name in tf.io.gfile.listdir(self.directory):  # what a killed process of this host was writing
            host, _, pid = name.partition(".tmp-")[2].rpartition("-")
            if host == _HOST and pid.isdigit() and not _alive(int(pid)):
                tf.io.gfile.remove(os.path.join(self.directory, name))
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
        staging = aside(self.path(shard), f"tmp-{_HOST}-{os.getpid()}")
        tokenizer = self.tokenizer
        batches = self.text.pairs(shard).batch(_TOKENIZE_BATCH).map(
            lambda sources, targets: (tokenizer.encode_source(sources), tokenizer.tokenize(targets)),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        pairs = 0
        with tf.io.TFRecordWriter(staging) as writer:
            for sources, targets in batches:
                if self._stop.is_set():
                    break
                for record in _records(sources, targets):
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
        records = paths.interleave(tf.data.TFRecordDataset, cycle_length=min(cycle_length, len(self.share)), **parallel)
        pairs = records.map(_decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        options = tf.data.Options()
        options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        return pairs.shuffle(shuffle_buffer, seed=self.seed).repeat().with_options(options)


def _records(sources, targets):
    """The records of a batch of tokenized pairs (ragged `[batch, None]` each), as bytes."""
    source_lengths, target_lengths = sources.row_lengths().numpy(), targets.row_lengths().numpy()
    sizes = 1 + source_lengths + target_lengths
    ends = np.cumsum(sizes)
    starts = ends - sizes
    flat = np.empty(ends[-1], "<i4")
    flat[starts] = source_lengths
    source_offsets = np.repeat(starts + 1 - np.concatenate([[0], np.cumsum(source_lengths)[:-1]]), source_lengths)
    flat[source_offsets + np.arange(len(source_offsets))] = sources.flat_values.numpy()
    target_offsets = np.repeat(starts + 1 + source_lengths - np.concatenate([[0], np.cumsum(target_lengths)[:-1]]), target_lengths)
    flat[target_offsets + np.arange(len(target_offsets))] = targets.flat_values.numpy()
    data = flat.tobytes()
    return [data[4 * start : 4 * end] for start, end in zip(starts.tolist(), ends.tolist())]


def _decode(record):
    ids = tf.io.decode_raw(record, tf.int32, little_endian=True)
    return ids[1 : 1 + ids[0]], ids[1 + ids[0] :]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
