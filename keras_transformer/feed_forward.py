"""Position-wise feed-forward network (section 3.3)."""

import keras

from keras_transformer.common import fresh_initializer


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionwiseFeedForward(keras.layers.Layer):
    """`FFN(x) = max(0, x W_1 + b_1) W_2 + b_2`, applied to each position alike (eq. 2).

    Args:
        d_ff: the inner width (2048 in the base model).
        dropout: dropout on the inner activations `max(0, x W_1 + b_1)` (0 in the paper; the
            Tensor2Tensor code's "relu dropout").
        activation: the paper's "relu" (`max(0, .)`), or "swish" (`x sigmoid(x)`, Marian's and
            OPUS-MT's).
        kernel_initializer: initializer of W_1 and W_2.

    Call arguments:
        inputs: `[batch, length, d_model]`.
        training: whether dropout is on.

    Returns:
        `[batch, length, d_model]`.

    Example:
    >>> ffn = PositionwiseFeedForward(d_ff=2048)
    >>> ffn(keras.random.normal((2, 10, 512))).shape
    (2, 10, 512)
    """

    def __init__(self, d_ff, dropout=0.0, activation="relu", kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.d_ff = d_ff
        self.dropout = dropout
        self.activation = activation
        self.dropout_layer = keras.layers.Dropout(dropout)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.inner = keras.layers.Dense(
            d_ff, activation=activation, kernel_initializer=fresh_initializer(self.kernel_initializer), name="inner"
        )
        self.outer = None

    def build(self, input_shape):
        self.outer = keras.layers.Dense(
            input_shape[-1], kernel_initializer=fresh_initializer(self.kernel_initializer), name="outer"
        )
        self.inner.build(input_shape)
        self.outer.build((*input_shape[:-1], self.d_ff))

    def call(self, inputs, training=None):
        return self.outer(self.dropout_layer(self.inner(inputs), training=training))

    def get_config(self):
        return {
            **super().get_config(),
            "d_ff": self.d_ff,
            "dropout": self.dropout,
            "activation": self.activation,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }
