"""Token sequences an output must not contain (CTranslate2's `suppress_sequences`): a row may not
take the last token of a sequence whose other tokens it has just output; a sequence of one token
is banned at every step."""

from keras import ops

from keras_transformer.common import take_per_row
from keras_transformer.search.processors import ban, token_mask


def process(log_probs, step, sequences):
    """`sequences`: int32 `[rows, s, length]` (each row's s sequences, padded with 0; a padding
    sequence bans nothing), or `[s, length]` (a tuple of tuples) for every row."""
    if isinstance(sequences, tuple):  # of tuples of different lengths
        span = max(len(sequence) for sequence in sequences)
        sequences = [list(sequence) + [0] * (span - len(sequence)) for sequence in sequences]
    sequences = ops.convert_to_tensor(sequences, "int32")
    rows = ops.shape(step.tokens)[0]
    if len(sequences.shape) == 2:
        sequences = ops.broadcast_to(sequences[None], (rows, *sequences.shape))
    sequences = ops.pad(sequences, ((0, 0), (0, 0), (0, 1)))  # a column of padding: sequences of "" have length 0
    count, span = ops.shape(sequences)[1], ops.shape(sequences)[2]
    sizes = ops.sum(ops.cast(sequences != 0, "int32"), axis=-1, keepdims=True)  # [rows, s, 1]
    p = ops.arange(span, dtype="int32")  # a token's place in its sequence
    needed = p < sizes - 1  # [rows, s, span]: the tokens before the last
    index = ops.convert_to_tensor(step.index, "int32")
    position = index - (sizes - 2 - p)  # [rows, s, span]: where the output must hold token p
    found = take_per_row(step.tokens, ops.reshape(ops.clip(position, 0, index), (rows, count * span)))  # [rows, s * span]
    found = ops.where(position >= 1, ops.reshape(found, ops.shape(position)), -1)  # before the output: no match
    matched = ops.all(~needed | (found == sequences), axis=-1) & (sizes[..., 0] >= 1)  # [rows, s]
    # No -1 in these shapes: s or span may be 0.
    last = take_per_row(ops.reshape(sequences, (rows * count, span)), ops.reshape(ops.maximum(sizes - 1, 0), (rows * count, 1)))
    return ban(log_probs, token_mask(ops.reshape(last, (rows, count)), matched, ops.shape(log_probs)[-1]))
