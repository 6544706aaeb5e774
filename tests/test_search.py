import functools
import itertools
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import SCORE_TOLERANCE
from keras_transformer import BOS_ID, EOS_ID, PAD_ID, Transformer, TransformerConfig
from keras_transformer.common import take_per_row
from keras_transformer.search import Execution, SearchResult, beam_search, greedy_search
from keras_transformer.search import top_k as top_k_module
from search_helpers import _EosLogit, _ends_at, _forward, _length_penalty, _model, _never_ends, _nonzero_lengths, _sources


def test_beam_size_one_is_greedy(rng):
    # EOS wins or loses by far, on a pseudo-random pattern of sentence and step: hypotheses end
    # at various steps, whatever the random model prefers.
    def eos_logit(index, source_length, slot):
        return tf.where(tf.sin(7.0 * source_length + 3.0 * tf.cast(index, tf.float32)) > 0.6, 30.0, -30.0)

    model = _EosLogit(_model(30, seed=4), eos_logit)
    sources = _sources(rng, [5, 3, 6, 1, 8, 4], 30)
    greedy = greedy_search(model, sources, max_length_b=6)
    beam = beam_search(model, sources, beam_size=1, max_length_b=6)
    np.testing.assert_array_equal(beam.tokens, greedy.tokens)
    np.testing.assert_allclose(beam.scores, greedy.scores, **SCORE_TOLERANCE)
    lengths = _nonzero_lengths(greedy.tokens)
    assert np.any(lengths < np.sum(sources > 0, axis=1) + 6), "no hypothesis ended with EOS"
    assert len(set(lengths)) > 1


def _exhaustive(model, source, max_length, alpha):
    """Every hypothesis a search may return, scored by full forward passes."""
    vocab = model.config.vocab_size
    tokens = [t for t in range(vocab) if t != PAD_ID]
    hypotheses = []
    for length in range(1, max_length + 1):
        for body in itertools.product([t for t in tokens if t != EOS_ID], repeat=length - 1):
            for last in tokens if length == max_length else [EOS_ID]:
                hypotheses.append(list(body) + [last])
    target_inputs = np.zeros((len(hypotheses), max_length), "int32")
    for row, hypothesis in enumerate(hypotheses):
        target_inputs[row, : len(hypothesis)] = [BOS_ID] + hypothesis[:-1]
    logits = _forward(model)(np.repeat(source[None], len(hypotheses), axis=0), target_inputs)
    log_probs = np.asarray(tf.nn.log_softmax(logits[..., 1:]))  # over every token but padding (id 0)
    log_probs = np.concatenate([np.full(log_probs.shape[:-1] + (1,), -np.inf), log_probs], axis=-1)
    scored = []
    for row, hypothesis in enumerate(hypotheses):
        log_prob = sum(log_probs[row, i, t] for i, t in enumerate(hypothesis))
        output = [t for t in hypothesis if t != EOS_ID]
        scored.append((log_prob / _length_penalty(len(hypothesis), alpha), output))
    return sorted(scored, key=lambda pair: -pair[0])


# Beams wide enough to keep every prefix: wider than the vocabulary, and as wide.
@pytest.mark.parametrize("vocab, beam_size, max_length", [(6, 48, 3), (8, 8, 2)])
def test_wide_beam_finds_the_exhaustive_best(vocab, beam_size, max_length, rng):
    model = _model(vocab, seed=11)
    sources = _sources(rng, [4, 2], vocab)
    for alpha in (0.0, 0.6, 1.0):
        # The 5 best: the search stops once nothing alive can beat the 5th.
        result = beam_search(model, sources, beam_size=beam_size, alpha=alpha, max_length=max_length, num_hypotheses=5)
        best = beam_search(model, sources, beam_size=beam_size, alpha=alpha, max_length=max_length)  # stops sooner
        for row, source in enumerate(sources):
            expected = _exhaustive(model, source, max_length, alpha)
            assert list(np.asarray(best.tokens[row])[np.asarray(best.tokens[row]) != PAD_ID]) == expected[0][1]
            for rank in range(5):
                score, output = expected[rank]
                tokens = np.asarray(result.tokens[row, rank])
                assert list(tokens[tokens != PAD_ID]) == output
                np.testing.assert_allclose(result.scores[row, rank], score, rtol=1e-4)


# Chunks that divide the vocabulary; padded chunks (7999, 8003); no chunks (60, 5 and 100, 20:
# with argmax passes, a sort for k > 16).
@pytest.mark.parametrize("vocab, k", [(8000, 4), (37000, 5), (1024, 8), (7999, 4), (8003, 3), (8000, 1), (60, 5),
                                      (100, 20)])  # fmt: skip
@pytest.mark.parametrize("kernel", ["chunks", "chunks_by_argmax"])
def test_top_k_in_chunks_equals_a_full_sort(vocab, k, kernel, rng):
    values = rng.normal(size=(5, vocab)).astype("float32")
    best, index = top_k_module.top_k(keras.ops.convert_to_tensor(values), k, kernel)
    expected = np.argsort(-values, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(index, expected)
    np.testing.assert_array_equal(best, np.take_along_axis(values, expected, axis=1))


def test_top_k_by_argmax_puts_equal_values_in_index_order_as_top_k():
    values = keras.ops.convert_to_tensor([[1.0, 3.0, 3.0, -2.0, 3.0, 0.0], [-1e9, -1e9, -1e9, -1e9, 5.0, -1e9]])
    best, index = top_k_module.top_k_by_argmax(values, 4)
    expected_best, expected_index = keras.ops.top_k(values, 4)
    np.testing.assert_array_equal(index, [[1, 2, 4, 0], [4, 0, 1, 2]])
    np.testing.assert_array_equal(index, expected_index)
    np.testing.assert_array_equal(best, expected_best)


# Every way a search may run (`Execution`): the two caches, shared slots or rows of their own,
# finished sentences dropped or kept, each top-k kernel. The static cache's are also compiled by XLA,
# among them what XLA and JAX run on CPUs (`Execution.choose(compiled=True)`).
EXECUTIONS = [
    Execution("growing", shared_slots=True, drop_finished=True, top_k="chunks"),
    Execution("growing", shared_slots=False, drop_finished=True, top_k="sort"),
    Execution("growing", shared_slots=True, drop_finished=False, top_k="chunks_by_argmax"),
    Execution("static", shared_slots=True, drop_finished=False, top_k="chunks_by_argmax"),
    pytest.param(Execution("static", shared_slots=False, drop_finished=False, top_k="sort"), marks=pytest.mark.slow),  # GPUs, TPUs
]


@pytest.fixture(scope="module")
def every_execution_case():
    """A model whose hypotheses end at various steps over 512 tokens (split into chunks by the
    chunked top-k kernels), sources, and its beam (4 outputs each) and greedy translations with
    sort as the top-k kernel: (model, sources, beam, greedy)."""
    def eos_logit(index, source_length, slot):
        return 6.0 * tf.sin(3.0 * source_length + 1.7 * slot + 2.0 * tf.cast(index, tf.float32))

    model = _EosLogit(_model(512, seed=8), eos_logit)
    sources = _sources(np.random.default_rng(0), [5, 2, 7, 3], 512)
    beam = tf.function(lambda s: beam_search(model, s, max_length_b=5, num_hypotheses=4,
                                             execution=Execution(top_k="sort")))(sources)  # fmt: skip
    assert len(set(_nonzero_lengths(beam.tokens[:, 0]))) > 1
    greedy = tf.function(lambda s: greedy_search(model, s, max_length_b=5, execution=Execution(top_k="sort")))(sources)
    return model, sources, beam, greedy


@pytest.mark.parametrize("execution", EXECUTIONS, ids=str)
def test_every_execution_gives_the_same_translations(execution, every_execution_case):
    model, sources, reference, expected = every_execution_case
    graphs = {"graph": tf.function(lambda s: beam_search(model, s, max_length_b=5, num_hypotheses=4, execution=execution))}
    if execution.cache == "static":
        graphs["XLA"] = tf.function(graphs["graph"].python_function, jit_compile=True)
    for name, graph in graphs.items():
        result = graph(sources)
        np.testing.assert_array_equal(result.tokens, reference.tokens, err_msg=name)
        np.testing.assert_allclose(result.scores, reference.scores, **SCORE_TOLERANCE, err_msg=name)
    result = tf.function(lambda s: greedy_search(model, s, max_length_b=5, execution=execution))(sources)
    np.testing.assert_array_equal(result.tokens, expected.tokens, err_msg="greedy")
    np.testing.assert_allclose(result.scores, expected.scores, **SCORE_TOLERANCE, err_msg="greedy")


def test_execution_refuses_what_cannot_run_and_chooses_the_measured_on_cpus():
    with pytest.raises(ValueError, match="static cache"):
        Execution("static", drop_finished=True)
    with pytest.raises(ValueError, match="cache is one of"):
        Execution("paged")
    assert Execution.choose(compiled=False, platform="cpu") == Execution("growing", True, True, "chunks")
    assert Execution.choose(compiled=True, platform="cpu") == Execution("static", True, False, "chunks_by_argmax")
    assert all(Execution.choose(compiled=c, platform="cpu") in EXECUTIONS for c in (False, True))  # each checked above
    for platform in ("gpu", "tpu"):  # nothing measured there: no argmax passes, no shared slots
        assert Execution.choose(compiled=True, platform=platform) == Execution("static", False, False, "sort")


def test_the_best_hypothesis_is_final_when_the_search_stops_for_it(rng):
    """Returning the best, a sentence stops once nothing alive can beat its best finished
    hypothesis, sooner than once nothing can beat its k-th: the best is the same."""
    def eos_logit(index, source_length, slot):  # hypotheses end at various steps
        return 4.0 * tf.sin(5.0 * source_length + 1.3 * slot + 2.0 * tf.cast(index, tf.float32))

    model = _EosLogit(_model(30, seed=12), eos_logit)
    sources = _sources(rng, [6, 2, 9, 4, 7], 30)
    for alpha in (0.0, 0.6):
        best = beam_search(model, sources, beam_size=3, alpha=alpha, max_length_b=10)
        every = beam_search(model, sources, beam_size=3, alpha=alpha, max_length_b=10, num_hypotheses=3)
        np.testing.assert_array_equal(best.tokens, every.tokens[:, 0])
        np.testing.assert_allclose(best.scores, every.scores[:, 0], **SCORE_TOLERANCE)


def _first_k_reference(model, source, eos_logit, k, alpha, limit):
    """Beam search as CTranslate2 and fairseq stop it, by full forward passes, one sentence:
    each step keeps the k best extensions of the alive hypotheses; those that end (EOS, or the
    length limit) leave the beam; once k have ended, the best of them by log P / lp."""
    alive, ended = [([], 0.0)], []
    for index in range(limit):
        extensions = []
        for tokens, log_prob in alive:
            inputs = np.array([[BOS_ID] + tokens], "int32")
            logits = np.array(_forward(model)(source[None], inputs)[0, -1], "float64")
            logits[EOS_ID] += float(eos_logit(index, float(np.sum(source != PAD_ID))))
            logits[PAD_ID] = -np.inf
            log_probs = logits - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()
            extensions += [(tokens + [t], log_prob + log_probs[t]) for t in range(len(logits)) if t != PAD_ID]
        extensions = sorted(extensions, key=lambda pair: -pair[1])[:k]
        alive = []
        for tokens, log_prob in extensions:
            if tokens[-1] == EOS_ID or index + 1 >= limit:
                ended.append((log_prob / _length_penalty(len(tokens), alpha), [t for t in tokens if t != EOS_ID]))
            else:
                alive.append((tokens, log_prob))
        if len(ended) >= k:
            break
    return max(ended, key=lambda pair: pair[0])


def test_first_k_stopping_returns_the_best_of_the_first_k_ended_and_stops_sooner(rng):
    def eos_logit(index, source_length):  # hypotheses end at various steps
        return 2.0 * np.sin(5.0 * source_length + 2.0 * index)

    rows = {}  # decoded, per rule: the search stops decoding the sentences that are done

    class Counting(_EosLogit):
        def decode_step(self, token_ids, index, cache):
            rows[self.stopping] = rows.get(self.stopping, 0) + int(token_ids.shape[0])
            return super().decode_step(token_ids, index, cache)

    model = _model(30, seed=12)
    searcher = Counting(model, lambda index, source_length, slot: eos_logit(tf.cast(index, tf.float32), source_length))
    sources = _sources(rng, [6, 2, 9, 4, 7], 30)
    results = {}
    for stopping in ("first_k", "exact"):
        searcher.stopping = stopping
        results[stopping] = beam_search(searcher, sources, beam_size=3, alpha=0.6, max_length_b=10, stopping=stopping)
    for row, source in enumerate(sources):
        score, tokens = _first_k_reference(model, source, eos_logit, 3, 0.6, int(np.sum(source != PAD_ID)) + 10)
        found = np.asarray(results["first_k"].tokens[row])
        assert list(found[found != PAD_ID]) == tokens, row
        np.testing.assert_allclose(results["first_k"].scores[row], score, rtol=1e-4)
    # The exact rule decodes on from the same beams, and can only find a better hypothesis.
    assert rows["first_k"] < rows["exact"]
    exact, first_k = (np.asarray(results[rule].scores) for rule in ("exact", "first_k"))
    assert np.all((exact >= first_k) | np.isclose(exact, first_k, **SCORE_TOLERANCE))


@pytest.mark.parametrize("beam_size", [1, 3])
def test_the_growing_cache_stops_decoding_the_sentences_that_are_done(beam_size, rng):
    model = _model(30, seed=7)
    rows = []

    class Counting(_EosLogit):
        def decode_step(self, token_ids, index, cache):
            rows.append(int(token_ids.shape[0]))
            return super().decode_step(token_ids, index, cache)

    never_ends = Counting(model, lambda index, source_length, slot: -1e4)
    sources = _sources(rng, [2, 9], 30)  # length limits 3 and 10
    search = greedy_search if beam_size == 1 else functools.partial(beam_search, beam_size=beam_size)
    result = search(never_ends, sources, max_length_b=1)  # eager: a Python loop
    assert rows == [2 * beam_size] * 3 + [beam_size] * 7
    assert list(_nonzero_lengths(result.tokens)) == [3, 10]


@pytest.mark.parametrize("search", [greedy_search, functools.partial(beam_search, beam_size=3)], ids=["greedy", "beam"])
def test_a_graph_traces_the_step_once_unless_a_step_changes_an_axis_that_was_not_empty(search, rng):
    # keras_transformer/search/loop.py: a served graph (batch unknown) grows only empty axes; a
    # batch of static size that drops finished sentences is found out and traced twice more.
    model, traces = _model(30, seed=7), []

    class Counting(_EosLogit):
        def decode_step(self, token_ids, index, cache):
            traces.append(index)
            return super().decode_step(token_ids, index, cache)

    counting, sources = Counting(model, lambda index, source_length, slot: 0.0), _sources(rng, [2, 9], 30)
    expected = search(model, sources, max_length_b=2).tokens
    for signature, traced in (([tf.TensorSpec([None, None], tf.int32)], 1), (None, 3)):
        traces.clear()
        graph = tf.function(lambda ids: search(counting, ids, max_length_b=2), input_signature=signature, autograph=False)
        np.testing.assert_array_equal(graph(sources).tokens, expected)
        assert len(traces) == traced, signature


def test_a_sentence_alone_equals_it_in_a_batch(rng):
    model = _model(30, seed=5)
    sources = _sources(rng, [7, 1, 4], 30)
    for search in (greedy_search, beam_search):
        batched = search(model, sources, max_length_b=8)
        for row, length in enumerate(np.sum(sources > 0, axis=1)):
            alone = search(model, sources[row : row + 1, :length], max_length_b=8)
            width = alone.tokens.shape[-1]
            np.testing.assert_array_equal(batched.tokens[row, :width], alone.tokens[0])
            assert not np.any(batched.tokens[row, width:])
            np.testing.assert_allclose(batched.scores[row], alone.scores[0], **SCORE_TOLERANCE)


@pytest.mark.parametrize("search", [greedy_search, beam_search])
def test_output_ends_at_eos(search, rng):
    forced = _ends_at(_model(20), 4)
    sources = _sources(rng, [5, 2, 9], 20)
    result = search(forced, sources, max_length_b=10)
    tokens = np.asarray(result.tokens)
    np.testing.assert_array_equal(_nonzero_lengths(tokens), [3, 3, 3])
    assert not np.any(tokens == EOS_ID) and not np.any(tokens[:, 3:])
    # The score is normalised by the length including EOS.
    assert np.all(np.asarray(result.scores) < 0)


@pytest.mark.parametrize("search", [greedy_search, beam_search])
def test_a_model_that_never_ends_stops_at_the_length_limit(search, rng):
    forced = _never_ends(_model(20))
    sources = _sources(rng, [5, 2, 9], 20)
    result = search(forced, sources, max_length_b=4)
    np.testing.assert_array_equal(_nonzero_lengths(result.tokens), [9, 6, 13])
    capped = search(forced, sources, max_length_b=4, max_length=7)
    np.testing.assert_array_equal(_nonzero_lengths(capped.tokens), [7, 6, 7])


def test_n_best_is_sorted_and_distinct_and_starts_with_the_best(rng):
    model = _model(30, seed=9)
    sources = _sources(rng, [6, 4, 1], 30)
    result = beam_search(model, sources, beam_size=4, num_hypotheses=4, max_length_b=5)
    scores = np.asarray(result.scores)
    assert scores.shape == (3, 4) and np.all(np.diff(scores, axis=1) <= 0)
    for row in range(3):
        assert len({tuple(t) for t in np.asarray(result.tokens[row])}) == 4
    best = beam_search(model, sources, beam_size=4, max_length_b=5)
    np.testing.assert_array_equal(result.tokens[:, 0], best.tokens)
    np.testing.assert_allclose(result.scores[:, 0], best.scores, **SCORE_TOLERANCE)
    two = beam_search(model, sources, beam_size=4, num_hypotheses=2, max_length_b=5)
    np.testing.assert_array_equal(two.tokens, result.tokens[:, :2])
    np.testing.assert_allclose(two.scores, result.scores[:, :2], **SCORE_TOLERANCE)
    with pytest.raises(ValueError, match="1 to beam_size \\(4\\) hypotheses a sentence; got num_hypotheses 5"):
        beam_search(model, sources, beam_size=4, num_hypotheses=5)


def _log_prob(model, source, hypothesis):
    """log P(hypothesis | source) by one full forward pass (padding never generated)."""
    logits = np.asarray(_forward(model)(source[None], np.array([[BOS_ID, *hypothesis[:-1]]], "int32")))[0]
    log_probs = np.asarray(tf.nn.log_softmax(logits[:, 1:]))  # over every token but padding (id 0)
    return sum(log_probs[i, t - 1] for i, t in enumerate(hypothesis))


@pytest.mark.parametrize("vocab, beam_size, max_length", [(6, 48, 3), (8, 8, 3)])
def test_a_target_prefix_starts_the_output_and_a_wide_beam_finds_the_exhaustive_best_after_it(vocab, beam_size, max_length, rng):
    model = _model(vocab, seed=12)
    sources = _sources(rng, [4, 2, 3], vocab)
    prefixes = np.array([[4, 5], [5, 0], [0, 0]], "int32")  # padded with 0; the last sentence has none
    for alpha in (0.0, 0.6):
        result = beam_search(model, sources, beam_size=beam_size, alpha=alpha, max_length=max_length, target_prefix=prefixes)
        for row, source in enumerate(sources):
            prefix = [t for t in prefixes[row] if t != PAD_ID]
            score, output = next(pair for pair in _exhaustive(model, source, max_length, alpha) if pair[1][: len(prefix)] == prefix)
            tokens = np.asarray(result.tokens[row])
            assert list(tokens[tokens != PAD_ID]) == output, (alpha, row)
            # The forced tokens count as the model's log-probabilities.
            np.testing.assert_allclose(result.scores[row], score, rtol=1e-4)


def test_greedy_search_continues_a_target_prefix_by_the_most_likely_tokens(rng):
    model = _model(30, seed=13)
    sources = _sources(rng, [5, 3, 6, 2], 30)
    prefixes = np.array([[7, 8, 9], [0, 0, 0], [11, 0, 0], [12, 13, 0]], "int32")
    extra = 3
    result = greedy_search(model, sources, max_length_b=extra, alpha=0.6, target_prefix=prefixes)
    for row, source in enumerate(sources):
        source = source[source != PAD_ID]
        hypothesis = [int(t) for t in prefixes[row] if t != PAD_ID]
        while len(hypothesis) < len(source) + extra and EOS_ID not in hypothesis:
            logits = np.asarray(_forward(model)(source[None], np.array([[BOS_ID, *hypothesis]], "int32")))[0, -1]
            hypothesis.append(1 + int(np.argmax(logits[1:])))  # never padding (id 0)
        output = [t for t in hypothesis if t != EOS_ID]
        tokens = np.asarray(result.tokens[row])
        assert list(tokens[tokens != PAD_ID]) == output
        expected = _log_prob(model, source, hypothesis) / _length_penalty(len(hypothesis), 0.6)
        np.testing.assert_allclose(result.scores[row], expected, **SCORE_TOLERANCE)


@pytest.mark.slow  # XLA
@pytest.mark.parametrize("search", [greedy_search, functools.partial(beam_search, beam_size=3)], ids=["greedy", "beam"])
def test_an_empty_target_prefix_changes_nothing_and_xla_forces_as_the_graph_does(search, rng):
    model = _model(40, seed=14)
    sources = _sources(rng, [5, 2, 7], 40)
    plain = search(model, sources, max_length_b=4)
    for empty in (np.zeros((3, 0), "int32"), np.zeros((3, 2), "int32")):
        result = search(model, sources, max_length_b=4, target_prefix=empty)
        np.testing.assert_array_equal(result.tokens, plain.tokens)
        np.testing.assert_allclose(result.scores, plain.scores, **SCORE_TOLERANCE)
    prefixes = np.array([[9, 10, 11, 12], [0, 0, 0, 0], [13, 14, 0, 0]], "int32")
    graph = tf.function(lambda s, p: search(model, s, max_length_b=4, target_prefix=p))(sources, prefixes)
    assert np.all(np.asarray(graph.tokens)[[0, 2], :2] == prefixes[[0, 2], :2])
    xla = tf.function(lambda s, p: search(model, s, max_length_b=4, target_prefix=p,
                                          execution=Execution.choose(compiled=True)), jit_compile=True)(sources, prefixes)  # fmt: skip
    np.testing.assert_array_equal(xla.tokens, graph.tokens)
    np.testing.assert_allclose(xla.scores, graph.scores, **SCORE_TOLERANCE)


class _FixedLogits:
    """A `DecodingModel` whose next-token logits are `logits` `[vocab]` at every step, whatever
    the source and output: a next-token distribution known exactly."""

    def __init__(self, logits):
        self.logits = tf.constant(logits, tf.float32)
        self.config = TransformerConfig.tiny(len(logits), num_layers=1, d_model=8, num_heads=1, d_ff=8)

    def encode(self, source_ids, training=None):
        return tf.zeros(tf.shape(source_ids)), source_ids != PAD_ID

    def init_cache(self, encoder_output, source_mask, hypotheses=1, max_length=None, shared_slots=True):
        return tf.zeros([tf.shape(encoder_output)[0] * hypotheses, 1])

    def decode_step(self, token_ids, index, cache):
        return tf.tile(self.logits[None], [tf.shape(token_ids)[0], 1]), cache

    def reorder_cache(self, cache, parents, sentences=None):
        return cache if sentences is None else tf.gather(cache, sentences)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.5, 4, 1.0), (1.0, 0, 0.8), (0.8, 5, 0.9)])
def test_sampled_tokens_follow_the_models_distribution_reshaped_by_temperature_top_k_and_top_p(temperature, top_k, top_p):
    import scipy.stats

    from keras_transformer.search import sample_search

    # Token 0 is padding (never drawn), 1-2 unlikely, 3 the end of sentence.
    logits = np.array([-1e9, -3.0, -2.5, 0.5, 1.0, 0.2, -0.4, 1.3, 0.9, -1.0], "float32")
    draws = 6000
    result = sample_search(_FixedLogits(logits), np.full((draws // 2, 1), 5, "int32"), np.arange(draws // 2),
                           num_samples=2, temperature=temperature, top_k=top_k, top_p=top_p, max_length=2)  # fmt: skip
    tokens = np.asarray(result.tokens).reshape(draws, 2)  # an end of sentence is stripped to 0
    first = np.where(tokens[:, 0] == PAD_ID, EOS_ID, tokens[:, 0])
    # The second token of the outputs that did not end at the first: drawn from the same
    # distribution, with random numbers of its own (one counter per position).
    second = np.where(tokens[:, 1] == PAD_ID, EOS_ID, tokens[:, 1])[first != EOS_ID]
    # The reference: the distribution from its definition, in NumPy.
    probs = np.exp((logits.astype("float64") - np.max(logits)) / temperature)
    order = np.argsort(-probs, kind="stable")
    if top_k:
        probs[order[top_k:]] = 0
    probs /= probs.sum()
    outside = np.cumsum(probs[order]) - probs[order] >= top_p
    probs[order[outside]] = 0
    probs /= probs.sum()
    drawn = probs > 0
    for position, tokens_there in (("first", first), ("second", second)):
        counts = np.bincount(tokens_there, minlength=len(logits))
        assert not np.any(counts[probs == 0]), f"a token outside top k / top p was drawn ({position})"
        statistic, p_value = scipy.stats.chisquare(counts[drawn], probs[drawn] * len(tokens_there))
        assert p_value > 1e-3, (position, statistic, counts, probs * len(tokens_there))
    # A score is the model's own log-probability of the output (over lp(1) = 1 for one token).
    model_log_probs = logits - np.log(np.sum(np.exp(logits)))
    ended = first == EOS_ID
    np.testing.assert_allclose(np.asarray(result.scores).reshape(-1)[ended], model_log_probs[first[ended]], rtol=1e-5)


def test_per_sentence_sampling_options_in_one_batch_equal_each_sentence_sampled_alone(rng):
    from keras_transformer.search import sample_search

    model = _model(30, seed=15)
    sources = _sources(rng, [5, 3, 6, 2], 30)
    options = dict(temperature=[0.7, 1.5, 1.0, 2.0], top_k=[0, 5, 3, 0], top_p=[1.0, 0.9, 1.0, 0.8])
    seeds = np.array([4, 5, 6, 7], "int32")
    batch = sample_search(model, sources, seeds, num_samples=3, max_length_b=4,
                          **{name: np.array(values, "float32" if name != "top_k" else "int32") for name, values in options.items()})  # fmt: skip
    for row in range(len(sources)):
        alone = sample_search(model, sources[row : row + 1], seeds[row : row + 1], num_samples=3, max_length_b=4,
                              **{name: values[row] for name, values in options.items()})  # fmt: skip
        length = alone.tokens.shape[2]
        np.testing.assert_array_equal(np.asarray(batch.tokens)[row, :, :length], alone.tokens[0], err_msg=str(row))
        assert not np.any(np.asarray(batch.tokens)[row, :, length:])
        np.testing.assert_allclose(np.asarray(batch.scores)[row], alone.scores[0], **SCORE_TOLERANCE, err_msg=str(row))


@pytest.mark.slow
def test_sampling_with_top_k_1_is_greedy_and_a_seed_gives_the_same_samples_in_any_batch(rng):
    from keras_transformer.search import SamplingSettings, sample_search

    model = _model(30, seed=15)
    sources = _sources(rng, [5, 3, 6, 2], 30)
    greedy = greedy_search(model, sources, max_length_b=4)
    top_1 = sample_search(model, sources, 7, num_samples=2, top_k=1, max_length_b=4)
    for sample in range(2):
        np.testing.assert_array_equal(top_1.tokens[:, sample], greedy.tokens)
        np.testing.assert_allclose(top_1.scores[:, sample], greedy.scores, **SCORE_TOLERANCE)
    seeds = np.array([1, 2, 3, 4], "int32")
    sampled = sample_search(model, sources, seeds, num_samples=3, temperature=2.0, max_length_b=4)
    again = tf.function(lambda s: sample_search(model, s, seeds, num_samples=3, temperature=2.0, max_length_b=4))(sources)
    np.testing.assert_array_equal(again.tokens, sampled.tokens)
    assert len({tuple(np.asarray(t)) for t in np.asarray(sampled.tokens).reshape(12, -1)}) > 6, "samples barely differ"
    # A sentence's samples are a function of its seed: alone, or beside other sentences.
    alone = sample_search(model, sources[2:3, :6], seeds[2:3], num_samples=3, temperature=2.0, max_length_b=4)
    np.testing.assert_array_equal(alone.tokens[0], np.asarray(sampled.tokens)[2, :, : alone.tokens.shape[2]])
    other = sample_search(model, sources, seeds + 10, num_samples=3, temperature=2.0, max_length_b=4)
    assert np.any(np.asarray(other.tokens) != np.asarray(sampled.tokens))
    prefixed = sample_search(model, sources, seeds, num_samples=3, temperature=2.0, max_length_b=4,
                             target_prefix=np.array([[5, 6], [7, 0], [0, 0], [8, 9]], "int32"))  # fmt: skip
    starts = np.asarray(prefixed.tokens)[:, :, :2]
    assert np.all(starts[[0, 3]] == np.array([[5, 6], [8, 9]])[:, None]) and np.all(starts[1, :, 0] == 7)
    for bad, valid in ((dict(temperature=-1.0), "> 0 and finite"), (dict(temperature=float("inf")), "> 0 and finite"),
                       (dict(temperature=float("nan")), "> 0 and finite"), (dict(top_k=-1), ">= 0"),
                       (dict(top_p=1.5), "in (0, 1]"), (dict(top_p=0.0), "in (0, 1]")):  # fmt: skip
        ((name, value),) = bad.items()
        with pytest.raises(ValueError, match=re.escape(f"{name} must be {valid}") + f".*got {value}"):
            SamplingSettings(**bad)


def test_decode_takes_its_defaults_from_the_paper_and_picks_the_search_by_beam_size(rng):
    from keras_transformer.search import DecodingSettings, decode

    assert DecodingSettings() == DecodingSettings(beam_size=4, alpha=0.6, max_length_b=50, stopping="exact")
    model = _model(30, seed=6)
    sources = _sources(rng, [5, 2], 30)
    for settings, expected in (
        (DecodingSettings(beam_size=1, max_length_b=4), greedy_search(model, sources, max_length_b=4)),
        (DecodingSettings(beam_size=3, alpha=1.0, max_length_b=4),
         beam_search(model, sources, beam_size=3, alpha=1.0, max_length_b=4)),
        (DecodingSettings(beam_size=3, max_length_b=4, stopping="first_k"),
         beam_search(model, sources, beam_size=3, max_length_b=4, stopping="first_k")),
        (DecodingSettings(beam_size=3, max_length_b=4, num_hypotheses=2),
         beam_search(model, sources, beam_size=3, max_length_b=4, num_hypotheses=2)),
        (DecodingSettings(beam_size=1, max_length_b=4, num_hypotheses=1),  # greedy's output as a 1-best list
         SearchResult(*(t[:, None] for t in greedy_search(model, sources, max_length_b=4)))),
    ):  # fmt: skip
        result = decode(model, sources, settings)
        np.testing.assert_array_equal(result.tokens, expected.tokens)
        np.testing.assert_allclose(result.scores, expected.scores, rtol=1e-6)
    for name, bad in (("beam_size", 0), ("max_length_b", -1), ("alpha", -0.5), ("alpha", float("nan")),
                      ("repetition_penalty", 0.0), ("min_length", np.array([2, -1]))):  # fmt: skip
        with pytest.raises(ValueError, match=f"Decoding option {name} must be"):
            DecodingSettings(**{name: bad})
    with pytest.raises(ValueError, match="stopping is one of exact, first_k; got 'never'"):
        DecodingSettings(stopping="never")
    with pytest.raises(ValueError, match="1 to beam_size \\(4\\) hypotheses a sentence; got num_hypotheses 5"):
        DecodingSettings(num_hypotheses=5)


def test_take_per_row_equals_numpys_take_along_axis(rng):
    for shape in ((5, 7), (5, 7, 3)):
        values = rng.normal(size=shape).astype("float32")
        indices = rng.integers(0, 7, size=(5, 4)).astype("int32")
        expected = np.take_along_axis(values, indices.reshape(5, 4, *[1] * (len(shape) - 2)), axis=1)
        np.testing.assert_array_equal(take_per_row(values, indices), expected)


def _row_agreement(first, second):
    """The share of rows whose tokens are all equal."""
    return float(np.mean(np.all(np.asarray(first) == np.asarray(second), axis=-1)))


def _reversal_is_learned(model, sources):
    """The trained fixture reverses most sources: its outputs are worth comparing."""
    from keras_transformer.search import DecodingSettings, decode

    tokens = np.asarray(decode(model, sources, DecodingSettings(beam_size=1, max_length_b=4)).tokens)
    expected = np.zeros_like(tokens)
    for row, source in enumerate(sources):
        body = source[(source != PAD_ID) & (source != EOS_ID)][::-1]
        expected[row, : len(body)] = body
    assert _row_agreement(tokens, expected) >= 0.9


@pytest.mark.slow  # a trained model: the suite's artifacts
def test_decoding_under_mixed_bfloat16_gives_float32s_tokens_on_most_sentences(reversal_model):
    from keras_transformer.search import DecodingSettings, decode

    model, weights, sources = reversal_model
    _reversal_is_learned(model, sources)
    float32 = {beam: decode(model, sources, DecodingSettings(beam, max_length_b=4)) for beam in (1, 4)}
    keras.mixed_precision.set_global_policy("mixed_bfloat16")  # what --mixed-precision sets on CPUs and TPUs
    mixed = Transformer(model.config)
    mixed.load_weights(weights)
    assert mixed.decoder.layers[0].compute_dtype == "bfloat16"
    for beam in (1, 4):
        graph = tf.function(lambda s: decode(mixed, s, DecodingSettings(beam, max_length_b=4)))
        eager = decode(mixed, sources, DecodingSettings(beam, max_length_b=4))
        for name, result in (("graph", graph(sources)), ("eager", eager)):
            assert result.scores.dtype == "float32"
            # bfloat16 keeps 8 bits of mantissa: a token may flip where two are close, not more.
            assert _row_agreement(result.tokens, float32[beam].tokens) >= 0.9, (beam, name)
            same = np.all(np.asarray(result.tokens) == np.asarray(float32[beam].tokens), axis=-1)
            np.testing.assert_allclose(np.asarray(result.scores)[same], np.asarray(float32[beam].scores)[same], atol=0.05)


@pytest.mark.slow
def test_jax_decodes_as_tensorflow_does(reversal_model, artifacts):
    """Greedy and beam 4, each also with a target prefix and with per-sentence options, and
    sampling, also with options, and scoring given targets, compiled for each backend
    as `training.evaluate` compiles them (TensorFlow: XLA; JAX: jax.jit), on the same weights and
    sources: the same tokens (the random numbers too). JAX's searches ran once, in a process of
    their own (tests/artifacts.py: tests/backend_worker.py decode)."""
    import json

    from backend_worker import PREFIX, SAMPLING, processed_options, scored
    from keras_transformer.search import DecodingSettings, decode, sample_search
    from training.evaluate import compile_for_backend, compile_search

    model, _, sources = reversal_model
    under_jax = json.loads(artifacts.output("jax-decode").splitlines()[-1])
    prefix = np.stack([PREFIX[row % len(PREFIX)] for row in range(len(sources))])
    under_tensorflow = {}
    for beam in (1, 4):
        settings = DecodingSettings(beam, max_length_b=4)
        under_tensorflow[str(beam)] = compile_search(model, settings)(sources)
        under_tensorflow[f"{beam} prefix"] = compile_for_backend(
            model, lambda ids, p, execution, settings=settings: decode(model, ids, settings, execution, target_prefix=p))(sources, prefix)
    under_tensorflow["sample"] = compile_for_backend(
        model, lambda ids, execution: sample_search(model, ids, np.arange(len(sources)), execution=execution, **SAMPLING))(sources)
    for width in (1, 4):
        settings = DecodingSettings(max_length_b=4, **processed_options(len(sources), width))
        under_tensorflow[f"{width} options"] = compile_search(model, settings)(sources)
    options = {name: value for name, value in processed_options(len(sources), 1).items() if name != "beam_size"}
    under_tensorflow["sample options"] = compile_for_backend(model, lambda ids, execution: sample_search(
        model, ids, np.arange(len(sources)), execution=execution, **SAMPLING, **options))(sources)  # fmt: skip
    under_tensorflow["score"] = compile_for_backend(model, lambda *arrays: scored(model, *arrays))(sources, sources)
    assert sorted(under_jax) == sorted(under_tensorflow)
    for name, (tokens, scores) in under_tensorflow.items():
        jax_tokens, jax_scores = under_jax[name]
        np.testing.assert_array_equal(jax_tokens, tokens, err_msg=name)
        np.testing.assert_allclose(jax_scores, scores, rtol=1e-4, atol=1e-5, err_msg=name)
    tokens = np.asarray(under_tensorflow["4"].tokens)
    assert len(set(_nonzero_lengths(tokens))) > 2  # outputs of several lengths
    assert np.all(np.asarray(under_tensorflow["4 prefix"].tokens)[::3, :2] == [5, 6])
    for plain in ("1", "4", "sample"):
        assert not np.array_equal(under_tensorflow[f"{plain} options"].tokens, under_tensorflow[plain].tokens), plain


@pytest.mark.slow  # a trained model: the suite's artifacts
def test_alignments_are_the_models_attention_over_the_real_source_for_each_output_piece(reversal_model):
    from keras_transformer.search import DecodingSettings, alignments, decode

    model, _, sources = reversal_model
    _reversal_is_learned(model, sources)
    tokens = np.asarray(decode(model, sources, DecodingSettings(max_length_b=4)).tokens)
    out_lengths, source_lengths = _nonzero_lengths(tokens), _nonzero_lengths(sources)
    assert len(set(out_lengths)) > 1 and len(set(source_lengths)) > 1
    for layer in (0, -1):
        attention = np.asarray(alignments(model, sources, tokens, layer))
        assert attention.shape == (len(sources), tokens.shape[1], sources.shape[1])
        for row in range(0, len(sources), 5):
            out, source = tokens[row, : out_lengths[row]], sources[row, : source_lengths[row]]
            np.testing.assert_allclose(attention[row, : len(out)].sum(axis=-1), 1.0, atol=1e-5)
            assert not np.any(attention[row, len(out) :]) and not np.any(attention[row, :, len(source) :])
            # The sentence alone, unpadded: what the decoder layer read while producing each piece.
            inputs = np.array([[BOS_ID, *out[:-1]]], "int32")
            alone = np.asarray(model.cross_attention_weights(source[None], inputs)[layer])[0].mean(axis=0)
            np.testing.assert_allclose(attention[row, : len(out), : len(source)], alone, atol=1e-5)
    with pytest.raises(ValueError, match="alignment_layer 2: the decoder has 2 layers"):
        alignments(model, sources, tokens, layer=2)
