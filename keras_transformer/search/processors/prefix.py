"""A target prefix (forced decoding): each sentence's output starts with given tokens, and the
search continues from them, for interactive translation, autocompletion or a required opening
(CTranslate2's `target_prefix`). A forced token counts in the score with the log-probability the
model gives it, as any other token, whatever the decoding options would do to it."""

from keras import ops

from keras_transformer.common import NEG_INF, PAD_ID


def forced_tokens(target_prefix, index):
    """The token each row must take after position `index`, and whether it must.

    Args:
        target_prefix: int32 `[rows, prefix_len]`, each prefix padded with 0 (no begin- or
            end-of-sentence id; `prefix_len` may be 0).
        index: int32 scalar, the position a step decodes from.

    Returns:
        int32 `[rows]` (0 past a row's prefix) and bool `[rows]`.
    """
    # A column of padding past the longest prefix, where every later step reads.
    padded = ops.pad(ops.convert_to_tensor(target_prefix, "int32"), ((0, 0), (0, 1)))
    column = ops.take(padded, ops.minimum(index, ops.shape(padded)[1] - 1), axis=1)  # [rows]
    return column, column != PAD_ID


def process(log_probs, step, target_prefix):
    """Where a row is forced: `NEG_INF` for every token but the prefix's, which keeps the model's
    log-probability. `target_prefix`: int32 `[rows, prefix_len]`."""
    token, forced = forced_tokens(target_prefix, step.index)  # [rows] each
    vocab = ops.arange(ops.shape(log_probs)[-1], dtype="int32")
    forced_row = ops.where(vocab == token[:, None], step.model_log_probs, NEG_INF)  # [rows, vocab]
    return ops.where(forced[:, None], forced_row, log_probs)
