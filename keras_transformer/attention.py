"""Multi-head scaled dot-product attention (section 3.2)."""

import math

import keras
from keras import ops

from keras_transformer.common import NEG_INF, fresh_initializer


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention, `Concat(head_1, ..., head_h) W^O` (section 3.2.2).

    Each head is scaled dot-product attention, `softmax(Q K^T / sqrt(d_k)) V` (section 3.2.1),
    on its own projections `Q W_i^Q`, `K W_i^K`, `V W_i^V`. Keys and values come from the same
    tensor in all three uses of section 3.2.3, so the layer takes one `value` input for both.
    The weights have the shapes of `keras.layers.MultiHeadAttention`'s, in the same order.

    Softmax runs in float32 under mixed precision. Masked positions get a large negative score
    rather than -inf, so a row with every key masked gives finite (uniform) weights.

    Args:
        num_heads: h, the number of heads.
        key_dim: d_k = d_v, the width of each head (the paper uses d_model / h).
        dropout: dropout rate on the attention weights.
        kernel_initializer: initializer of W^Q, W^K, W^V and W^O.

    Call arguments:
        query: `[batch, target_len, d_model]`.
        value: `[batch, source_len, d_model]`, the keys and values; ignored when `key_value`
            is given.
        attention_mask: boolean, broadcastable to `[batch, target_len, source_len]`; True where
            a query may attend to a key.
        use_causal_mask: also forbid attending to later positions (decoder self-attention).
        key_value: optional `(key, value)` pair, each `[batch, num_heads, source_len, key_dim]`,
            as returned by `compute_key_value`: lets decoding project the encoder output once
            and keep a cache of past decoder positions.
        return_attention_scores: also return the weights `[batch, num_heads, target_len,
            source_len]`.
        training: whether attention dropout is on.

    Returns:
        `[batch, target_len, d_model]`, and the weights if `return_attention_scores`.

    Example:
    >>> attention = MultiHeadAttention(num_heads=8, key_dim=64)
    >>> x = keras.random.normal((2, 10, 512))
    >>> attention(x, x, use_causal_mask=True).shape
    (2, 10, 512)
    """

    def __init__(self, num_heads, key_dim, dropout=0.0, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.dropout_layer = keras.layers.Dropout(dropout)

    def build(self, query_shape, value_shape=None):
        query_width = query_shape[-1]
        value_width = query_width if value_shape is None else value_shape[-1]
        heads = (self.num_heads, self.key_dim)

        def kernel(name, shape):
            initializer = fresh_initializer(self.kernel_initializer)  # else W^Q, W^K, W^V start equal
            return self.add_weight(name=f"{name}_kernel", shape=shape, initializer=initializer)

        self.query_kernel = kernel("query", (query_width, *heads))
        self.query_bias = self.add_weight(name="query_bias", shape=heads, initializer="zeros")
        self.key_kernel = kernel("key", (value_width, *heads))
        self.key_bias = self.add_weight(name="key_bias", shape=heads, initializer="zeros")
        self.value_kernel = kernel("value", (value_width, *heads))
        self.value_bias = self.add_weight(name="value_bias", shape=heads, initializer="zeros")
        self.output_kernel = kernel("output", (*heads, query_width))
        self.output_bias = self.add_weight(name="output_bias", shape=(query_width,), initializer="zeros")

    def compute_key_value(self, value):
        """Projects `value` `[batch, len, d_model]` to keys and values `[batch, h, len, d_k]`.

        Heads come before positions, so each head's keys are one contiguous matrix for the
        attention's batched matmuls, and a decoder cache grows along one axis without a transpose.
        """
        key = self._split_heads(value, self.key_kernel, self.key_bias)
        return key, self._split_heads(value, self.value_kernel, self.value_bias)

    def _split_heads(self, x, kernel, bias):
        """`x W + b` for a kernel `[width, h, d_k]`: `[batch, len, width]` -> `[batch, h, len, d_k]`.

        One 2-D matmul rather than an einsum: TensorFlow runs a plain matmul (with its bias
        fused) several times faster than its einsum kernel at decoding's one position a step.
        """
        batch, length, width = ops.shape(x)
        kernel = ops.reshape(ops.cast(kernel, x.dtype), (width, self.num_heads * self.key_dim))
        flat = ops.matmul(ops.reshape(x, (-1, width)), kernel) + ops.reshape(ops.cast(bias, x.dtype), (-1,))
        return ops.transpose(ops.reshape(flat, (batch, length, self.num_heads, self.key_dim)), (0, 2, 1, 3))

    def _merge_heads(self, heads):
        """`Concat(head_1, ..., head_h) W^O + b`: `[batch, h, len, d_k]` -> `[batch, len, d_model]`."""
        batch, _, length, _ = ops.shape(heads)
        concatenated = ops.reshape(ops.transpose(heads, (0, 2, 1, 3)), (-1, self.num_heads * self.key_dim))
        kernel = ops.reshape(ops.cast(self.output_kernel, heads.dtype), (self.num_heads * self.key_dim, -1))
        output = ops.matmul(concatenated, kernel) + ops.cast(self.output_bias, heads.dtype)
        return ops.reshape(output, (batch, length, self.output_bias.shape[0]))  # not -1: batch may be 0

    def call(
        self,
        query,
        value=None,
        attention_mask=None,
        use_causal_mask=False,
        key_value=None,
        return_attention_scores=False,
        training=None,
    ):
        key, value = self.compute_key_value(value) if key_value is None else key_value
        query = self._split_heads(query, self.query_kernel, self.query_bias)
        query = query * ops.cast(1.0 / math.sqrt(self.key_dim), query.dtype)

        scores = ops.einsum("bnth,bnsh->bnts", query, key)
        scores = ops.cast(scores, "float32")
        mask = self._combine_masks(attention_mask, use_causal_mask, ops.shape(scores))
        if mask is not None:
            scores = ops.where(mask, scores, NEG_INF)
        # softmax, written out: keras.ops.softmax warns about one-key rows (one-token sources).
        weights = ops.exp(scores - ops.max(scores, axis=-1, keepdims=True))
        weights = weights / ops.sum(weights, axis=-1, keepdims=True)
        dropped = self.dropout_layer(ops.cast(weights, value.dtype), training=training)

        heads = ops.einsum("bnts,bnsh->bnth", dropped, value)
        output = self._merge_heads(heads)
        return (output, weights) if return_attention_scores else output

    @staticmethod
    def _combine_masks(attention_mask, use_causal_mask, scores_shape):
        """Returns a boolean mask broadcastable to the scores `[batch, heads, target, source]`."""
        mask = None
        if attention_mask is not None:
            mask = ops.expand_dims(ops.cast(attention_mask, "bool"), axis=1)
        if use_causal_mask:
            target_len, source_len = scores_shape[2], scores_shape[3]
            rows = ops.expand_dims(ops.arange(target_len), 1)
            cols = ops.expand_dims(ops.arange(source_len), 0)
            causal = rows >= cols
            mask = causal if mask is None else ops.logical_and(mask, causal)
        return mask

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "dropout": self.dropout,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }

