"""The output sequences a search writes: how long each may grow, a token written at a step, and
the result cut at the end of sentence."""

from keras import ops

from keras_transformer.common import PAD_ID


def length_limits(model, source_ids, max_extra_length, max_length):
    """Per sentence: its real source length + `max_extra_length`, capped by `max_length` and
    by a learned position table's size; and the loop's step count (the same for the padded
    source length; a Python int where that length is static, as under XLA and JAX)."""
    caps = [max_length] if max_length is not None else []
    if model.config.positional_encoding == "learned":
        caps.append(model.config.max_length)
    source_lengths = ops.sum(ops.cast(source_ids != PAD_ID, "int32"), axis=1)
    limit = source_lengths + max_extra_length
    steps = ops.shape(source_ids)[1] + max_extra_length
    for cap in caps:
        limit = ops.minimum(limit, cap)
        steps = min(steps, cap) if isinstance(steps, int) else ops.minimum(steps, cap)
    return ops.maximum(limit, 1), steps


def start_tokens(shape, steps, bos_id):
    """int32 `[*shape, steps + 1]`: the begin-of-sentence id, then room for `steps` tokens."""
    return ops.concatenate([ops.full((*shape, 1), bos_id, "int32"), ops.zeros((*shape, steps), "int32")], axis=-1)


def write_column(sequences, column, values):
    """`sequences[..., column] = values`, without changing any shape."""
    return ops.where(ops.arange(ops.shape(sequences)[-1]) == column, values[..., None], sequences)


def strip(tokens, eos_id):
    """Replaces the end-of-sentence id and everything after it by padding."""
    ended = ops.cumsum(ops.cast(tokens == eos_id, "int32"), axis=-1) > 0
    return ops.where(ended, PAD_ID, tokens)
