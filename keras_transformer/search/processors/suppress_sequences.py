"""Token sequences an output must not contain (CTranslate2's `suppress_sequences`): a row may not
take the last token of a sequence whose other tokens it has just output; a sequence of one token
is banned at every step."""

from keras import ops

from keras_transformer.search.processors import ban, token_mask


def process(log_probs, step, sequences):
    """`sequences`: int32 `[rows, s, length]` (each row's s sequences, padded with 0; a padding
    sequence bans nothing), or `[s, length]` (a tuple of tuples) for every row."""
    if isinstance(sequences, tuple):  # of tuples of different lengths
        span = max(len(sequence) for sequence in sequences)
        sequences = [list(sequence) + [0] * (span - len(sequence)) for sequence in sequences]
    sequences = ops.convert_to_tensor(sequences, "int32")
    if len(sequences.shape) == 2:
        sequences = ops.broadcast_to(sequences[None], (ops.shape(step.tokens)[0], *sequences.shape))
    span = sequences.shape[-1] if sequences.shape[-1] is not None else ops.shape(sequences)[-1]
    sizes = ops.sum(ops.cast(sequences != 0, "int32"), axis=-1)  # [rows, s]
    back = ops.arange(span, dtype="int32")  # d: compare position index - d with the sequence's token size - 2 - d
    index = ops.convert_to_tensor(step.index, "int32")
    recent = ops.take(step.tokens, ops.maximum(index - back, 0), axis=1)  # [rows, span]
    recent = ops.where(index - back >= 1, recent, -1)  # before the output: matches nothing
    wanted = ops.take_along_axis(sequences, ops.maximum(sizes[..., None] - 2 - back, 0), axis=2)  # [rows, s, span]
    needed = back < sizes[..., None] - 1  # [rows, s, span]: the d that the sequence's other tokens cover
    matched = ops.all(~needed | (recent[:, None, :] == wanted), axis=-1) & (sizes >= 1)  # [rows, s]
    last = ops.take_along_axis(sequences, ops.maximum(sizes - 1, 0)[..., None], axis=2)[..., 0]  # [rows, s]
    return ban(log_probs, token_mask(last, matched, ops.shape(log_probs)[-1]))
