"""The exported tf.Module: text -> SentencePiece ids -> beam (or greedy) search -> text.

One function, `translate`, is both `loaded.translate(text)` and the `serving_default` signature:
input `text` (tf.string, [None]); outputs `translation` (tf.string, [None]) and `score`
(tf.float32, [None], the length-penalised log-probability). It uses only ops of TensorFlow and
tensorflow-text (which the stock TF Serving binary links), and no XLA.

Bad input still gets one result per line: bytes that are not UTF-8 are replaced by U+FFFD, a
source longer than the model's `max_length` tokens is cut there, and outputs have at most
`max_length + max_extra_length` tokens, so no request can take unbounded memory. An input that
is not a vector of strings (TF Serving passes on any shape) is refused with InvalidArgument.

A request's sentences are decoded by `PARALLEL_SEARCHES` independent searches
(`keras_transformer.search.in_parallel`), which run side by side on separate cores when each op
runs on one thread: `use_serving_threads()` here, `--tensorflow_intra_op_parallelism=1` in TF
Serving (README).
"""

import os

import tensorflow as tf

from keras_transformer.search import DecodingSettings, decode

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
PARALLEL_SEARCHES = 2


def use_serving_threads():
    """Runs this process's TensorFlow ops on one thread each, and as many side by side as there
    are cores (at least 2), as the README's TF Serving command does. Call it before TensorFlow
    runs any op. On CPUs a decoding step's small ops lose more to spreading each over the cores
    than they gain, and the served model's parallel searches use the cores instead."""
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(max(2, os.cpu_count() or 1))


class Translator(tf.Module):
    """A trained `Transformer` with its tokenizer and fixed decoding settings.

    Args:
        model: the `Transformer`.
        tokenizer: the run's `Tokenizer`.
        settings: a `DecodingSettings` (beam size 1 is greedy search).
        assets: files to carry in the SavedModel's assets (the SentencePiece model, config,
            metadata).
        searches: the independent searches a request's sentences are split between.
    """

    def __init__(self, model, tokenizer, settings=DecodingSettings(), assets=(), searches=PARALLEL_SEARCHES):
        super().__init__()
        self.model = model
        # The tf.Variables behind Keras 3's variables, tracked here so that the C++ loader (TF
        # Serving, saved_model_cli) restores them too, not only tf.saved_model.load in Python.
        self.model_variables = [weight.value for weight in model.weights]
        self.tokenizer = tokenizer
        self.settings = settings
        self.searches = searches
        self.assets = [tf.saved_model.Asset(path) for path in assets]

    @tf.function(input_signature=[TEXT_SPEC])
    def translate(self, text):
        # TF Serving feeds any shape it is sent; Python callers are checked against TEXT_SPEC.
        text = tf.ensure_shape(text, TEXT_SPEC.shape, name="text_must_be_a_vector_of_strings")
        text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
        source_ids = self.tokenizer.encode_source(text, self.model.config.max_length).to_tensor()
        # No XLA: the growing cache.
        result = decode(self.model, source_ids, self.settings, static_shapes=False, searches=self.searches)
        return {"translation": self.tokenizer.detokenize(result.tokens), "score": result.scores}
