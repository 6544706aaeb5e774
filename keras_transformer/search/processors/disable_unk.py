"""No unknown token in the output (CTranslate2's `disable_unk`)."""

from keras import ops

from keras_transformer.common import UNK_ID
from keras_transformer.search.processors import ban, column


def process(log_probs, step, disable_unk):
    """Bans the unknown token's id where `disable_unk` (bool, or bool `[rows]`)."""
    return ban(log_probs, column(disable_unk) & (ops.arange(ops.shape(log_probs)[-1]) == UNK_ID))
