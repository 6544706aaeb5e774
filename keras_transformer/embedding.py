"""Shared token embedding and pre-softmax projection (section 3.4)."""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class SharedEmbedding(keras.layers.Layer):
    """One matrix `E` `[vocab, d_model]` for source tokens, target tokens and output logits.

    Section 3.4: the two embedding layers and the pre-softmax linear transformation share one
    weight matrix, and the embeddings are multiplied by sqrt(d_model). `E` starts with standard
    deviation d_model^-0.5, so scaled embeddings start near unit variance, on the scale of the
    positional encodings they are added to.

    Args:
        vocab_size: the shared vocabulary's size.
        d_model: the embedding width.
        logits_bias: add a trained bias `b` `[vocab]` to the logits, `hidden E^T + b`
            (Marian's; the paper's projection has none).

    Call arguments:
        token_ids: integer `[batch, length]`.

    Returns:
        `E[token_ids] * sqrt(d_model)`, `[batch, length, d_model]`.

    Example:
    >>> embedding = SharedEmbedding(vocab_size=100, d_model=16)
    >>> x = embedding(ops.array([[5, 7, 0]]))
    >>> embedding.logits(x).shape
    (1, 3, 100)
    """

    def __init__(self, vocab_size, d_model, logits_bias=False, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.logits_bias = logits_bias

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            initializer=keras.initializers.RandomNormal(stddev=self.d_model**-0.5),
        )
        if self.logits_bias:
            self.bias = self.add_weight(name="bias", shape=(self.vocab_size,), initializer="zeros")

    def call(self, token_ids):
        vectors = ops.take(self.embeddings, token_ids, axis=0)
        return vectors * ops.cast(math.sqrt(self.d_model), vectors.dtype)

    def logits(self, hidden):
        """`hidden E^T` (+ the bias): `[..., d_model]` -> float32 logits `[..., vocab]`."""
        matrix = ops.cast(self.embeddings, hidden.dtype)
        logits = ops.cast(ops.matmul(hidden, ops.transpose(matrix)), "float32")
        return logits + ops.cast(self.bias, "float32") if self.logits_bias else logits

    def bias_or_zeros(self):
        """The logits' bias, float32 `[vocab]`: the trained one, or zeros."""
        if self.logits_bias:
            return ops.cast(self.bias, "float32")
        return ops.zeros((self.vocab_size,), "float32")

    def get_config(self):
        settings = {"vocab_size": self.vocab_size, "d_model": self.d_model, "logits_bias": self.logits_bias}
        return {**super().get_config(), **settings}
