"""The encoder: a stack of self-attention + feed-forward layers (section 3.1)."""

import keras

from keras_transformer.residual import ResidualLayer, Stack


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(ResidualLayer):
    """Self-attention, then the feed-forward network, each as `LayerNorm(x + Dropout(Sublayer(x)))`.

    Post-norm residual blocks as in section 3.1, residual dropout as in section 5.4.

    Args:
        num_heads: attention heads; each has d_model / num_heads dimensions.
        d_ff: inner width of the feed-forward network.
        dropout: P_drop on each sub-layer's output.
        attention_dropout: dropout on the attention weights.
        relu_dropout: dropout on the feed-forward network's inner activations.
        activation: the feed-forward network's, "relu" (the paper's) or "swish".
        layer_norm_epsilon: the LayerNorms' epsilon.

    Call arguments:
        inputs: `[batch, source_len, d_model]`.
        padding_mask: boolean `[batch, 1, source_len]`, True at real tokens.
        training: whether dropout is on.

    Returns:
        `[batch, source_len, d_model]`.

    Example:
    >>> layer = EncoderLayer(num_heads=8, d_ff=2048)
    >>> layer(keras.random.normal((2, 10, 512))).shape
    (2, 10, 512)
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.self_attention_norm = self.norm()
        self.feed_forward_norm = self.norm()

    def build(self, input_shape):
        self.self_attention = self.attention("self_attention", input_shape)
        for sublayer in (self.self_attention_norm, self.feed_forward, self.feed_forward_norm):
            sublayer.build(input_shape)

    def call(self, inputs, padding_mask=None, training=None):
        x = inputs
        attended = self.self_attention(x, x, attention_mask=padding_mask, training=training)
        x = self.residual(self.self_attention_norm, x, attended, training)
        return self.residual(self.feed_forward_norm, x, self.feed_forward(x, training=training), training)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(Stack):
    """N `EncoderLayer`s after dropout on the embedding + position sums (sections 3.1, 5.4).

    Args:
        num_layers: N.
        num_heads, d_ff, dropout, attention_dropout, relu_dropout, activation,
            layer_norm_epsilon: as for `EncoderLayer`.

    Call arguments:
        inputs: embedded source with positions added, `[batch, source_len, d_model]`.
        padding_mask: boolean `[batch, 1, source_len]`, True at real tokens.
        training: whether dropout is on.

    Returns:
        The encoder output z, `[batch, source_len, d_model]`.
    """

    layer_class = EncoderLayer

    def call(self, inputs, padding_mask=None, training=None):
        x = self.input_dropout(inputs, training=training)
        for layer in self.layers:
            x = layer(x, padding_mask=padding_mask, training=training)
        return x
