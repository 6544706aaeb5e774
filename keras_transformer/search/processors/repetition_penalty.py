"""A penalty on the tokens a row has output already (the CTRL paper's, as CTranslate2 and
Hugging Face define it): a value v of such a token becomes `v * penalty` where v < 0 and
`v / penalty` otherwise. The values here are log-probabilities (as in Hugging Face's beam
search), all <= 0: a seen token's log P is multiplied by the penalty, so a penalty above 1 makes
repeating less likely and one below 1 more. The penalty counts in the search's score."""

from keras import ops

from keras_transformer.common import NEG_INF
from keras_transformer.search.processors import column, generated


def process(log_probs, step, penalty):
    """`penalty`: float > 0, or float32 `[rows]`; 1 changes nothing."""
    penalty = column(penalty)
    penalised = ops.where(log_probs < 0, log_probs * penalty, log_probs / penalty)
    seen = generated(step, ops.shape(log_probs)[-1]) & (log_probs > NEG_INF / 2)  # a banned token stays banned
    return ops.where(seen, penalised, log_probs)
