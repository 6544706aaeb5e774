"""The plumbing of encoder and decoder layers (sections 3.1, 5.4): the post-norm residual
sub-layer `LayerNorm(x + Dropout(Sublayer(x)))`, and a stack of N identical layers."""

import keras

from keras_transformer.attention import MultiHeadAttention
from keras_transformer.config import LAYER_NORM_EPSILON
from keras_transformer.feed_forward import PositionwiseFeedForward

# The settings of every encoder and decoder layer, which a stack passes to each of its layers.
SETTINGS = ("num_heads", "d_ff", "dropout", "attention_dropout", "relu_dropout", "activation", "layer_norm_epsilon")


class ResidualLayer(keras.layers.Layer):
    """What encoder and decoder layers share: their settings, and the sub-layer pattern
    `LayerNorm(x + Dropout(Sublayer(x)))` (sections 3.1 and 5.4)."""

    def __init__(self, num_heads, d_ff, dropout=0.1, attention_dropout=0.0, relu_dropout=0.0, activation="relu",
                 layer_norm_epsilon=LAYER_NORM_EPSILON, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.relu_dropout = relu_dropout
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.dropout_layer = keras.layers.Dropout(dropout)
        self.feed_forward = PositionwiseFeedForward(d_ff, dropout=relu_dropout, activation=activation)

    def norm(self):
        """A new LayerNorm of this layer's epsilon."""
        return keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon)

    def attention(self, name, input_shape):
        """A built `MultiHeadAttention` with d_model / num_heads dimensions per head."""
        d_model = input_shape[-1]
        if d_model % self.num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={self.num_heads}.")
        layer = MultiHeadAttention(self.num_heads, d_model // self.num_heads, dropout=self.attention_dropout, name=name)
        layer.build(input_shape)
        return layer

    def residual(self, norm, inputs, sublayer_output, training):
        return norm(inputs + self.dropout_layer(sublayer_output, training=training))

    def get_config(self):
        return {**super().get_config(), **{name: getattr(self, name) for name in SETTINGS}}


class Stack(keras.layers.Layer):
    """N identical layers after dropout on the embedding + position sums (sections 3.1, 5.4);
    the encoder's and the decoder's stacks set `layer_class`."""

    layer_class = None

    def __init__(self, num_layers, num_heads, d_ff, dropout=0.1, attention_dropout=0.0, relu_dropout=0.0,
                 activation="relu", layer_norm_epsilon=LAYER_NORM_EPSILON, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.relu_dropout = relu_dropout
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.input_dropout = keras.layers.Dropout(dropout)
        settings = {name: getattr(self, name) for name in SETTINGS}
        self.layers = [self.layer_class(**settings, name=f"layer_{i}") for i in range(num_layers)]
        for index, layer in enumerate(self.layers):  # tf.train.Checkpoint sees attributes, not Keras' lists
            setattr(self, f"layer_{index}", layer)

    def build(self, input_shape):
        for layer in self.layers:
            layer.build(input_shape)

    def get_config(self):
        settings = {name: getattr(self, name) for name in SETTINGS}
        return {**super().get_config(), "num_layers": self.num_layers, **settings}
