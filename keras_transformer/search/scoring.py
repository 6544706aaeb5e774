"""Scoring given translations: a target's log-probability under the model, in total and per token,
and the length-penalised score a search ranks it by (CTranslate2's `score_batch`, fairseq's
`--score-reference`, `marian-scorer`): for reranking n-best lists, quality estimation, filtering
back-translated data. One teacher-forced pass of the decoder, not a search."""

import collections

from keras import ops

from keras_transformer.common import BOS_ID, PAD_ID, take_per_row
from keras_transformer.search.settings import DecodingSettings, length_penalty

ScoreResult = collections.namedtuple("ScoreResult", ["log_prob", "score", "token_log_probs", "length"])
ScoreResult.__doc__ = """Output of `score`.

log_prob: float32 `[batch]`, log P(Y | X), the end of sentence included.
score: float32 `[batch]`, log P(Y | X) / lp(|Y|): a search's score of Y.
token_log_probs: float32 `[batch, target_len]`, each target token's log-probability, 0 on padding.
length: int32 `[batch]`, |Y|, the target's tokens with the end of sentence.
"""


def score(model, source_ids, target_ids, alpha=DecodingSettings.alpha):
    """Scores `target_ids` as translations of `source_ids` under `model` (a `Transformer`).

    Args:
        source_ids: int32 `[batch, source_len]`, each source ending with the end of sentence,
            padded with 0.
        target_ids: int32 `[batch, target_len]`, each target's tokens then the end of sentence,
            padded with 0 (as `Tokenizer.encode_source` encodes text).
        alpha: the length penalty's exponent (a number, or `[batch]`).

    Returns:
        A `ScoreResult`. For an output a search returned that ends with the end of sentence, its
        score equals the search's (without decoding options that change values).
    """
    target_ids = ops.convert_to_tensor(target_ids, "int32")
    batch = ops.shape(target_ids)[0]
    inputs = ops.concatenate([ops.full((batch, 1), BOS_ID, "int32"), target_ids[:, :-1]], axis=1)  # [batch, target_len]
    logits = ops.cast(model((ops.convert_to_tensor(source_ids, "int32"), inputs), training=False), "float32")
    every = ops.logsumexp(logits, axis=-1)  # [batch, target_len]
    # Padding is never generated: a search's distribution leaves it out (the model's decode_step).
    log_normaliser = every + ops.log1p(-ops.exp(logits[..., PAD_ID] - every))  # [batch, target_len]
    vocab, length = ops.shape(logits)[-1], ops.shape(target_ids)[1]
    chosen = take_per_row(ops.reshape(logits, (-1, vocab)), ops.reshape(target_ids, (-1, 1)))  # [batch * target_len, 1]
    real = target_ids != PAD_ID  # [batch, target_len]
    token = ops.where(real, ops.reshape(chosen, (batch, length)) - log_normaliser, 0.0)  # [batch, target_len]
    length = ops.sum(ops.cast(real, "int32"), axis=1)  # [batch]
    log_prob = ops.sum(token, axis=1)  # [batch]
    return ScoreResult(log_prob, log_prob / length_penalty(length, alpha), token, length)
