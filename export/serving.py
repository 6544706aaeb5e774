"""The exported tf.Module: text -> SentencePiece ids -> beam (or greedy) search -> text.

Each signature (export/signatures.py declares them: inputs, outputs, defaults; export/README.md
shows them) is a method of the loaded module: `translate` (`serving_default`), `n_best`,
`alignments`, `prefix`, `sample`, `options` and `score`. In an export of several target languages
each also takes `target_language`, the language to write, which puts its tag in front of the
source (a request without it: the export's first language; an unknown one is an
InvalidArgument). They use only ops of TensorFlow and tensorflow-text (which the stock TF Serving
binary links), and no XLA.

Bad input still gets one result per line: bytes that are not UTF-8 are replaced by U+FFFD, a
source longer than the model's `max_length` tokens is cut there, and outputs have at most
`max_length_a * max_length + max_length_b` tokens, so no request can take unbounded memory; no
option's value costs more than the largest that can change the output (an n-gram size or a
phrase longer than the output is worth nothing). An input that is not a vector of strings (TF
Serving passes on any shape) is refused with InvalidArgument.

A request's sentences are decoded by `PARALLEL_SEARCHES` independent searches (`in_parallel`),
which run side by side on separate cores when each op runs on one thread: `use_serving_threads()`
here, `--tensorflow_intra_op_parallelism=1` in TF Serving (export/README.md).
"""

import dataclasses
import inspect
import os

import tensorflow as tf

from export.layout import TARGET_LANGUAGES
from export.signatures import SIGNATURES
from keras_transformer.common import NEG_INF, PAD_ID
from keras_transformer.search import (OPTIONS, DecodingSettings, Execution, SamplingSettings, alignments, decode,
                                      sample_search)  # fmt: skip
from keras_transformer.search import score as score_translations
from keras_transformer.search.input_length import cut
from keras_transformer.search.loop import graph_function
from keras_transformer.search.outputs import length_limits
from keras_transformer.search.shortlist import candidates, most_candidates, search_over

IDS_SPEC = tf.TensorSpec([None, None], tf.int32)
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
        languages: {target language: the text in front of a source that asks for it (its tag
            and a space, training/languages.py; "" for a model of one pair)}, the first the
            default.
        assets: files to carry in the SavedModel's assets (the SentencePiece model, config,
            metadata).
        searches: the independent searches a request's sentences are split between.
        compiled_shapes: an `export.xla.CompiledShapes`: `translate` (`serving_default`) runs
            requests of those shapes compiled by XLA (export/xla.py); None: no XLA.
        shortlist: (lexical table int32 `[vocab, width]`, always list int32 `[n]`)
            (training/shortlist.py): each search (XLA's too) scores only its request's
            candidates (keras_transformer/search/shortlist.py); None: the whole vocabulary.
    """

    def __init__(self, model, tokenizer, settings=DecodingSettings(), *, languages, assets=(), searches=PARALLEL_SEARCHES,
                 compiled_shapes=None, shortlist=None):  # fmt: skip
        super().__init__()
        self.model = model
        self.languages = dict(languages)
        # The tf.Variables behind Keras 3's variables, tracked here so that the C++ loader (TF
        # Serving, saved_model_cli) restores them too, not only tf.saved_model.load in Python.
        self.model_variables = [weight.value for weight in model.weights]
        self.tokenizer = tokenizer
        self.settings = settings
        self.searches = searches
        self.shortlist = None if shortlist is None else [tf.Variable(values, trainable=False) for values in shortlist]
        self.assets = [tf.saved_model.Asset(path) for path in assets]
        object.__setattr__(self, "_search_functions", {})  # untracked: the signatures' graphs hold them
        translate_ids = lambda ids: self._search(settings, ids)  # noqa: E731
        if compiled_shapes is not None:
            from export.xla import CompiledSearch

            compiled = lambda ids, execution: self._decode(decode, ids, settings, execution=execution)  # noqa: E731
            translate_ids = CompiledSearch(compiled, compiled_shapes, fallback=translate_ids)
        object.__setattr__(self, "_translate_ids", translate_ids)
        # Outputs of the `options` signature have at most the export's limit for its longest source.
        self.longest_output = int(settings.max_length_a * model.config.max_length) + settings.max_length_b
        for signature in SIGNATURES:  # its method: an input with a default defaults to the export's value
            inputs = signature.served_inputs(self.choices)
            method = self._checked(getattr(self, "_" + signature.method), inputs)
            defaults = [self._default(row) for row in inputs if row.has_default]
            setattr(self, signature.method, with_defaults(method, [row.spec for row in inputs], defaults))

    @property
    def choices(self):
        """{metadata.json key: the export's values} for the inputs that pick one (`Input.choices`)."""
        return {TARGET_LANGUAGES: tuple(self.languages)}

    def _translate(self, text, target_language=None):
        result = self._translate_ids(self._source_ids(text, target_language))
        return {"translation": self.tokenizer.target.detokenize(result.tokens), "score": result.scores}

    def _alignments(self, text, target_language=None):
        source_ids = self._source_ids(text, target_language)
        result = self._search(self.settings, source_ids)
        source_length, target_length = (tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=1)
                                        for ids in (source_ids, result.tokens))  # fmt: skip
        tokens = result.tokens[:, : tf.reduce_max(tf.concat([target_length, [0]], axis=0))]  # [batch, target]
        return {
            "translation": self.tokenizer.target.detokenize(tokens),
            "score": result.scores,
            "source_pieces": self.tokenizer.source.pieces(source_ids),
            "source_length": source_length,
            "target_pieces": self.tokenizer.target.pieces(tokens),
            "target_length": target_length,
            "attention": alignments(self.model, source_ids, tokens, self.settings.alignment_layer),
        }

    def _n_best(self, text, n, target_language=None):
        # The beam's k best, all final; their first n are the n best.
        settings = dataclasses.replace(self.settings, num_hypotheses=self.settings.beam_size)
        return self._lists(self._search(settings, self._source_ids(text, target_language)), n)

    def _prefix(self, text, prefix, target_language=None):
        source_ids = self._source_ids(text, target_language)
        prefix_ids = self.tokenizer.target.tokenize(_clean(prefix)).to_tensor()  # [batch, p]
        limit, _ = length_limits(self.model, source_ids, self.settings, None)  # [batch]
        pieces = tf.reduce_sum(tf.cast(prefix_ids != PAD_ID, tf.int32), axis=1)
        message = (f"prefix has more pieces than a translation of its sentence may have (max_length_a "
                   f"{self.settings.max_length_a} * the pieces of the source + max_length_b {self.settings.max_length_b})")  # fmt: skip
        with tf.control_dependencies([tf.debugging.assert_less_equal(pieces, limit, message=message)]):
            result = self._search(self.settings, source_ids, prefix_ids)
        return {"translation": self.tokenizer.target.detokenize(result.tokens), "score": result.scores}

    def _sample(self, text, samples, seed, target_language=None, **sampling):
        """`samples` translations of each sentence drawn with the inputs of `SAMPLING_OPTIONS`
        (`sampling`, by name, a value per sentence)."""
        width = tf.reduce_max(tf.concat([samples, [0]], axis=0))
        result = self._sampled(self._source_ids(text, target_language), seed, SamplingSettings(**sampling), width)
        return self._lists(result, samples)

    def _options(self, text, target_language=None, **values):
        """`serving_default` with the decoding options of `OPTIONS` (`values`, by name), each a
        value per sentence (or one for all); the export's where a request gives none."""
        source_ids = self._source_ids(text, target_language, max_length=None)  # cut below, at the request's limit or the model's
        options = {option.name: option.kind.from_served(values[option.name], self._pieces_of_phrases) for option in OPTIONS}
        limit = options.pop("max_input_length")
        limit = tf.where(limit > 0, tf.minimum(limit, self.model.config.max_length), self.model.config.max_length)
        source_ids, was_cut = cut(source_ids, limit)  # cut here, not again per slice
        result = self._search_with_options(_trimmed(source_ids), options)
        return {"translation": self.tokenizer.target.detokenize(result.tokens), "score": result.scores, "cut": was_cut}

    def _score(self, text, target, alpha, target_language=None):
        source_ids = self._source_ids(text, target_language)
        target_ids = self.tokenizer.target.encode(_clean(target), self.model.config.max_length).to_tensor()

        def scored(source_ids, target_ids, alpha):  # a slice's, trimmed to its own longest source and target
            return score_translations(self.model, _trimmed(source_ids), _trimmed(target_ids), alpha)

        specs = [IDS_SPEC, IDS_SPEC, tf.TensorSpec([None], tf.float32)]
        result = in_parallel(self._function("score", scored, specs), (source_ids, target_ids, alpha), self.searches)
        return {"log_prob": result.log_prob, "score": result.score, "token_log_probs": result.token_log_probs,
                "length": result.length}  # fmt: skip

    def _default(self, row):
        """The export's value of input `row` as the signature's default: one value, for every
        sentence. An option's is the export's decoding setting; a choice's, the export's first."""
        if row.choices:
            return tf.constant([self.choices[row.choices][0]])
        kind = row.option.kind
        detokenize = lambda ids: self.tokenizer.target.detokenize(tf.ragged.constant(ids)).numpy()  # noqa: E731
        return tf.constant(kind.served_default(getattr(self.settings, row.option.name), detokenize), kind.served_dtype)

    def _checked(self, method, inputs):
        """`method` with its inputs (rows of `INPUTS`) checked before it runs: each is valid by its
        row and each after the first holds a value per sentence of the first (an option's: or one
        for all, repeated), or the request is an InvalidArgument that names it, before any search."""

        def checked(first, *values):
            values = [_of_its_rank(first, inputs[0].name)] + [
                _per_sentence(value, row.name, first, inputs[0].name, broadcast=row.has_default)
                for row, value in zip(inputs[1:], values)]  # fmt: skip
            with tf.control_dependencies([check for row, value in zip(inputs, values) for check in self._checks(row, value)]):
                return method(**{row.name: tf.identity(value) for row, value in zip(inputs, values)})

        return checked

    def _checks(self, row, value):
        """Assertions that `value` is valid for the input `row`, whose InvalidArgument names it
        (and for a choice, the values not among the export's, and the export's)."""
        if row.choices:
            choices = self.choices[row.choices]
            known = tf.reduce_any(_which(value, choices), axis=1)
            message = f"{row.name} must be one of the {row.choices.replace('_', ' ')} of this export ({', '.join(choices)}); unknown:"
            return [tf.debugging.Assert(tf.reduce_all(known), [message, tf.boolean_mask(value, ~known)])]
        if row.check is None:
            return []
        valid, most = row.check(value), getattr(self.settings, row.bound) if row.bound else None
        if most is not None:
            valid &= value <= most
        return [tf.debugging.Assert(tf.reduce_all(valid), [f"{row.name} must be {row.valid_text(most)}"])]

    def _pieces_of_phrases(self, phrases):
        """Strings `[batch, s]` -> their pieces, int32 `[batch, s, pieces]` (padded with 0). A phrase
        of more pieces than the longest output never occurs in one: it becomes padding, so that
        no phrase makes a step cost more than one of `longest_output` pieces."""
        shape = tf.shape(phrases)
        ids = self.tokenizer.target.tokenize(_clean(tf.reshape(phrases, [-1]))).to_tensor()  # [batch * s, pieces]
        fits = tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=1, keepdims=True) <= self.longest_output
        ids = _trimmed(tf.where(fits, ids, PAD_ID))
        return tf.reshape(ids, tf.concat([shape, tf.shape(ids)[1:]], axis=0))

    def _search_with_options(self, source_ids, options):
        names = list(options)

        def search(ids, *values):
            settings = dataclasses.replace(self.settings, max_input_length=0, **dict(zip(names, values)))
            return self._decode(decode, ids, settings, execution=SERVED_EXECUTION, width=self.settings.beam_size,
                                max_length=self.longest_output)  # fmt: skip

        specs = [IDS_SPEC, *(tf.TensorSpec([None] * len(value.shape), value.dtype) for value in options.values())]
        return in_parallel(self._function("options", search, specs), (source_ids, *options.values()), self.searches)

    def _lists(self, result, n):
        """A `SearchResult` of `[batch, width, length]` outputs -> each sentence's first `n`
        (int32 `[batch]`) as text, padded with "" and their scores with NEG_INF."""
        width = tf.reduce_max(tf.concat([n, [0]], axis=0))
        tokens, scores = result.tokens[:, :width], result.scores[:, :width]  # [batch, width, length], [batch, width]
        shape = tf.shape(tokens)
        translations = tf.reshape(self.tokenizer.target.detokenize(tf.reshape(tokens, [-1, shape[2]])), shape[:2])
        asked = tf.range(width)[None] < n[:, None]  # [batch, width]
        return {"translations": tf.where(asked, translations, ""), "scores": tf.where(asked, scores, NEG_INF)}

    def _source_ids(self, text, target_language=None, max_length=-1):
        """Text `[batch]` -> the ids the model reads `[batch, length]`, each asking for its
        `target_language` (`[batch]`, checked already; None: the export's only one), cut at
        `max_length` tokens (`_ids`)."""
        if target_language is None:  # the export's one language: its tag, or none for a model of one pair
            prefixes = next(iter(self.languages.values()))
            if not prefixes:
                return self._ids(text, max_length)
        else:
            asked = tf.argmax(tf.cast(_which(target_language, self.languages), tf.int32), axis=1)
            prefixes = tf.gather(tf.constant(list(self.languages.values())), asked)
        return self._ids(tf.strings.join([prefixes, text]), max_length)  # cleaned there, the ASCII tags too

    def _ids(self, text, max_length=-1):
        """Text `[batch]` -> its pieces and end of sentence `[batch, length]`, cut at `max_length`
        tokens (default: the model's; None: not cut)."""
        max_length = self.model.config.max_length if max_length == -1 else max_length
        return self.tokenizer.encode_source(_clean(text), max_length).to_tensor()

    def _search(self, settings, source_ids, target_prefix=None):
        def search(ids, prefix=None):
            return self._decode(decode, ids, settings, prefix, execution=SERVED_EXECUTION)

        prefixed = target_prefix is not None
        inputs = (source_ids, target_prefix) if prefixed else (source_ids,)
        return in_parallel(self._function((settings, prefixed), search, [IDS_SPEC] * len(inputs)), inputs, self.searches)

    def _sampled(self, source_ids, seed, sampling, samples):
        """`sample_search` of `samples` (an int32 scalar) outputs of each sentence, with its `seed`
        and `sampling` (a `SamplingSettings` of a value per sentence)."""
        names = [field.name for field in dataclasses.fields(sampling)]

        def sample(ids, seed, *rest):  # rest: the values of `names`, then `samples`
            *values, samples = rest

            def draw(model, ids, settings, target_prefix=None):
                return sample_search(model, ids, seed, settings, num_samples=samples, execution=SERVED_EXECUTION,
                                     **dict(zip(names, values)))  # fmt: skip

            return self._decode(draw, ids, self.settings)

        batched = (source_ids, seed, *(getattr(sampling, name) for name in names))  # one row per sentence
        specs = [IDS_SPEC, *(tf.TensorSpec([None], value.dtype) for value in batched[1:]), tf.TensorSpec([], tf.int32)]
        return in_parallel(self._function("sample", sample, specs), batched, self.searches, shared=(samples,))

    def _decode(self, search, ids, settings, target_prefix=None, **kwargs):
        """`search(model, ids, settings, target_prefix=..., **kwargs)` (`decode`, ...) over the
        model, or with a shortlist over the candidates of `ids` and the prefix's tokens alone
        (as many as the most that `ids` of a static shape can have, for XLA)."""
        if self.shortlist is None:
            return search(self.model, ids, settings, target_prefix=target_prefix, **kwargs)
        table, always = self.shortlist
        size = None
        if ids.shape.is_fully_defined() and target_prefix is None:
            size = most_candidates(ids.shape, table.shape[1], always.shape[0], self.model.config.vocab_size)
        vocabulary = candidates(ids, table, always, forced=target_prefix, minimum=2 * self.settings.beam_size, size=size)
        return search_over(vocabulary, search, self.model, ids, settings, target_prefix, **kwargs)

    def _function(self, key, search, specs):
        """One tf.function per kind of search, so that the signatures that search alike share its
        graph, and a SavedModel holds it once."""
        if key not in self._search_functions:
            self._search_functions[key] = graph_function(search, input_signature=specs)
        return self._search_functions[key]


def _clean(text):
    """A string vector's bytes that are not UTF-8 replaced by U+FFFD."""
    return tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)


def _which(values, choices):
    """Strings `[batch]` -> bool `[batch, choices]`: which of `choices` each one is."""
    return tf.equal(values[:, None], tf.constant(list(choices))[None, :])


def _of_its_rank(values, name):
    """Input `name`'s `values` checked to have the signature's rank (TF Serving feeds any shape it
    is sent; Python callers are checked against the signature), with an error that names it."""
    kind = {1: "vector", 2: "matrix"}.get(len(values.shape), f"rank_{len(values.shape)}_tensor")
    return tf.ensure_shape(values, [None] * len(values.shape), name=f"{name}_must_be_a_{kind}_of_{values.dtype.name}")


def _per_sentence(values, name, first, first_name, broadcast=False):
    """Input `name`'s `values` checked to have the signature's rank and one value per sentence of
    the first input, `first`, named `first_name` (with `broadcast`, or one for all, which is
    repeated), with errors that name the input."""
    values = _of_its_rank(values, name)
    rows, batch = tf.shape(values)[0], tf.shape(first)[0]
    if broadcast:
        values = tf.cond(tf.equal(rows, 1), lambda: tf.repeat(values, batch, axis=0), lambda: values)
        rows = tf.shape(values)[0]
    message = f"{name} must hold one value per sentence of {first_name}" + (" (or one for all)" if broadcast else "")
    with tf.control_dependencies([tf.debugging.assert_equal(rows, batch, message=message)]):
        return tf.identity(values)


def with_defaults(method, specs, defaults):
    """`graph_function(method, input_signature=specs)` whose last inputs default to `defaults`
    (tensors of one row): a SavedModel records them in the signature, and TF Serving
    feeds them for inputs a request leaves out."""

    def function(*values):
        return method(*values)

    parameter = inspect.Parameter
    required = len(specs) - len(defaults)
    function.__signature__ = inspect.Signature(
        [parameter(spec.name, parameter.POSITIONAL_OR_KEYWORD) for spec in specs[:required]]
        + [parameter(spec.name, parameter.POSITIONAL_OR_KEYWORD, default=default)
           for spec, default in zip(specs[required:], defaults)]
    )  # fmt: skip
    return graph_function(function, input_signature=specs)


def in_parallel(search, batched, searches, shared=()):
    """`search(*batched, *shared)`, a `SearchResult` (or another namedtuple of `[rows, ...]`
    tensors: a `ScoreResult`), as `searches` independent searches over
    consecutive slices of the batch (some may be empty), concatenated: the same result.
    `batched` is a tensor `[batch, ...]` (source ids) or a tuple of them (with a target prefix,
    per-sentence options); `shared` are passed whole to each search.

    For TensorFlow graphs on CPUs. The graph then holds that many loops that share nothing, and
    TensorFlow runs them side by side, one per core, when each op runs on one thread (intra-op
    parallelism 1, `use_serving_threads`): a decoding step is a chain of small ops, which gain
    less from being spread over the cores than they lose to the threads' hand-offs. With
    TensorFlow's default threads it makes little difference.
    """
    batched = tuple(batched) if isinstance(batched, (tuple, list)) else (batched,)
    if searches == 1:
        return search(*batched, *shared)
    if batched[0].shape[0] is None and not isinstance(search, tf.types.experimental.PolymorphicFunction):
        # A served graph (XLA's know their batch): one function, called once per slice, so that
        # the graph (and a SavedModel) holds the search once.
        specs = [tf.TensorSpec([None] * len(value.shape), value.dtype) for value in (*batched, *shared)]
        search = graph_function(search, input_signature=specs)
    batch = batched[0].shape[0] if batched[0].shape[0] is not None else tf.shape(batched[0])[0]
    cuts = [batch * i // searches for i in range(searches + 1)]
    results = [search(*(value[start:end] for value in batched), *shared) for start, end in zip(cuts, cuts[1:])]
    return type(results[0])(*(_concatenate(parts) for parts in zip(*results)))


def _trimmed(ids):
    """`ids` `[batch, length]` without the columns that are padding in every row (at least one)."""
    return ids[:, : tf.reduce_max(tf.concat([tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32), axis=1), [1]], 0))]


def _concatenate(parts):
    """Slices' `[rows, ...]` results as one, each padded with 0 along its last axis to the
    longest: each slice's outputs are as long as its own longest (a search's tokens under
    per-sentence length limits, a score's per-token log-probabilities)."""
    if len(parts[0].shape) == 1:
        return tf.concat(parts, axis=0)
    longest = tf.reduce_max(tf.stack([tf.shape(part)[-1] for part in parts]))
    return tf.concat([tf.pad(part, [[0, 0]] * (len(part.shape) - 1) + [[0, longest - tf.shape(part)[-1]]]) for part in parts], 0)
