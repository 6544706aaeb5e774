import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import BOS_ID, EOS_ID, PAD_ID, Transformer, TransformerConfig
from keras_transformer import search as search_module
from keras_transformer.common import take_per_row
from keras_transformer.search import beam_search, greedy_search, length_penalty


def _model(vocab_size, seed=3, **overrides):
    keras.utils.set_random_seed(seed)
    values = dict(num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout=0.0)
    return Transformer(TransformerConfig.tiny(vocab_size, **{**values, **overrides}))


def _sources(rng, lengths, vocab_size):
    ids = np.zeros((len(lengths), max(lengths)), "int32")
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(4, vocab_size, size=length)
    return ids


class _EosLogit:
    """Wraps a model and adds `adjust(index, source_length, slot)` to the EOS logit at each step.

    A row is known by its sentence's source length and its place among the sentence's
    hypotheses (float `[rows]` each), not by its row number, which changes when beam search
    stops decoding sentences that are done."""

    def __init__(self, model, adjust):
        self.model, self.config, self.adjust = model, model.config, adjust
        self.encode, self.init_cache, self.reorder_cache = model.encode, model.init_cache, model.reorder_cache

    def decode_step(self, token_ids, index, cache, source_mask):
        logits, cache = self.model.decode_step(token_ids, index, cache, source_mask)
        per_sentence = tf.shape(token_ids)[0] // tf.maximum(tf.shape(source_mask)[0], 1)
        source_length = tf.repeat(tf.reduce_sum(tf.cast(source_mask[:, 0], tf.float32), axis=1), per_sentence)
        slot = tf.cast(tf.range(tf.shape(token_ids)[0]) % per_sentence, tf.float32)
        adjust = tf.cast(self.adjust(index, source_length, slot), tf.float32) + tf.zeros_like(source_length)
        return logits + tf.one_hot(EOS_ID, logits.shape[-1]) * adjust[:, None], cache


def _never_ends(model):
    return _EosLogit(model, lambda index, source_length, slot: -1e4)


def _ends_at(model, length):
    return _EosLogit(model, lambda index, source_length, slot: tf.where(index + 1 == length, 1e4, -1e4))


def _nonzero_lengths(tokens):
    return np.sum(np.asarray(tokens) != PAD_ID, axis=-1)


def test_beam_size_one_is_greedy(rng):
    # EOS wins or loses by far, on a pseudo-random pattern of sentence and step: hypotheses end
    # at various steps, whatever the random model prefers.
    def eos_logit(index, source_length, slot):
        return tf.where(tf.sin(7.0 * source_length + 3.0 * tf.cast(index, tf.float32)) > 0.6, 30.0, -30.0)

    model = _EosLogit(_model(30, seed=4), eos_logit)
    sources = _sources(rng, [5, 3, 6, 1, 8, 4], 30)
    greedy = greedy_search(model, sources, max_extra_length=6)
    beam = beam_search(model, sources, beam_size=1, max_extra_length=6)
    np.testing.assert_array_equal(beam.tokens, greedy.tokens)
    np.testing.assert_allclose(beam.scores, greedy.scores, rtol=1e-6)
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
    logits = model((np.repeat(source[None], len(hypotheses), axis=0), target_inputs))
    log_probs = np.asarray(tf.nn.log_softmax(logits[..., 1:]))  # over every token but padding (id 0)
    log_probs = np.concatenate([np.full(log_probs.shape[:-1] + (1,), -np.inf), log_probs], axis=-1)
    scored = []
    for row, hypothesis in enumerate(hypotheses):
        log_prob = sum(log_probs[row, i, t] for i, t in enumerate(hypothesis))
        output = [t for t in hypothesis if t != EOS_ID]
        scored.append((log_prob / float(length_penalty(len(hypothesis), alpha)), output))
    return sorted(scored, key=lambda pair: -pair[0])


# Beams wide enough to keep every prefix: wider than the vocabulary, and as wide.
@pytest.mark.parametrize("vocab, beam_size, max_length", [(6, 48, 3), (8, 8, 2)])
def test_wide_beam_finds_the_exhaustive_best(vocab, beam_size, max_length, rng):
    model = _model(vocab, seed=11)
    sources = _sources(rng, [4, 2], vocab)
    for alpha in (0.0, 0.6, 1.0):
        result = beam_search(model, sources, beam_size=beam_size, alpha=alpha, max_length=max_length, return_all=True)
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
@pytest.mark.parametrize("by_argmax", [False, True])
def test_top_k_in_chunks_equals_a_full_sort(vocab, k, by_argmax, rng):
    values = rng.normal(size=(5, vocab)).astype("float32")
    top_k = search_module._top_k_by_argmax if by_argmax else keras.ops.top_k
    best, index = search_module._top_k(keras.ops.convert_to_tensor(values), k, top_k)
    expected = np.argsort(-values, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(index, expected)
    np.testing.assert_array_equal(best, np.take_along_axis(values, expected, axis=1))


def test_top_k_by_argmax_puts_equal_values_in_index_order_as_top_k():
    values = keras.ops.convert_to_tensor([[1.0, 3.0, 3.0, -2.0, 3.0, 0.0], [-1e9, -1e9, -1e9, -1e9, 5.0, -1e9]])
    best, index = search_module._top_k_by_argmax(values, 4)
    expected_best, expected_index = keras.ops.top_k(values, 4)
    np.testing.assert_array_equal(index, [[1, 2, 4, 0], [4, 0, 1, 2]])
    np.testing.assert_array_equal(index, expected_index)
    np.testing.assert_array_equal(best, expected_best)


@pytest.mark.parametrize("static_shapes", [False, True])  # the chunks' top k: TensorFlow's, argmax passes
def test_beam_search_over_a_vocabulary_in_chunks_equals_it_with_a_plain_top_k(static_shapes, rng, monkeypatch):
    model = _model(512, seed=8)  # 512 tokens split into chunks: each hypothesis's best 4 from the best 4 chunks
    sources = _sources(rng, [5, 2, 7], 512)
    chunked = beam_search(model, sources, max_extra_length=5, return_all=True, static_shapes=static_shapes)
    monkeypatch.setattr(search_module, "_top_k", lambda values, k, _: keras.ops.top_k(values, k))
    plain = beam_search(model, sources, max_extra_length=5, return_all=True, static_shapes=static_shapes)
    np.testing.assert_array_equal(chunked.tokens, plain.tokens)
    np.testing.assert_allclose(chunked.scores, plain.scores, rtol=1e-6)


def test_the_best_hypothesis_is_final_when_the_search_stops_for_it(rng):
    """Without `return_all` a sentence stops once nothing alive can beat its best finished
    hypothesis, sooner than once nothing can beat its k-th: the best is the same."""
    def eos_logit(index, source_length, slot):  # hypotheses end at various steps
        return 4.0 * tf.sin(5.0 * source_length + 1.3 * slot + 2.0 * tf.cast(index, tf.float32))

    model = _EosLogit(_model(30, seed=12), eos_logit)
    sources = _sources(rng, [6, 2, 9, 4, 7], 30)
    for alpha in (0.0, 0.6):
        best = beam_search(model, sources, beam_size=3, alpha=alpha, max_extra_length=10)
        every = beam_search(model, sources, beam_size=3, alpha=alpha, max_extra_length=10, return_all=True)
        np.testing.assert_array_equal(best.tokens, every.tokens[:, 0])
        np.testing.assert_allclose(best.scores, every.scores[:, 0], rtol=1e-6)


def test_the_growing_cache_stops_decoding_the_sentences_that_are_done(rng):
    model = _model(30, seed=7)
    rows = []

    class Counting(_EosLogit):
        def decode_step(self, token_ids, index, cache, source_mask):
            rows.append(int(token_ids.shape[0]))
            return super().decode_step(token_ids, index, cache, source_mask)

    never_ends = Counting(model, lambda index, source_length, slot: -1e4)
    sources = _sources(rng, [2, 9], 30)  # length limits 3 and 10
    result = beam_search(never_ends, sources, beam_size=3, max_extra_length=1)  # eager: a Python loop
    assert rows == [6] * 3 + [3] * 7
    assert list(_nonzero_lengths(result.tokens)) == [3, 10]


def test_a_sentence_alone_equals_it_in_a_batch(rng):
    model = _model(30, seed=5)
    sources = _sources(rng, [7, 1, 4], 30)
    for search in (greedy_search, beam_search):
        batched = search(model, sources, max_extra_length=8)
        for row, length in enumerate(np.sum(sources > 0, axis=1)):
            alone = search(model, sources[row : row + 1, :length], max_extra_length=8)
            width = alone.tokens.shape[-1]
            np.testing.assert_array_equal(batched.tokens[row, :width], alone.tokens[0])
            assert not np.any(batched.tokens[row, width:])
            np.testing.assert_allclose(batched.scores[row], alone.scores[0], rtol=1e-5)


@pytest.mark.parametrize("search", [greedy_search, beam_search])
def test_xla_with_the_static_cache_equals_the_plain_graph_with_the_growing_one(search, rng):
    model = _model(30, seed=2)
    sources = _sources(rng, [6, 3, 8], 30)
    plain = tf.function(lambda s: search(model, s, max_extra_length=7))(sources)  # the growing cache
    compiled = tf.function(lambda s: search(model, s, max_extra_length=7, static_shapes=True), jit_compile=True)(sources)
    np.testing.assert_array_equal(compiled.tokens, plain.tokens)
    np.testing.assert_allclose(compiled.scores, plain.scores, rtol=1e-5)


@pytest.mark.parametrize("search", [greedy_search, beam_search])
def test_output_ends_at_eos(search, rng):
    forced = _ends_at(_model(20), 4)
    sources = _sources(rng, [5, 2, 9], 20)
    result = search(forced, sources, max_extra_length=10)
    tokens = np.asarray(result.tokens)
    np.testing.assert_array_equal(_nonzero_lengths(tokens), [3, 3, 3])
    assert not np.any(tokens == EOS_ID) and not np.any(tokens[:, 3:])
    # The score is normalised by the length including EOS.
    assert np.all(np.asarray(result.scores) < 0)


@pytest.mark.parametrize("search", [greedy_search, beam_search])
def test_a_model_that_never_ends_stops_at_the_length_limit(search, rng):
    forced = _never_ends(_model(20))
    sources = _sources(rng, [5, 2, 9], 20)
    result = search(forced, sources, max_extra_length=4)
    np.testing.assert_array_equal(_nonzero_lengths(result.tokens), [9, 6, 13])
    capped = search(forced, sources, max_extra_length=4, max_length=7)
    np.testing.assert_array_equal(_nonzero_lengths(capped.tokens), [7, 6, 7])


def test_n_best_is_sorted_and_distinct(rng):
    model = _model(30, seed=9)
    result = beam_search(model, _sources(rng, [6, 4], 30), beam_size=4, return_all=True, max_extra_length=5)
    scores = np.asarray(result.scores)
    assert scores.shape == (2, 4) and np.all(np.diff(scores, axis=1) <= 0)
    for row in range(2):
        assert len({tuple(t) for t in np.asarray(result.tokens[row])}) == 4


def test_decode_takes_its_defaults_from_the_paper_and_picks_the_search_by_beam_size(rng):
    from keras_transformer.search import DecodingSettings, decode

    assert DecodingSettings() == DecodingSettings(beam_size=4, alpha=0.6, max_extra_length=50)
    model = _model(30, seed=6)
    sources = _sources(rng, [5, 2], 30)
    for settings, expected in (
        (DecodingSettings(beam_size=1, max_extra_length=4), greedy_search(model, sources, max_extra_length=4)),
        (DecodingSettings(beam_size=3, alpha=1.0, max_extra_length=4),
         beam_search(model, sources, beam_size=3, alpha=1.0, max_extra_length=4)),
    ):  # fmt: skip
        result = decode(model, sources, settings)
        np.testing.assert_array_equal(result.tokens, expected.tokens)
        np.testing.assert_allclose(result.scores, expected.scores, rtol=1e-6)
    for bad in (dict(beam_size=0), dict(max_extra_length=-1), dict(alpha=-0.5)):
        with pytest.raises(ValueError, match="beam_size >= 1"):
            DecodingSettings(**bad)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_parallel_searches_give_what_one_search_gives(beam_size, rng):
    from keras_transformer.search import DecodingSettings, decode

    model = _model(30, seed=8)
    settings = DecodingSettings(beam_size=beam_size, max_extra_length=4)
    unknown_batch = [tf.TensorSpec([None, None], tf.int32)]
    one = tf.function(lambda ids: decode(model, ids, settings), input_signature=unknown_batch)
    graphs = {  # graphs that do not know the batch size (as served) and one that does (its slices' too)
        "2 searches": tf.function(lambda ids: decode(model, ids, settings, searches=2), input_signature=unknown_batch),
        "3 searches": tf.function(lambda ids: decode(model, ids, settings, searches=3), input_signature=unknown_batch),
        "2 searches, static batch": tf.function(lambda ids: decode(model, ids, settings, searches=2)),
    }
    for batch in (0, 1, 3):  # some of the searches get no sentence
        sources = _sources(rng, [6, 2, 5][:batch], 30) if batch else np.zeros((0, 6), "int32")
        expected = one(sources)
        for name, graph in graphs.items():
            result = graph(sources)
            assert result.tokens.shape == expected.tokens.shape, name
            np.testing.assert_array_equal(result.tokens, expected.tokens, err_msg=name)
            np.testing.assert_allclose(result.scores, expected.scores, rtol=1e-5, err_msg=name)


def test_take_per_row_equals_numpys_take_along_axis(rng):
    for shape in ((5, 7), (5, 7, 3)):
        values = rng.normal(size=shape).astype("float32")
        indices = rng.integers(0, 7, size=(5, 4)).astype("int32")
        expected = np.take_along_axis(values, indices.reshape(5, 4, *[1] * (len(shape) - 2)), axis=1)
        np.testing.assert_array_equal(take_per_row(values, indices), expected)
