"""A target prefix (forced decoding): each sentence's output starts with given tokens, and the
search continues from them, for interactive translation, autocompletion or a required opening
(CTranslate2's `target_prefix`). A forced token counts in the score with the log-probability the
model gives it, as any other token."""

from keras import ops

from keras_transformer.common import NEG_INF, PAD_ID
from keras_transformer.search.active import to_batch
from keras_transformer.search.top_k import token_log_probs


def forced_tokens(target_prefix, index):
    """The token each sentence must take after position `index`, and whether it must.

    Args:
        target_prefix: int32 `[batch, prefix_len]`, each sentence's prefix padded with 0 (no
            begin- or end-of-sentence id; `prefix_len` may be 0).
        index: int32 scalar, the position a step decodes from.

    Returns:
        int32 `[batch]` (0 past a sentence's prefix) and bool `[batch]`.
    """
    # A column of padding past the longest prefix, where every later step reads.
    padded = ops.pad(ops.convert_to_tensor(target_prefix, "int32"), ((0, 0), (0, 1)))
    column = ops.take(padded, ops.minimum(index, ops.shape(padded)[1] - 1), axis=1)  # [batch]
    return column, column != PAD_ID


def force(logits, best_log_prob, best_token, target_prefix, index, active, execution):
    """A step's candidate extensions with the prefix's token forced where a sentence has one.

    Args:
        logits: float32 `[a * k, vocab]`, the active sentences' k hypotheses' next-token logits.
        best_log_prob, best_token: `[batch, k, n]`, each hypothesis's n candidate extensions.
        target_prefix, index: as `forced_tokens`.
        active: int32 `[a]`, the sentences `logits` belongs to.
        execution: the search's `Execution`.

    Returns:
        `best_log_prob`, `best_token`, where a sentence is forced: the forced token as each
        hypothesis's first candidate, with its log-probability, and no other candidate (`NEG_INF`).
    """
    token, forced = forced_tokens(target_prefix, index)  # [batch] each
    batch, k, n = ops.shape(best_token)
    rows_token = ops.repeat(ops.take(token, active), k)  # [a * k]
    log_prob = to_batch(token_log_probs(logits, rows_token)[:, None], active, batch, k, execution)  # [batch, k, 1]
    first = ops.arange(n) == 0  # [n]
    forced = forced[:, None, None]  # [batch, 1, 1]
    best_token = ops.where(forced, ops.where(first, token[:, None, None], PAD_ID), best_token)
    best_log_prob = ops.where(forced, ops.where(first, log_prob, NEG_INF), best_log_prob)
    return best_log_prob, best_token
