"""The exported tf.Module: text -> SentencePiece ids -> beam (or greedy) search -> text.

Each function is both a method of the loaded module and a signature of TF Serving's:

- `translate`, the `serving_default` signature: input `text` (tf.string, [None]); outputs
  `translation` (tf.string, [None]) and `score` (tf.float32, [None], the length-penalised
  log-probability).
- `n_best`, the `n_best` signature: inputs `text` and `n` (tf.int32, [None]: for each sentence,
  how many translations, 1 to the beam size); outputs `translations` (tf.string, [None, None])
  and `scores` (tf.float32, [None, None]), each sentence's n best translations, best first, as
  many columns as the largest n (server-side batching may merge requests), the columns past a
  sentence's n holding "" and -1e9.
- `alignments`, the `alignments` signature: input `text`; outputs `translation` and `score` as
  `serving_default`'s, the pieces the model read and wrote, `source_pieces` (tf.string, [None,
  None], the source's pieces and its end of sentence "</s>") and `target_pieces` (tf.string,
  [None, None]), padded with "", their counts `source_length` and `target_length` (tf.int32,
  [None]), and `attention` (tf.float32, [None, target, source]): for each target piece, the
  encoder-decoder attention of the decoder layer `settings.alignment_layer`, averaged over its
  heads (`keras_transformer.search.alignments`): a distribution over the source pieces, 0 on
  padding.

They use only ops of TensorFlow and tensorflow-text (which the stock TF Serving binary links),
and no XLA.

Bad input still gets one result per line: bytes that are not UTF-8 are replaced by U+FFFD, a
source longer than the model's `max_length` tokens is cut there, and outputs have at most
`max_length + max_extra_length` tokens, so no request can take unbounded memory. An input that
is not a vector of strings (TF Serving passes on any shape) is refused with InvalidArgument.

A request's sentences are decoded by `PARALLEL_SEARCHES` independent searches (`in_parallel`),
which run side by side on separate cores when each op runs on one thread: `use_serving_threads()`
here, `--tensorflow_intra_op_parallelism=1` in TF Serving (export/README.md).
"""

import dataclasses
import os

import tensorflow as tf

from keras_transformer.common import NEG_INF, PAD_ID
from keras_transformer.search import DecodingSettings, Execution, SearchResult, alignments, decode

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
N_SPEC = tf.TensorSpec([None], tf.int32, name="n")
SOURCE_IDS_SPEC = tf.TensorSpec([None, None], tf.int32)
PARALLEL_SEARCHES = 2
# The served graph: TensorFlow without XLA (as the stock TF Serving binary runs it), on CPUs.
SERVED_EXECUTION = Execution.choose(compiled=False, platform="cpu")


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
        object.__setattr__(self, "_search_functions", {})  # untracked: the signatures' graphs hold them

    @tf.function(input_signature=[TEXT_SPEC])
    def translate(self, text):
        result = self._search(self._source_ids(text), self.settings)
        return {"translation": self.tokenizer.detokenize(result.tokens), "score": result.scores}

    @tf.function(input_signature=[TEXT_SPEC])
    def alignments(self, text):
        source_ids = self._source_ids(text)
        result = self._search(source_ids, self.settings)
        source_length, target_length = (tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=1)
                                        for ids in (source_ids, result.tokens))  # fmt: skip
        tokens = result.tokens[:, : tf.reduce_max(tf.concat([target_length, [0]], axis=0))]  # [batch, target]
        return {
            "translation": self.tokenizer.detokenize(tokens),
            "score": result.scores,
            "source_pieces": self.tokenizer.pieces(source_ids),
            "source_length": source_length,
            "target_pieces": self.tokenizer.pieces(tokens),
            "target_length": target_length,
            "attention": alignments(self.model, source_ids, tokens, self.settings.alignment_layer),
        }

    @tf.function(input_signature=[TEXT_SPEC, N_SPEC])
    def n_best(self, text, n):
        k = self.settings.beam_size
        n = tf.ensure_shape(n, N_SPEC.shape, name="n_must_be_a_vector_of_int32")
        checks = [
            tf.debugging.assert_equal(tf.size(n), tf.size(text), message="n must hold one value per sentence of text"),
            tf.debugging.assert_greater_equal(n, 1, message=f"n must be 1 to the beam size, {k}"),
            tf.debugging.assert_less_equal(n, k, message=f"n must be 1 to the beam size, {k}"),
        ]
        with tf.control_dependencies(checks):
            # The beam's k best, all final; their first n are the n best.
            result = self._search(self._source_ids(text), dataclasses.replace(self.settings, num_hypotheses=k))
        width = tf.reduce_max(tf.concat([n, [0]], axis=0))
        tokens, scores = result.tokens[:, :width], result.scores[:, :width]  # [batch, width, length], [batch, width]
        shape = tf.shape(tokens)
        translations = tf.reshape(self.tokenizer.detokenize(tf.reshape(tokens, [-1, shape[2]])), shape[:2])
        asked = tf.range(width)[None] < n[:, None]  # [batch, width]
        return {"translations": tf.where(asked, translations, ""), "scores": tf.where(asked, scores, NEG_INF)}

    def _source_ids(self, text):
        # TF Serving feeds any shape it is sent; Python callers are checked against TEXT_SPEC.
        text = tf.ensure_shape(text, TEXT_SPEC.shape, name="text_must_be_a_vector_of_strings")
        text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
        return self.tokenizer.encode_source(text, self.model.config.max_length).to_tensor()

    def _search(self, source_ids, settings):
        # One function per settings, so that the signatures that search alike share its graph.
        if settings not in self._search_functions:
            search = lambda ids: decode(self.model, ids, settings, SERVED_EXECUTION)  # noqa: E731
            self._search_functions[settings] = tf.function(search, input_signature=[SOURCE_IDS_SPEC])
        return in_parallel(self._search_functions[settings], source_ids, self.searches)


def in_parallel(search, source_ids, searches):
    """`search(source_ids)`, a `SearchResult`, as `searches` independent searches over consecutive
    slices of the batch `[batch, source_len]` (some may be empty), concatenated: the same result.

    For TensorFlow graphs on CPUs. The graph then holds that many loops that share nothing, and
    TensorFlow runs them side by side, one per core, when each op runs on one thread (intra-op
    parallelism 1, `use_serving_threads`): a decoding step is a chain of small ops, which gain
    less from being spread over the cores than they lose to the threads' hand-offs. With
    TensorFlow's default threads it makes little difference.
    """
    if searches == 1:
        return search(source_ids)
    if source_ids.shape[0] is None:  # a served graph (XLA's know their batch)
        # One function, called once per slice: the graph (and a SavedModel) holds the search once.
        search = tf.function(search, input_signature=[SOURCE_IDS_SPEC])
    batch = source_ids.shape[0] if source_ids.shape[0] is not None else tf.shape(source_ids)[0]
    cuts = [batch * i // searches for i in range(searches + 1)]
    results = [search(source_ids[start:end]) for start, end in zip(cuts, cuts[1:])]
    return SearchResult(*(tf.concat(parts, axis=0) for parts in zip(*results)))
