"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as Keras 3 layers."""

from keras_transformer.attention import MultiHeadAttention
from keras_transformer.common import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from keras_transformer.config import TransformerConfig
from keras_transformer.decoder import Decoder, DecoderLayer
from keras_transformer.embedding import SharedEmbedding
from keras_transformer.encoder import Encoder, EncoderLayer
from keras_transformer.feed_forward import PositionwiseFeedForward
from keras_transformer.model import Transformer
from keras_transformer.positional_encoding import PositionalEncoding

__all__ = [
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "MultiHeadAttention",
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "PositionalEncoding",
    "PositionwiseFeedForward",
    "SharedEmbedding",
    "Transformer",
    "TransformerConfig",
    "UNK_ID",
]
