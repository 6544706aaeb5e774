"""Label-smoothed cross-entropy over non-padding target tokens (section 5.4), in `keras.ops`, so
that both backends' training steps share it."""

from keras import ops

from keras_transformer import PAD_ID


def smoothed_cross_entropy(labels, logits, smoothing=0.1):
    """Summed label-smoothed cross-entropy of the real (non-padding) tokens, and their count.

    The target distribution puts `1 - smoothing` on the label and spreads `smoothing` evenly
    over the whole vocabulary, as `keras.losses.CategoricalCrossentropy(label_smoothing=...)`
    does: `loss = (1 - smoothing) * -log p(label) + smoothing * mean_k(-log p(k))`.

    Args:
        labels: int `[batch, length]`; 0 is padding and adds nothing.
        logits: float `[batch, length, vocab]`.
        smoothing: epsilon_ls, 0.1 in the paper.

    Returns:
        (float32 loss summed over real tokens, float32 number of real tokens). Divide the first by
        the second over the whole (global) batch for the mean.
    """
    log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
    label_log_probs = ops.take_along_axis(log_probs, ops.expand_dims(ops.cast(labels, "int32"), -1), axis=-1)[..., 0]
    per_token = -(1.0 - smoothing) * label_log_probs - smoothing * ops.mean(log_probs, axis=-1)
    real = ops.cast(ops.not_equal(labels, PAD_ID), "float32")
    return ops.sum(per_token * real), ops.sum(real)
