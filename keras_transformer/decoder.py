"""The decoder: a stack of masked self-attention, encoder-decoder attention and feed-forward
layers (section 3.1), with a key/value cache for decoding one position at a time."""

import keras
from keras import ops

from keras_transformer.residual import LAYER_NORM_EPSILON, ResidualLayer, Stack


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(ResidualLayer):
    """Masked self-attention, encoder-decoder attention, then the feed-forward network, each as
    `LayerNorm(x + Dropout(Sublayer(x)))` (sections 3.1, 3.2.3, 5.4).

    Training and full forward passes see the whole target at once and mask later positions.
    Decoding passes one position and a `cache`: the keys and values of earlier positions,
    preallocated at full length and written in place at `cache_index`, plus the encoder output
    projected once for the encoder-decoder attention. Every tensor keeps its shape from step to
    step, so a decoding loop compiles with XLA.

    Args:
        num_heads: attention heads; each has d_model / num_heads dimensions.
        d_ff: inner width of the feed-forward network.
        dropout: P_drop on each sub-layer's output.
        attention_dropout: dropout on the attention weights.

    Call arguments:
        inputs: `[batch, target_len, d_model]` (target_len 1 when decoding with a cache).
        encoder_output: `[batch, source_len, d_model]`; unused with a cache.
        source_mask: boolean `[batch, 1, source_len]`, True at real source tokens.
        cache: a dict from `init_cache`, for decoding.
        cache_index: the position of `inputs` in the target, a scalar (with `cache`).
        return_attention_scores: also return the encoder-decoder attention weights
            `[batch, num_heads, target_len, source_len]` (without a cache).
        training: whether dropout is on.

    Returns:
        `[batch, target_len, d_model]`, and the updated cache when `cache` is given, or the
        encoder-decoder attention weights with `return_attention_scores`.

    Example:
    >>> layer = DecoderLayer(num_heads=8, d_ff=2048)
    >>> memory = keras.random.normal((2, 12, 512))
    >>> layer(keras.random.normal((2, 10, 512)), memory).shape
    (2, 10, 512)
    """

    def __init__(self, num_heads, d_ff, dropout=0.1, attention_dropout=0.0, **kwargs):
        super().__init__(num_heads, d_ff, dropout, attention_dropout, **kwargs)
        self.self_attention_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON)
        self.cross_attention_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON)
        self.feed_forward_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON)

    def build(self, input_shape):
        self.self_attention = self.attention("self_attention", input_shape)
        self.cross_attention = self.attention("cross_attention", input_shape)
        for sublayer in (self.self_attention_norm, self.cross_attention_norm, self.feed_forward, self.feed_forward_norm):
            sublayer.build(input_shape)

    def init_cache(self, encoder_output, max_length):
        """An empty cache for `max_length` target positions over `encoder_output`."""
        batch = ops.shape(encoder_output)[0]
        shape = (batch, max_length, self.num_heads, self.self_attention.key_dim)
        cross_key, cross_value = self.cross_attention.compute_key_value(encoder_output)
        return {
            "self_key": ops.zeros(shape, encoder_output.dtype),
            "self_value": ops.zeros(shape, encoder_output.dtype),
            "cross_key": cross_key,
            "cross_value": cross_value,
        }

    def call(
        self,
        inputs,
        encoder_output=None,
        source_mask=None,
        cache=None,
        cache_index=None,
        return_attention_scores=False,
        training=None,
    ):
        x = inputs
        if cache is None:
            attended = self.self_attention(x, x, use_causal_mask=True, training=training)
            cross_key_value = None
        else:
            key, value = self.self_attention.compute_key_value(x)
            # Write position cache_index with a mask rather than ops.slice_update, whose
            # TensorFlow kernel is an XLA op: exported graphs must run without XLA.
            positions = ops.arange(ops.shape(cache["self_key"])[1])
            here = (positions == cache_index)[None, :, None, None]
            cache = {
                **cache,
                "self_key": ops.where(here, key, cache["self_key"]),
                "self_value": ops.where(here, value, cache["self_value"]),
            }
            visible = positions <= cache_index
            attended = self.self_attention(
                x,
                attention_mask=visible[None, None, :],
                key_value=(cache["self_key"], cache["self_value"]),
                training=training,
            )
            cross_key_value = (cache["cross_key"], cache["cross_value"])
        x = self.residual(self.self_attention_norm, x, attended, training)

        attended, weights = self.cross_attention(
            x,
            encoder_output,
            attention_mask=source_mask,
            key_value=cross_key_value,
            return_attention_scores=True,
            training=training,
        )
        x = self.residual(self.cross_attention_norm, x, attended, training)
        x = self.residual(self.feed_forward_norm, x, self.feed_forward(x), training)
        if cache is not None:
            return x, cache
        return (x, weights) if return_attention_scores else x


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(Stack):
    """N `DecoderLayer`s after dropout on the embedding + position sums (sections 3.1, 5.4).

    Args:
        num_layers: N.
        num_heads, d_ff, dropout, attention_dropout: as for `DecoderLayer`.

    Call arguments:
        inputs: embedded target with positions added, `[batch, target_len, d_model]`.
        encoder_output, source_mask, cache_index, training: as for `DecoderLayer`.
        cache: a list with one `DecoderLayer` cache per layer, from `init_cache`.
        return_attention_scores: also return each layer's encoder-decoder attention weights.

    Returns:
        `[batch, target_len, d_model]`, and the updated cache list when `cache` is given, or
        the list of attention weights with `return_attention_scores`.
    """

    layer_class = DecoderLayer

    def init_cache(self, encoder_output, max_length):
        return [layer.init_cache(encoder_output, max_length) for layer in self.layers]

    def reorder_cache(self, cache, rows):
        """The cache of the hypotheses `rows` (int `[batch]`, indices into the cache's batch),
        for beam search. Rows are picked within each sentence's hypotheses, which share their
        encoder output: only the self-attention keys and values move."""
        return [
            {**layer, "self_key": ops.take(layer["self_key"], rows, axis=0),
             "self_value": ops.take(layer["self_value"], rows, axis=0)}
            for layer in cache
        ]  # fmt: skip

    def call(
        self,
        inputs,
        encoder_output=None,
        source_mask=None,
        cache=None,
        cache_index=None,
        return_attention_scores=False,
        training=None,
    ):
        x = self.input_dropout(inputs, training=training)
        if cache is None:
            weights = []
            for layer in self.layers:
                x, layer_weights = layer(x, encoder_output, source_mask, return_attention_scores=True, training=training)
                weights.append(layer_weights)
            return (x, weights) if return_attention_scores else x
        new_cache = []
        for layer, layer_cache in zip(self.layers, cache):
            x, layer_cache = layer(x, source_mask=source_mask, cache=layer_cache, cache_index=cache_index, training=training)
            new_cache.append(layer_cache)
        return x, new_cache
