"""The Transformer: encoder-decoder over one shared embedding (section 3, Figure 1), or over a
source and a target embedding."""

import collections

import keras
from keras import ops

from keras_transformer.common import NEG_INF, PAD_ID
from keras_transformer.config import TransformerConfig
from keras_transformer.decoder import Decoder
from keras_transformer.embedding import SharedEmbedding
from keras_transformer.encoder import Encoder
from keras_transformer.positional_encoding import PositionalEncoding
from keras_transformer.residual import SETTINGS

DecodingCache = collections.namedtuple("DecodingCache", ["decoder", "logits_kernel", "logits_bias"])
DecodingCache.__doc__ = """What `Transformer.decode_step` computes once and reuses at every step.

decoder: the decoder's `GrowingCache` or `StaticCache` (keras_transformer/cache.py).
logits_kernel: `E^T` `[d_model, vocab]`, the shared embedding transposed once per decode, not at
    every step (TensorFlow multiplies by a transposed operand more slowly).
logits_bias: float32 `[vocab]`: `NEG_INF` at padding, which is never generated, else the trained
    logits bias (`TransformerConfig.logits_bias`) or 0; added to the logits in the same fused
    matmul, rather than masked in a pass of its own.
"""


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """The model of "Attention Is All You Need".

    Token ids go through the shared embedding (scaled by sqrt(d_model)) plus positional
    encodings into the encoder; the decoder reads the target shifted right and the encoder
    output; its output times the embedding matrix gives the logits (section 3.4). With the
    config's `source_vocab_size`, the source has an embedding of its own (`source_embedding`)
    and the shared one is the target's. Id 0 is padding in sources and targets.

    Args:
        config: a `TransformerConfig` (or its dict).

    Call arguments:
        inputs: `(source_ids, target_input_ids)`, integer `[batch, source_len]` and
            `[batch, target_len]`; `target_input_ids` starts with the begin-of-sentence id.
        training: whether dropout is on.

    Returns:
        float32 logits `[batch, target_len, vocab_size]`.

    Example:
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=100))
    >>> model((ops.array([[5, 6, 7, 0]]), ops.array([[1, 9, 8]]))).shape
    (1, 3, 100)
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        self.config = config
        self.embedding = SharedEmbedding(config.vocab_size, config.d_model, config.logits_bias, name="embedding")
        self.source_embedding = None
        if config.source_vocab_size is not None:
            self.source_embedding = SharedEmbedding(config.source_vocab_size, config.d_model, name="source_embedding")
        self.positional_encoding = PositionalEncoding(
            config.max_length,
            learned=config.positional_encoding == "learned",
            halves=config.positional_encoding == "sinusoidal_halves",
            name="positional_encoding",
        )
        stack = {name: getattr(config, name) for name in SETTINGS}
        self.encoder = Encoder(num_layers=config.encoder_layers, **stack, name="encoder")
        self.decoder = Decoder(num_layers=config.decoder_layers, **stack, name="decoder")
        self.build()  # The config fixes every shape: create the weights now.

    def build(self, input_shape=None):
        if self.built:  # Built from the config in __init__; Keras calls build again when loading.
            return
        width = (None, None, self.config.d_model)
        self.embedding.build()
        if self.source_embedding is not None:
            self.source_embedding.build()
        self.positional_encoding.build(width)
        self.encoder.build(width)
        self.decoder.build(width)

    def call(self, inputs, training=None):
        source_ids, target_input_ids = inputs
        encoder_output, source_mask = self.encode(source_ids, training=training)
        return self.decode(target_input_ids, encoder_output, source_mask, training=training)

    def encode(self, source_ids, training=None):
        """Source ids `[batch, source_len]` -> (encoder output `[batch, source_len, d_model]`,
        source mask `[batch, 1, source_len]`)."""
        source_mask = ops.expand_dims(ops.not_equal(source_ids, PAD_ID), axis=1)
        embedding = self.embedding if self.source_embedding is None else self.source_embedding
        x = self.positional_encoding(embedding(source_ids))
        return self.encoder(x, padding_mask=source_mask, training=training), source_mask

    def decode(self, target_input_ids, encoder_output, source_mask, training=None):
        """Target input ids `[batch, target_len]` -> float32 logits `[batch, target_len, vocab]`."""
        return self.embedding.logits(self.decoder_states(target_input_ids, encoder_output, source_mask, training))

    def decoder_states(self, target_input_ids, encoder_output, source_mask, training=None):
        """Target input ids `[batch, target_len]` -> the decoder's output `[batch, target_len,
        d_model]`, before the logits."""
        x = self.positional_encoding(self.embedding(target_input_ids))
        return self.decoder(x, encoder_output, source_mask, training=training)

    def logits_projection(self, dtype):
        """(`E^T` `[d_model, vocab]` in `dtype`, float32 bias `[vocab]`): `matmul(x, E^T) + bias`
        are the logits of the decoder's output `x`, with `NEG_INF` at padding, which is never
        generated (`DecodingCache`'s `logits_kernel` and `logits_bias`)."""
        vocab = self.config.vocab_size
        bias = ops.where(ops.arange(vocab) == PAD_ID, NEG_INF, self.embedding.bias_or_zeros())
        return ops.transpose(ops.cast(self.embedding.embeddings, dtype)), bias

    def cross_attention_weights(self, source_ids, target_input_ids):
        """Encoder-decoder attention weights of every decoder layer (for plots, section 3.2.3).

        Returns:
            A list with one float32 `[batch, num_heads, target_len, source_len]` per layer.
        """
        encoder_output, source_mask = self.encode(source_ids)
        x = self.positional_encoding(self.embedding(target_input_ids))
        _, weights = self.decoder(x, encoder_output, source_mask, return_attention_scores=True)
        return weights

    def init_cache(self, encoder_output, source_mask, hypotheses=1, max_length=None, shared_slots=True):
        """What `decode_step` reuses while decoding `hypotheses` outputs per sentence of
        `encoder_output` `[batch, source_len, d_model]`, with `source_mask` from `encode`: a
        `DecodingCache`. Its self-attention keys and values grow by one position a step; with
        `max_length` they are preallocated for that many positions instead, so that their shapes
        stay fixed (XLA, TPUs). `shared_slots`: a sentence's hypotheses keep their keys and
        values in slots of one row (keras_transformer/cache.py)."""
        return DecodingCache(
            self.decoder.init_cache(encoder_output, source_mask, hypotheses, max_length, shared_slots),
            *self.logits_projection(encoder_output.dtype),
        )

    def reorder_cache(self, cache, parents, sentences=None):
        """The cache after beam search keeps, as hypothesis i of each sentence, an extension of
        its hypothesis `parents[b, i]` (int `[sentences, hypotheses]`); with `sentences`
        (ascending indices), for those sentences only (`DecoderCache.reorder`)."""
        return cache._replace(decoder=cache.decoder.reorder(parents, sentences))

    def decode_step(self, token_ids, index, cache):
        """Decodes one position from the cache, without dropout.

        Args:
            token_ids: integer `[batch * hypotheses]`, the target token at position `index` of
                each output; a sentence's hypotheses in adjacent rows.
            index: scalar position.
            cache: from `init_cache` (or the previous step).

        Returns:
            (float32 logits `[batch * hypotheses, vocab]` for position `index + 1`, updated
            cache). Padding is never generated: its logit is `NEG_INF`.
        """
        x = self.positional_encoding(self.embedding(token_ids[:, None]), start_index=index)
        x, decoder = self.decoder.decode_step(x, cache.decoder, index)
        logits = ops.cast(ops.matmul(x[:, 0], cache.logits_kernel), "float32") + cache.logits_bias
        return logits, cache._replace(decoder=decoder)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
