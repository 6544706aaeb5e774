"""keras_transformer.search.score against a full teacher-forced forward pass, and against the
score a search gave its own outputs."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import SCORE_TOLERANCE
from search_helpers import _length_penalty, _model, _sources

from keras_transformer import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.search import DecodingSettings, decode, score

VOCAB = 11


def _reference(model, source_ids, target_ids):
    """Each real target token's log-probability from one call of the model on the whole target:
    log-softmax in float64 over the vocabulary without padding, which is never generated."""
    inputs = np.concatenate([np.full((len(target_ids), 1), BOS_ID), target_ids[:, :-1]], axis=1)
    logits = np.asarray(model((source_ids, inputs)), "float64")
    logits[..., PAD_ID] = -np.inf
    log_probs = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1, keepdims=True)) - logits.max(-1, keepdims=True)
    chosen = np.take_along_axis(log_probs, target_ids[..., None], axis=-1)[..., 0]
    return np.where(target_ids != PAD_ID, chosen, 0.0)


@pytest.mark.parametrize("rows_at_once", [3, 64])  # several blocks, the last part padding; one block
@pytest.mark.parametrize("graph", [False, True])
def test_score_is_a_full_forward_pass(rows_at_once, graph):
    model = _model(VOCAB)
    rng = np.random.default_rng(0)
    source_ids = _sources(rng, [5, 2, 7, 4], VOCAB)
    lengths = [3, 6, 1, 4]  # the end of sentence included
    target_ids = _sources(rng, lengths, VOCAB)
    target_ids[np.arange(4), np.array(lengths) - 1] = EOS_ID
    alpha = np.array([0.6, 0.0, 1.0, 0.6], "float32")
    scoring = tf.function(score, reduce_retracing=True) if graph else score
    result = scoring(model, source_ids, target_ids, alpha, rows_at_once=rows_at_once)
    expected = _reference(model, source_ids, target_ids)
    np.testing.assert_allclose(result.token_log_probs, expected, **SCORE_TOLERANCE)
    np.testing.assert_array_equal(result.length, lengths)
    np.testing.assert_allclose(result.log_prob, expected.sum(-1), **SCORE_TOLERANCE)
    penalties = [_length_penalty(length, a) for length, a in zip(lengths, alpha.tolist())]  # GNMT's, written out
    np.testing.assert_allclose(result.score, expected.sum(-1) / penalties, **SCORE_TOLERANCE)


def test_score_of_no_sentences_is_empty():  # a parallel slice of a served request may be (graphs only)
    result = tf.function(score)(_model(VOCAB), np.zeros((0, 3), "int32"), np.zeros((0, 2), "int32"))
    assert [tuple(value.shape) for value in result] == [(0,), (0,), (0, 2), (0,)]


@pytest.mark.slow  # a trained model: the suite's artifacts
@pytest.mark.parametrize("beam_size", [1, 4])
def test_score_of_a_searchs_output_is_the_searchs_own_score(reversal_model, beam_size):
    model, _, sources = reversal_model
    result = decode(model, sources, DecodingSettings(beam_size, max_length_b=4))
    tokens = np.asarray(result.tokens)
    lengths = np.sum(tokens != PAD_ID, axis=1)
    targets = np.zeros((len(tokens), tokens.shape[1] + 1), "int32")
    targets[:, : tokens.shape[1]] = tokens
    targets[np.arange(len(tokens)), lengths] = EOS_ID  # the search's outputs are cut before it
    scored = score(model, sources, targets)
    assert len(set(lengths)) > 2  # outputs of several lengths in one batch
    np.testing.assert_allclose(scored.score, result.scores, rtol=1e-4, atol=1e-5)
