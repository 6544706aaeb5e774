"""Label-smoothed cross-entropy over non-padding target tokens (section 5.4)."""

import tensorflow as tf

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
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
    label_log_probs = tf.gather(log_probs, labels, batch_dims=2)
    per_token = -(1.0 - smoothing) * label_log_probs - smoothing * tf.reduce_mean(log_probs, axis=-1)
    real = tf.cast(labels != PAD_ID, tf.float32)
    return tf.reduce_sum(per_token * real), tf.reduce_sum(real)
