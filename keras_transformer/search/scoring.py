"""Scoring given translations: a target's log-probability under the model, in total and per token,
and the length-penalised score a search ranks it by (CTranslate2's `score_batch`, fairseq's
`--score-reference`, `marian-scorer`): for reranking n-best lists, quality estimation, filtering
back-translated data. One teacher-forced pass of the decoder, not a search."""

import collections

from keras import ops

from keras_transformer.common import BOS_ID, PAD_ID, take_per_row
from keras_transformer.search.settings import DecodingSettings, length_penalty

ROWS_AT_ONCE = 64  # 64 x vocab float32 logits fit a core's cache for vocabularies to 32k (bench/README.md)

ScoreResult = collections.namedtuple("ScoreResult", ["log_prob", "score", "token_log_probs", "length"])
ScoreResult.__doc__ = """Output of `score`.

log_prob: float32 `[batch]`, log P(Y | X), the end of sentence included.
score: float32 `[batch]`, log P(Y | X) / lp(|Y|): a search's score of Y.
token_log_probs: float32 `[batch, target_len]`, each target token's log-probability, 0 on padding.
length: int32 `[batch]`, |Y|, the target's tokens with the end of sentence.
"""


def score(model, source_ids, target_ids, alpha=DecodingSettings.alpha, rows_at_once=ROWS_AT_ONCE):
    """Scores `target_ids` as translations of `source_ids` under `model` (a `Transformer`).

    Args:
        source_ids: int32 `[batch, source_len]`, each source ending with the end of sentence,
            padded with 0.
        target_ids: int32 `[batch, target_len]`, each target's tokens then the end of sentence,
            padded with 0 (as `Tokenizer.encode_source` encodes text).
        alpha: the length penalty's exponent (a number, or `[batch]`).
        rows_at_once: the target positions whose logits are made at a time.

    Returns:
        A `ScoreResult`. For an output a search returned that ends with the end of sentence, its
        score equals the search's (without decoding options that change values).
    """
    target_ids = ops.convert_to_tensor(target_ids, "int32")
    batch, target_len = ops.shape(target_ids)[0], ops.shape(target_ids)[1]
    inputs = ops.concatenate([ops.full((batch, 1), BOS_ID, "int32"), target_ids[:, :-1]], axis=1)  # [batch, target_len]
    encoder_output, source_mask = model.encode(ops.convert_to_tensor(source_ids, "int32"), training=False)
    states = model.decoder_states(inputs, encoder_output, source_mask, training=False)  # [batch, target_len, d_model]
    real = target_ids != PAD_ID  # [batch, target_len]
    token = _log_probs(model, ops.reshape(states, (batch * target_len, -1)), ops.reshape(target_ids, (-1,)),
                       ops.reshape(real, (-1,)), rows_at_once)  # fmt: skip
    token = ops.reshape(token, (batch, target_len))
    length = ops.sum(ops.cast(real, "int32"), axis=1)  # [batch]
    log_prob = ops.sum(token, axis=1)  # [batch]
    return ScoreResult(log_prob, log_prob / length_penalty(length, alpha), token, length)


def _log_probs(model, states, targets, real, rows_at_once):
    """Each real row's log P(target) from the decoder's output there, 0 at padding: `[rows]` from
    `states` `[rows, d_model]`, `targets` and `real` `[rows]`.

    The real rows are packed first, and their logits made `rows_at_once` rows at a time: a block's
    logits stay in a core's cache through the normaliser's passes, about twice as fast on CPUs as
    one matmul over the batch (bench/README.md), and blocks of padding are never made. The logits
    are a search's (`Transformer.logits_projection`): its distribution leaves padding out."""
    rows, width = ops.shape(states)[0], ops.shape(states)[1]
    blocks = rows // rows_at_once + 1  # enough, and never none: TensorFlow refuses a scatter into nothing
    count = ops.cumsum(ops.cast(real, "int32"))  # [rows]
    real_rows = ops.sum(ops.cast(real, "int32"))
    place = ops.where(real, count - 1, real_rows + ops.arange(rows, dtype="int32") - count)  # a permutation of the rows
    packed_states = ops.scatter(place[:, None], states, (blocks * rows_at_once, width))
    packed_targets = ops.scatter(place[:, None], targets, (blocks * rows_at_once,))
    kernel, bias = model.logits_projection(states.dtype)

    def block(i, log_probs):
        start = i * rows_at_once
        logits = ops.cast(ops.matmul(ops.slice(packed_states, (start, 0), (rows_at_once, width)), kernel), "float32") + bias
        chosen = take_per_row(logits, ops.slice(packed_targets, (start,), (rows_at_once,))[:, None])[:, 0]
        # A scatter, not slice_update: TensorFlow's is an XLA op, which stock TF Serving lacks.
        return ops.scatter_update(log_probs, ops.reshape(i, (1, 1)), (chosen - ops.logsumexp(logits, axis=-1))[None])

    real_blocks = (real_rows + rows_at_once - 1) // rows_at_once
    log_probs = ops.fori_loop(0, real_blocks, block, ops.zeros((blocks, rows_at_once), "float32"))
    return ops.where(real, ops.take(ops.reshape(log_probs, (-1,)), place), 0.0)
