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

    def __init__(self, vocab_size, d_model, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.d_model = d_model

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            initializer=keras.initializers.RandomNormal(stddev=self.d_model**-0.5),
        )

    def call(self, token_ids):
        vectors = ops.take(self.embeddings, token_ids, axis=0)
        return vectors * ops.cast(math.sqrt(self.d_model), vectors.dtype)

    def logits(self, hidden):
        """`hidden E^T`: `[..., d_model]` -> float32 logits `[..., vocab]`."""
        matrix = ops.cast(self.embeddings, hidden.dtype)
        return ops.cast(ops.matmul(hidden, ops.transpose(matrix)), "float32")

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "d_model": self.d_model}
