"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as Keras 3 layers.

`from keras_transformer import Transformer` imports the module that defines the name on first
use, so that `keras_transformer.quiet` runs before anything imports Keras (which fixes its backend
and starts TensorFlow).
"""

import importlib

_MODULE_OF = {
    "BOS_ID": "common",
    "Decoder": "decoder",
    "DecoderLayer": "decoder",
    "Encoder": "encoder",
    "EncoderLayer": "encoder",
    "EOS_ID": "common",
    "MultiHeadAttention": "attention",
    "PAD_ID": "common",
    "PositionalEncoding": "positional_encoding",
    "PositionwiseFeedForward": "feed_forward",
    "SharedEmbedding": "embedding",
    "Transformer": "model",
    "TransformerConfig": "config",
    "UNK_ID": "common",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
    return getattr(importlib.import_module(f"keras_transformer.{_MODULE_OF[name]}"), name)


def __dir__():
    return __all__
