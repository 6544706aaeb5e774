"""The exported tf.Module: text -> SentencePiece ids -> beam (or greedy) search -> text.

One function, `translate`, is both `loaded.translate(text)` and the `serving_default` signature:
input `text` (tf.string, [None]); outputs `translation` (tf.string, [None]) and `score`
(tf.float32, [None], the length-penalised log-probability). It uses only ops of TensorFlow and
tensorflow-text (which the stock TF Serving binary links), and no XLA.

Bad input still gets one result per line: bytes that are not UTF-8 are replaced by U+FFFD, a
source longer than `max_source_length` tokens is cut there, and outputs have at most
`max_source_length + max_extra_length` tokens, so no request can take unbounded memory.
"""

import tensorflow as tf

from keras_transformer import EOS_ID, PAD_ID
from keras_transformer.search import beam_search, greedy_search

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")


class Translator(tf.Module):
    """A trained `Transformer` with its tokenizer and fixed decoding settings.

    Args:
        model: the `Transformer`.
        tokenizer: the run's `Tokenizer`.
        beam_size: 1 for greedy search.
        alpha: the length penalty.
        max_extra_length: outputs have at most source length + this many tokens.
        assets: files to carry in the SavedModel's assets (the SentencePiece model, config,
            metadata).
    """

    def __init__(self, model, tokenizer, *, beam_size=4, alpha=0.6, max_extra_length=50, assets=()):
        super().__init__()
        self.model = model
        # The tf.Variables behind Keras 3's variables, tracked here so that the C++ loader (TF
        # Serving, saved_model_cli) restores them too, not only tf.saved_model.load in Python.
        self.model_variables = [weight.value for weight in model.weights]
        self.tokenizer = tokenizer
        self.beam_size, self.alpha, self.max_extra_length = beam_size, alpha, max_extra_length
        self.max_source_length = model.config.max_length
        self.assets = [tf.saved_model.Asset(path) for path in assets]

    @tf.function(input_signature=[TEXT_SPEC])
    def translate(self, text):
        text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
        ids = self.tokenizer.tokenize(text)[:, : self.max_source_length - 1]
        eos = tf.fill([tf.shape(text)[0], 1], EOS_ID)
        source_ids = tf.concat([ids, tf.RaggedTensor.from_tensor(eos)], axis=1).to_tensor(PAD_ID)
        settings = dict(alpha=self.alpha, max_extra_length=self.max_extra_length)
        if self.beam_size == 1:
            result = greedy_search(self.model, source_ids, **settings)
        else:
            result = beam_search(self.model, source_ids, beam_size=self.beam_size, **settings)
        return {"translation": self.tokenizer.detokenize(result.tokens), "score": result.scores}
