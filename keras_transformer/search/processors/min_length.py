"""A minimum length (fairseq's `--min-len`): no end of sentence before a row has `min_length`
output tokens. A length limit below it still ends the output there."""

from keras import ops

from keras_transformer.common import EOS_ID
from keras_transformer.search.processors import ban, column


def process(log_probs, step, min_length):
    """Bans the end of sentence while `step.index` (the tokens output so far) < `min_length`
    (int, or int32 `[rows]`)."""
    too_short = column(ops.convert_to_tensor(step.index) < min_length)
    return ban(log_probs, too_short & (ops.arange(ops.shape(log_probs)[-1]) == EOS_ID))
