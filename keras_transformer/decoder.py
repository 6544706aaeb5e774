"""The decoder: a stack of masked self-attention, encoder-decoder attention and feed-forward
layers (section 3.1), with a key/value cache for decoding one position at a time.

This module alone knows the cache's layout: it creates it, writes it and reorders it; a search
passes it along unread."""

import collections

import keras
from keras import ops

from keras_transformer.common import take_per_row
from keras_transformer.residual import LAYER_NORM_EPSILON, ResidualLayer, Stack


class LayerCache(collections.namedtuple("LayerCache", ["self_key", "self_value", "cross_key", "cross_value"])):
    """One decoder layer's cache, growing: each step appends its position's keys and values.

    self_key, self_value: `[batch, num_heads, decoded_len * hypotheses, key_dim]`, position s of
        slot i at `s * hypotheses + i`: what the sentence's hypothesis i computed at step s; a
        hypothesis that beam search keeps may descend from another slot, and `DecoderCache.origin`
        says which slots hold its past. So no step moves these keys and values between slots.
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


DecoderCache = collections.namedtuple("DecoderCache", ["layers", "origin"])
DecoderCache.__doc__ = """The decoder's cache: one `LayerCache` per layer, and where each hypothesis's past is.

origin: int32 `[batch, hypotheses, cache_len]`: position s of hypothesis i of a sentence is in
    slot `origin[b, i, s]` of every layer's self-attention cache. Beam search reorders only this
    (`Decoder.reorder_cache`), not the keys and values: each hypothesis attends to its own past
    among all of its sentence's slots, which costs `hypotheses` times the attention scores but
    no copy of the cache (in the manner of FasterTransformer's cache indirection).
"""


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(ResidualLayer):
    """Masked self-attention, encoder-decoder attention, then the feed-forward network, each as
    `LayerNorm(x + Dropout(Sublayer(x)))` (sections 3.1, 3.2.3, 5.4).

    Training and full forward passes see the whole target at once and mask later positions.
    Decoding passes one position per output and a `cache` (`init_cache`): the keys and values of
    earlier positions, and the encoder output projected once for the encoder-decoder attention.
    The hypotheses of one sentence share that projection: their queries are attended together,
    as one sentence's several positions; so are they in self-attention, over the slots of the
    sentence's cache (`LayerCache`).

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
        cache_visibility: boolean `[batch, hypotheses, cache_len * hypotheses]` (with `cache`):
            True where a hypothesis may attend to a cached position of its sentence's slots
            (after this step's write); its second axis gives the hypotheses per sentence. None
            is one hypothesis per sentence that sees every cached position.
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
        batch = ops.shape(encoder_output)[0]
        shape = (batch, self.num_heads, (max_length or 0) * hypotheses, self.self_attention.key_dim)
        cross_key, cross_value = self.cross_attention.compute_key_value(encoder_output)
        empty = ops.zeros(shape, encoder_output.dtype)
        return (LayerCache if max_length is None else StaticLayerCache)(empty, empty, cross_key, cross_value)

    def _attend_to_cache(self, x, cache, cache_index, cache_visibility, n, training):
        """Self-attention of one new position `x` `[batch * n, 1, d_model]` (n hypotheses per
        sentence) to itself and the cache: the n queries of a sentence go together, over all
        of its slots, `cache_visibility` choosing each one's past."""
        # [batch, heads, n, key_dim]: this position of a sentence's n slots.
        key, value = self.self_attention.compute_key_value(ops.reshape(x, (-1, n, ops.shape(x)[-1])))
        if isinstance(cache, StaticLayerCache):
            start = (0, 0, cache_index * n, 0)
            cache = cache._replace(self_key=ops.slice_update(cache.self_key, start, key),
                                   self_value=ops.slice_update(cache.self_value, start, value))  # fmt: skip
        else:
            cache = cache._replace(self_key=ops.concatenate([cache.self_key, key], axis=2),
                                   self_value=ops.concatenate([cache.self_value, value], axis=2))  # fmt: skip
        attended = self._attend_per_sentence(
            self.self_attention, x, cache.self_key, cache.self_value, cache_visibility, n, training
        )
        return attended, cache

    @staticmethod
    def _attend_per_sentence(attention, x, key, value, mask, n, training):
        """`attention` of `x` `[batch * n, 1, d_model]` to keys and values `[batch, heads, len,
        key_dim]`, the n queries of a sentence together."""
        d_model = ops.shape(x)[-1]
        queries = ops.reshape(x, (-1, n, d_model))
        attended = attention(queries, attention_mask=mask, key_value=(key, value), training=training)
        return ops.reshape(attended, (-1, 1, d_model))

    def call(
        self,
        inputs,
        encoder_output=None,
        source_mask=None,
        cache=None,
        cache_index=None,
        cache_visibility=None,
        return_attention_scores=False,
        training=None,
    ):
        x = inputs
        if cache is not None:
            n = 1 if cache_visibility is None else cache_visibility.shape[1]  # hypotheses per sentence
            attended, cache = self._attend_to_cache(x, cache, cache_index, cache_visibility, n, training)
            x = self.residual(self.self_attention_norm, x, attended, training)
            attended = self._attend_per_sentence(
                self.cross_attention, x, cache.cross_key, cache.cross_value, source_mask, n, training
            )
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
        cache: a `DecoderCache`, from `init_cache`.
        return_attention_scores: also return each layer's encoder-decoder attention weights.

    Returns:
        `[batch, target_len, d_model]`, and the updated `DecoderCache` when `cache` is given, or
        the list of attention weights with `return_attention_scores`.
    """

    layer_class = DecoderLayer

    def init_cache(self, encoder_output, hypotheses=1, max_length=None):
        """A `DecoderCache`: one cache per layer (see `DecoderLayer.init_cache`), each
        hypothesis's past in its own slot."""
        batch = ops.shape(encoder_output)[0]
        origin = ops.zeros((batch, hypotheses, max_length or 0), "int32")
        return DecoderCache([layer.init_cache(encoder_output, hypotheses, max_length) for layer in self.layers], origin)

    def reorder_cache(self, cache, parents, sentences=None):
        """The cache after beam search keeps, for hypothesis i of each sentence, the extension of
        its hypothesis `parents[b, i]` (int `[sentences, hypotheses]`). Only `origin` moves.
        With `sentences` (int, indices into the cache's sentences) only those sentences stay,
        in that order, and `parents` has a row for each of them."""
        layers, origin = cache
        if sentences is not None:
            layers = [layer._make(ops.take(t, sentences, axis=0) for t in layer) for layer in layers]
            origin = ops.take(origin, sentences, axis=0)
        return DecoderCache(layers, take_per_row(origin, parents))

    def _write_origin(self, cache, cache_index):
        """`origin` with this step's position in each hypothesis's own slot, and the self-attention
        mask it gives: `[batch, hypotheses, cache_len * hypotheses]` (see `DecoderLayer`), or
        None where every cached position is visible to every hypothesis (one, growing)."""
        static = isinstance(cache.layers[0], StaticLayerCache)
        origin = cache.origin
        hypotheses = ops.shape(origin)[1]
        if hypotheses == 1:  # one slot: no origin to keep
            if not static:
                return origin, None
            return origin, (ops.arange(ops.shape(cache.layers[0].self_key)[2]) <= cache_index)[None, None]
        slots = ops.arange(hypotheses, dtype="int32")[:, None]  # [i, 1]
        if static:
            origin = ops.where(ops.arange(ops.shape(origin)[2]) == cache_index, slots, origin)
        else:
            origin = ops.concatenate([origin, ops.broadcast_to(slots, (ops.shape(origin)[0], hypotheses, 1))], axis=2)
        length = ops.shape(origin)[2]
        mask = ops.expand_dims(origin, 3) == slots[:, 0]  # [batch, i, position s, slot j]
        if static:
            mask = mask & (ops.arange(length) <= cache_index)[:, None]
        return origin, ops.reshape(mask, (-1, hypotheses, length * hypotheses))

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
        origin, mask = self._write_origin(cache, cache_index)
        layers = []
        for layer, layer_cache in zip(self.layers, cache.layers):
            x, layer_cache = layer(x, source_mask=source_mask, cache=layer_cache, cache_index=cache_index,
                                   cache_visibility=mask, training=training)  # fmt: skip
            layers.append(layer_cache)
        return x, DecoderCache(layers, origin)
