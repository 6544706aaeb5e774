"""The decoder: a stack of masked self-attention, encoder-decoder attention and feed-forward
layers (section 3.1), with a cached step for decoding one position at a time (its cache:
keras_transformer/cache.py)."""

import keras
from keras import ops

from keras_transformer.cache import GrowingCache, StaticCache
from keras_transformer.residual import ResidualLayer, Stack


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(ResidualLayer):
    """Masked self-attention, encoder-decoder attention, then the feed-forward network, each as
    `LayerNorm(x + Dropout(Sublayer(x)))` (sections 3.1, 3.2.3, 5.4).

    `call` sees the whole target at once and masks later positions (training, full forward
    passes); `decode_step` advances one position from a cache (keras_transformer/cache.py).

    Args:
        num_heads: attention heads; each has d_model / num_heads dimensions.
        d_ff: inner width of the feed-forward network.
        dropout: P_drop on each sub-layer's output.
        attention_dropout: dropout on the attention weights.
        relu_dropout: dropout on the feed-forward network's inner activations.
        activation: the feed-forward network's, "relu" (the paper's) or "swish".
        layer_norm_epsilon: the LayerNorms' epsilon.

    Call arguments:
        inputs: `[batch, target_len, d_model]`.
        encoder_output: `[batch, source_len, d_model]`.
        source_mask: boolean `[batch, 1, source_len]`, True at real source tokens.
        return_attention_scores: also return the encoder-decoder attention weights
            `[batch, num_heads, target_len, source_len]`.
        training: whether dropout is on.

    Returns:
        `[batch, target_len, d_model]`, and the encoder-decoder attention weights with
        `return_attention_scores`.

    Example:
    >>> layer = DecoderLayer(num_heads=8, d_ff=2048)
    >>> memory = keras.random.normal((2, 12, 512))
    >>> layer(keras.random.normal((2, 10, 512)), memory).shape
    (2, 10, 512)
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.self_attention_norm = self.norm()
        self.cross_attention_norm = self.norm()
        self.feed_forward_norm = self.norm()

    def build(self, input_shape):
        self.self_attention = self.attention("self_attention", input_shape)
        self.cross_attention = self.attention("cross_attention", input_shape)
        for sublayer in (self.self_attention_norm, self.cross_attention_norm, self.feed_forward, self.feed_forward_norm):
            sublayer.build(input_shape)

    def call(self, inputs, encoder_output, source_mask=None, return_attention_scores=False, training=None):
        x = inputs
        attended = self.self_attention(x, x, use_causal_mask=True, training=training)
        x = self.residual(self.self_attention_norm, x, attended, training)
        attended, weights = self.cross_attention(
            x, encoder_output, attention_mask=source_mask, return_attention_scores=True, training=training
        )
        x = self.residual(self.cross_attention_norm, x, attended, training)
        x = self.residual(self.feed_forward_norm, x, self.feed_forward(x, training=training), training)
        return (x, weights) if return_attention_scores else x

    def decode_step(self, x, layer_cache, cache, index, visibility):
        """One position of each output, without dropout.

        Args:
            x: `[rows * n, 1, d_model]`, n = `cache.queries_per_row` outputs per cache row, in
                adjacent rows; they attend together, as one sentence's several positions.
            layer_cache: this layer's `LayerCache`.
            cache: the decoder's cache (`GrowingCache` or `StaticCache`), for how to write.
            index: the position of `x`, a scalar.
            visibility: from `cache.advance(index)`: which cached positions each query sees.

        Returns:
            `[rows * n, 1, d_model]`, and `layer_cache` with this position's keys and values.
        """
        n = cache.queries_per_row
        key, value = self.self_attention.compute_key_value(ops.reshape(x, (-1, n, ops.shape(x)[-1])))
        layer_cache = cache.append(layer_cache, key, value, index)
        attended = self._attend_per_row(self.self_attention, x, layer_cache.self_key, layer_cache.self_value, visibility, n)
        x = self.residual(self.self_attention_norm, x, attended, False)
        attended = self._attend_per_row(
            self.cross_attention, x, layer_cache.cross_key, layer_cache.cross_value, cache.source_mask, n
        )
        x = self.residual(self.cross_attention_norm, x, attended, False)
        return self.residual(self.feed_forward_norm, x, self.feed_forward(x, training=False), False), layer_cache

    @staticmethod
    def _attend_per_row(attention, x, key, value, mask, n):
        """`attention` of `x` `[rows * n, 1, d_model]` to keys and values `[rows, heads, len,
        key_dim]`, the n queries of a row together."""
        d_model = ops.shape(x)[-1]
        attended = attention(ops.reshape(x, (-1, n, d_model)), attention_mask=mask, key_value=(key, value))
        return ops.reshape(attended, (-1, 1, d_model))


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(Stack):
    """N `DecoderLayer`s after dropout on the embedding + position sums (sections 3.1, 5.4).

    Args:
        num_layers: N.
        num_heads, d_ff, dropout, attention_dropout, relu_dropout, activation,
            layer_norm_epsilon: as for `DecoderLayer`.

    Call arguments:
        inputs: embedded target with positions added, `[batch, target_len, d_model]`.
        encoder_output, source_mask, training: as for `DecoderLayer`.
        return_attention_scores: also return each layer's encoder-decoder attention weights.

    Returns:
        `[batch, target_len, d_model]`, and the list of attention weights with
        `return_attention_scores`.
    """

    layer_class = DecoderLayer

    def call(self, inputs, encoder_output, source_mask=None, return_attention_scores=False, training=None):
        x = self.input_dropout(inputs, training=training)
        weights = []
        for layer in self.layers:
            x, layer_weights = layer(x, encoder_output, source_mask, return_attention_scores=True, training=training)
            weights.append(layer_weights)
        return (x, weights) if return_attention_scores else x

    def init_cache(self, encoder_output, source_mask, hypotheses=1, max_length=None, shared_slots=True):
        """An empty cache for decoding `hypotheses` outputs per sentence of `encoder_output`
        `[batch, source_len, d_model]` (source_mask `[batch, 1, source_len]`): a `GrowingCache`,
        or with `max_length` a `StaticCache` of that many positions; `shared_slots` as for
        `DecoderCache.create`."""
        cross = [layer.cross_attention.compute_key_value(encoder_output) for layer in self.layers]
        attention = self.layers[0].self_attention
        layout = GrowingCache if max_length is None else StaticCache
        return layout.create(
            cross, source_mask, (attention.num_heads, attention.key_dim), hypotheses, max_length, shared_slots
        )

    def decode_step(self, x, cache, index):
        """`x` `[rows, 1, d_model]` at position `index` through every layer from `cache`: the
        output and the cache with this position written."""
        cache, visibility = cache.advance(index)
        layers = []
        for layer, layer_cache in zip(self.layers, cache.layers):
            x, layer_cache = layer.decode_step(x, layer_cache, cache, index, visibility)
            layers.append(layer_cache)
        return x, cache._replace(layers=layers)
