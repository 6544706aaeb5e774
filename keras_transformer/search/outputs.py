"""The output sequences a search writes: how long each may grow, a token written at a step, and
the result cut at the end of sentence."""

from keras import ops

from keras_transformer.common import PAD_ID


def length_limits(model, source_ids, settings, max_length, static=False):
    """Per sentence: at most `max_length_a * (its source length) + max_length_b` tokens (the
    settings' options, each a number or `[batch]`), capped by `max_length` and by a learned
    position table's size; and the loop's step count: the same for the padded source length,
    a Python int where that length and the options are static (as XLA and JAX need), else the
    batch's longest limit. With `static` (a preallocated cache) the count must be an int: for
    per-sentence options, the cap."""
    a, b = settings.max_length_a, settings.max_length_b
    caps = [max_length] if max_length is not None else []
    if model.config.positional_encoding == "learned":
        caps.append(model.config.max_length)
    source_lengths = ops.sum(ops.cast(source_ids != PAD_ID, "int32"), axis=1)
    limit = ops.cast(ops.floor(ops.cast(source_lengths, "float32") * a), "int32") + b  # [batch]
    padded = ops.shape(source_ids)[1]
    if isinstance(padded, int) and isinstance(a, (int, float)) and isinstance(b, int):
        steps = int(padded * a) + b
    elif isinstance(a, (int, float)) and isinstance(b, int):
        steps = ops.cast(ops.floor(ops.cast(padded, "float32") * a), "int32") + b
    else:
        steps = ops.max(ops.concatenate([ops.broadcast_to(limit, (ops.shape(source_ids)[0],)), ops.ones((1,), "int32")]))
    for cap in caps:
        limit = ops.minimum(limit, cap)
        steps = min(steps, cap) if isinstance(steps, int) else ops.minimum(steps, cap)
    if static and not isinstance(steps, int):
        if not caps:
            raise ValueError("Per-sentence max_length_a / max_length_b under a compiled search need max_length, a cap "
                             "on the output's length that sizes its cache.")  # fmt: skip
        steps = min(caps)
    return ops.maximum(limit, 1), steps


def per_sentence(value, batch, dtype):
    """An option's value (a number, or `[batch]`) as `[batch]` of `dtype`."""
    return ops.broadcast_to(ops.convert_to_tensor(value, dtype), (batch,))


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
