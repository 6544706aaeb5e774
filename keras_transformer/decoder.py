"""The decoder: a stack of masked self-attention, encoder-decoder attention and feed-forward
layers (section 3.1), with a key/value cache for decoding one position at a time.

This module alone knows the cache's layout: it creates it, writes it and reorders it; a search
passes it along unread."""

import collections

import keras
from keras import ops

from keras_transformer.residual import LAYER_NORM_EPSILON, ResidualLayer, Stack


class LayerCache(collections.namedtuple("LayerCache", ["self_key", "self_value", "cross_key", "cross_value"])):
    """One decoder layer's cache, growing: each step appends its position's keys and values.

    self_key, self_value: `[hypotheses, num_heads, decoded_len, key_dim]`, one row per output
        being decoded (`batch * hypotheses_per_sentence`, a sentence's hypotheses in adjacent
        rows).
    cross_key, cross_value: `[batch, num_heads, source_len, key_dim]`, the encoder output
        projected once per sentence and shared by its hypotheses.

    Appending copies the cache (O(length) a step), which is the cheapest write a graph without
    XLA has; its shape changes every step, so a TensorFlow loop must declare it (`tf.while_loop`
    shape invariants).
    """

    __slots__ = ()


class StaticLayerCache(LayerCache):
    """A `LayerCache` preallocated for a fixed number of positions: each step writes its position
    in place (`slice_update`) and attends to the positions written so far. Every shape stays the
    same from step to step, as XLA and TPUs need."""

    __slots__ = ()


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(ResidualLayer):
    """Masked self-attention, encoder-decoder attention, then the feed-forward network, each as
    `LayerNorm(x + Dropout(Sublayer(x)))` (sections 3.1, 3.2.3, 5.4).

    Training and full forward passes see the whole target at once and mask later positions.
    Decoding passes one position per output and a `cache` (`init_cache`): the keys and values of
    earlier positions, and the encoder output projected once for the encoder-decoder attention.
    The hypotheses of one sentence share that projection: their queries are attended together,
    as one sentence's several positions.

    Args:
        num_heads: attention heads; each has d_model / num_heads dimensions.
        d_ff: inner width of the feed-forward network.
        dropout: P_drop on each sub-layer's output.
        attention_dropout: dropout on the attention weights.
        relu_dropout: dropout on the feed-forward network's inner activations.

    Call arguments:
        inputs: `[batch, target_len, d_model]` (target_len 1 when decoding with a cache).
        encoder_output: `[batch, source_len, d_model]`; unused with a cache.
        source_mask: boolean `[batch, 1, source_len]`, True at real source tokens (with a cache,
            one row per sentence).
        cache: a `LayerCache` from `init_cache`, for decoding.
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

    def __init__(self, num_heads, d_ff, dropout=0.1, attention_dropout=0.0, relu_dropout=0.0, **kwargs):
        super().__init__(num_heads, d_ff, dropout, attention_dropout, relu_dropout, **kwargs)
        self.self_attention_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON)
        self.cross_attention_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON)
        self.feed_forward_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON)

    def build(self, input_shape):
        self.self_attention = self.attention("self_attention", input_shape)
        self.cross_attention = self.attention("cross_attention", input_shape)
        for sublayer in (self.self_attention_norm, self.cross_attention_norm, self.feed_forward, self.feed_forward_norm):
            sublayer.build(input_shape)

    def init_cache(self, encoder_output, hypotheses=1, max_length=None):
        """An empty cache for decoding `hypotheses` outputs per sentence of `encoder_output`
        `[batch, source_len, d_model]`: a `LayerCache`, or with `max_length` a
        `StaticLayerCache` of that many positions."""
        rows = ops.shape(encoder_output)[0] * hypotheses
        shape = (rows, self.num_heads, max_length or 0, self.self_attention.key_dim)
        cross_key, cross_value = self.cross_attention.compute_key_value(encoder_output)
        empty = ops.zeros(shape, encoder_output.dtype)
        return (LayerCache if max_length is None else StaticLayerCache)(empty, empty, cross_key, cross_value)

    def _attend_to_cache(self, x, cache, cache_index, training):
        """Self-attention of one new position `x` `[rows, 1, d_model]` to itself and the cache."""
        key, value = self.self_attention.compute_key_value(x)  # [rows, heads, 1, key_dim]
        if isinstance(cache, StaticLayerCache):
            start = (0, 0, cache_index, 0)
            cache = cache._replace(
                self_key=ops.slice_update(cache.self_key, start, key),
                self_value=ops.slice_update(cache.self_value, start, value),
            )
            visible = (ops.arange(ops.shape(cache.self_key)[2]) <= cache_index)[None, None, :]
        else:
            cache = cache._replace(
                self_key=ops.concatenate([cache.self_key, key], axis=2),
                self_value=ops.concatenate([cache.self_value, value], axis=2),
            )
            visible = None
        attended = self.self_attention(
            x, attention_mask=visible, key_value=(cache.self_key, cache.self_value), training=training
        )
        return attended, cache

    def _attend_to_source(self, x, cache, source_mask, training):
        """Encoder-decoder attention of `x` `[batch * n, 1, d_model]` (n hypotheses per sentence)
        to the cached projection of each sentence: the n queries of a sentence go together."""
        d_model = ops.shape(x)[-1]
        per_sentence = ops.shape(x)[0] // ops.shape(cache.cross_key)[0]
        queries = ops.reshape(x, (-1, per_sentence, d_model))
        attended = self.cross_attention(
            queries, attention_mask=source_mask, key_value=(cache.cross_key, cache.cross_value), training=training
        )
        return ops.reshape(attended, (-1, 1, d_model))

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
        if cache is not None:
            attended, cache = self._attend_to_cache(x, cache, cache_index, training)
            x = self.residual(self.self_attention_norm, x, attended, training)
            attended = self._attend_to_source(x, cache, source_mask, training)
            x = self.residual(self.cross_attention_norm, x, attended, training)
            return self.residual(self.feed_forward_norm, x, self.feed_forward(x, training=training), training), cache

        attended = self.self_attention(x, x, use_causal_mask=True, training=training)
        x = self.residual(self.self_attention_norm, x, attended, training)
        attended, weights = self.cross_attention(
            x, encoder_output, attention_mask=source_mask, return_attention_scores=True, training=training
        )
        x = self.residual(self.cross_attention_norm, x, attended, training)
        x = self.residual(self.feed_forward_norm, x, self.feed_forward(x, training=training), training)
        return (x, weights) if return_attention_scores else x


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(Stack):
    """N `DecoderLayer`s after dropout on the embedding + position sums (sections 3.1, 5.4).

    Args:
        num_layers: N.
        num_heads, d_ff, dropout, attention_dropout, relu_dropout: as for `DecoderLayer`.

    Call arguments:
        inputs: embedded target with positions added, `[batch, target_len, d_model]`.
        encoder_output, source_mask, cache_index, training: as for `DecoderLayer`.
        cache: a list with one `LayerCache` per layer, from `init_cache`.
        return_attention_scores: also return each layer's encoder-decoder attention weights.

    Returns:
        `[batch, target_len, d_model]`, and the updated cache list when `cache` is given, or
        the list of attention weights with `return_attention_scores`.
    """

    layer_class = DecoderLayer

    def init_cache(self, encoder_output, hypotheses=1, max_length=None):
        """One cache per layer (see `DecoderLayer.init_cache`), as a list."""
        return [layer.init_cache(encoder_output, hypotheses, max_length) for layer in self.layers]

    def reorder_cache(self, cache, rows, sentences=None):
        """The cache of the hypotheses `rows` (int `[sentences * hypotheses]`, indices into the
        cache's rows), for beam search. Rows are picked within each sentence's hypotheses, which
        share their encoder output: only the self-attention keys and values move, unless
        `sentences` (int, indices into the cache's sentences) keeps only some sentences, whose
        encoder-decoder keys and values are then taken too."""

        def reorder(layer):
            layer = layer._replace(self_key=ops.take(layer.self_key, rows, axis=0),
                                   self_value=ops.take(layer.self_value, rows, axis=0))  # fmt: skip
            if sentences is None:
                return layer
            return layer._replace(cross_key=ops.take(layer.cross_key, sentences, axis=0),
                                  cross_value=ops.take(layer.cross_value, sentences, axis=0))  # fmt: skip

        return [reorder(layer) for layer in cache]

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
