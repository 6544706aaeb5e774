"""The cut of a folder's training files: one streamed pass over two line-aligned text files
(plain or .gz) writes them as shards of `PAIRS_PER_SHARD` pairs (`shards.TextFileShards`),
checks every line (line counts, UTF-8) and draws the tokenizer's sample with a seeded
reservoir. Nothing grows with the files but the shards on disk.

Every file is written before the cut's index.json, which marks it complete: a run killed while
cutting leaves nothing that a later run trusts.
"""

import hashlib
import itertools
import json
import os

import numpy as np
import tensorflow as tf

from training.files import aside, check_utf8, open_text, wait_for
from training.progress import Progress
from training.shards import PAIRS_PER_SHARD, TOKENIZER_SAMPLE, TextFileShards

_READ_BYTES = 1 << 20  # lines read from a text file at a time (about)


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
