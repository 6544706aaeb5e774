"""What several modules share: the special token ids, a fresh copy of an initializer, and a
per-row gather."""

from keras import ops

# The special ids every tokenizer of this project uses (training/tokenizer.py trains to them).
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3

# The logit or score of what must never be chosen: a masked position, padding, a dead hypothesis.
NEG_INF = -1e9


def fresh_initializer(initializer):
    """A new instance of `initializer`: one Keras initializer instance without a seed gives the
    same values at every call, so each weight needs its own."""
    return initializer.__class__.from_config(initializer.get_config())


def take_per_row(values, indices):
    """`values[r, indices[r, j]]` for `values` `[rows, n, ...]` and int `indices` `[rows, m]`:
    `[rows, m, ...]`, as one gather (TensorFlow's `take_along_axis` transposes both)."""
    rows, n = ops.shape(values)[0], ops.shape(values)[1]
    flat = ops.reshape(values, (-1, *ops.shape(values)[2:]))
    return ops.take(flat, ops.cast(indices, "int32") + ops.arange(rows, dtype="int32")[:, None] * n, axis=0)
