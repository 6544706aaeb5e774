"""The Transformer: encoder-decoder over one shared embedding (section 3, Figure 1)."""

import keras
from keras import ops

from keras_transformer.common import PAD_ID
from keras_transformer.config import TransformerConfig
from keras_transformer.decoder import Decoder
from keras_transformer.embedding import SharedEmbedding
from keras_transformer.encoder import Encoder
from keras_transformer.positional_encoding import PositionalEncoding


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """The model of "Attention Is All You Need".

    Token ids go through the shared embedding (scaled by sqrt(d_model)) plus positional
    encodings into the encoder; the decoder reads the target shifted right and the encoder
    output; its output times the embedding matrix gives the logits (section 3.4). Id 0 is
    padding in sources and targets.

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
        self.embedding = SharedEmbedding(config.vocab_size, config.d_model, name="embedding")
        self.positional_encoding = PositionalEncoding(
            config.max_length, learned=config.positional_encoding == "learned", name="positional_encoding"
        )
        stack = dict(
            num_layers=config.num_layers,
            num_heads=config.num_heads,
            d_ff=config.d_ff,
            dropout=config.dropout,
            attention_dropout=config.attention_dropout,
        )
        self.encoder = Encoder(**stack, name="encoder")
        self.decoder = Decoder(**stack, name="decoder")
        self.build()  # The config fixes every shape: create the weights now.

    def build(self, input_shape=None):
        if self.built:  # Built from the config in __init__; Keras calls build again when loading.
            return
        width = (None, None, self.config.d_model)
        self.embedding.build()
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
        x = self.positional_encoding(self.embedding(source_ids))
        return self.encoder(x, padding_mask=source_mask, training=training), source_mask

    def decode(self, target_input_ids, encoder_output, source_mask, training=None):
        """Target input ids `[batch, target_len]` -> float32 logits `[batch, target_len, vocab]`."""
        x = self.positional_encoding(self.embedding(target_input_ids))
        x = self.decoder(x, encoder_output, source_mask, training=training)
        return self.embedding.logits(x)

    def cross_attention_weights(self, source_ids, target_input_ids):
        """Encoder-decoder attention weights of every decoder layer (for plots, section 3.2.3).

        Returns:
            A list with one float32 `[batch, num_heads, target_len, source_len]` per layer.
        """
        encoder_output, source_mask = self.encode(source_ids)
        x = self.positional_encoding(self.embedding(target_input_ids))
        _, weights = self.decoder(x, encoder_output, source_mask, return_attention_scores=True)
        return weights

    def init_cache(self, encoder_output, hypotheses=1, max_length=None):
        """The decoder's key/value cache for decoding `hypotheses` outputs per sentence (see
        `decode_step`). It grows by one position a step; with `max_length` it is preallocated for
        that many positions instead, so that its shapes stay fixed (XLA, TPUs)."""
        return self.decoder.init_cache(encoder_output, hypotheses, max_length)

    def reorder_cache(self, cache, rows):
        """The cache of the hypotheses `rows` (int `[batch * hypotheses]`), as beam search keeps them."""
        return self.decoder.reorder_cache(cache, rows)

    def decode_step(self, token_ids, index, cache, source_mask):
        """Decodes one position from the cache, without dropout.

        Args:
            token_ids: integer `[batch * hypotheses]`, the target token at position `index` of
                each output; a sentence's hypotheses in adjacent rows.
            index: scalar position.
            cache: from `init_cache` (or the previous step).
            source_mask: boolean `[batch, 1, source_len]`, from `encode`.

        Returns:
            (float32 logits `[batch * hypotheses, vocab]` for position `index + 1`, updated cache).
        """
        x = self.embedding(token_ids[:, None])
        x = self.positional_encoding(x, start_index=index)
        x, cache = self.decoder(x, source_mask=source_mask, cache=cache, cache_index=index, training=False)
        return self.embedding.logits(x)[:, 0], cache

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
