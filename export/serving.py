"""The exported tf.Module: text -> SentencePiece ids -> beam (or greedy) search -> text.

One function, `translate`, is both `loaded.translate(text)` and the `serving_default` signature:
input `text` (tf.string, [None]); outputs `translation` (tf.string, [None]) and `score`
(tf.float32, [None], the length-penalised log-probability). It uses only ops of TensorFlow and
tensorflow-text (which the stock TF Serving binary links), and no XLA.

Bad input still gets one result per line: bytes that are not UTF-8 are replaced by U+FFFD, a
source longer than the model's `max_length` tokens is cut there, and outputs have at most
`max_length + max_extra_length` tokens, so no request can take unbounded memory. An input that
is not a vector of strings (TF Serving passes on any shape) is refused with InvalidArgument.
"""

import tensorflow as tf

from keras_transformer.search import DecodingSettings, decode

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")


class Translator(tf.Module):
    """A trained `Transformer` with its tokenizer and fixed decoding settings.

    Args:
        model: the `Transformer`.
        tokenizer: the run's `Tokenizer`.
        settings: a `DecodingSettings` (beam size 1 is greedy search).
        assets: files to carry in the SavedModel's assets (the SentencePiece model, config,
            metadata).
    """

    def __init__(self, model, tokenizer, settings=DecodingSettings(), assets=()):
        super().__init__()
        self.model = model
        # The tf.Variables behind Keras 3's variables, tracked here so that the C++ loader (TF
        # Serving, saved_model_cli) restores them too, not only tf.saved_model.load in Python.
        self.model_variables = [weight.value for weight in model.weights]
        self.tokenizer = tokenizer
        self.settings = settings
        self.assets = [tf.saved_model.Asset(path) for path in assets]

    @tf.function(input_signature=[TEXT_SPEC])
    def translate(self, text):
        # TF Serving feeds any shape it is sent; Python callers are checked against TEXT_SPEC.
        text = tf.ensure_shape(text, TEXT_SPEC.shape, name="text_must_be_a_vector_of_strings")
        text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
        source_ids = self.tokenizer.encode_source(text, self.model.config.max_length).to_tensor()
        result = decode(self.model, source_ids, self.settings, static_shapes=False)  # no XLA: the growing cache
        return {"translation": self.tokenizer.detokenize(result.tokens), "score": result.scores}
