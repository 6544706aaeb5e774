"""The record of one tokenized training pair, as the tokenized shards store it (TFRecord files):
little-endian int32 `[len(source), *source, *target]`, the source's pieces and end-of-sentence
id (`Tokenizer.encode_source`), then the target's pieces."""

import numpy as np
import tensorflow as tf


def encode(sources, targets):
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


def decode(record):
    ids = tf.io.decode_raw(record, tf.int32, little_endian=True)
    return ids[1 : 1 + ids[0]], ids[1 + ids[0] :]
