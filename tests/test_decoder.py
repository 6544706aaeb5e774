import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import PAD_ID, Transformer, TransformerConfig
from keras_transformer.common import NEG_INF


# Marian's options (OPUS-MT's model), each other than the paper's, with a random logits bias.
MARIAN = dict(positional_encoding="sinusoidal_halves", activation="swish", layer_norm_epsilon=1e-5, logits_bias=True)


def _model_and_inputs(rng, **options):
    config = TransformerConfig.tiny(40, d_model=32, num_heads=4, d_ff=64, **options)
    model = Transformer(config)
    if config.logits_bias:
        model.embedding.bias.assign(rng.normal(size=40))
    source = rng.integers(1, 40, size=(3, 7)).astype("int32")
    source[1, 4:] = 0
    target = rng.integers(1, 40, size=(3, 6)).astype("int32")
    return model, source, target


def _incremental_logits(model, source, target, max_length=None):
    encoder_output, source_mask = model.encode(source)
    cache = model.init_cache(encoder_output, source_mask, max_length=max_length)
    steps = []
    for index in range(target.shape[1]):
        logits, cache = model.decode_step(target[:, index], index, cache)
        steps.append(logits)
    return np.stack(steps, axis=1)


def _without_padding(logits):
    """Decoding never generates padding: its logit is NEG_INF, the others are the model's."""
    np.testing.assert_array_equal(np.asarray(logits)[..., PAD_ID], NEG_INF)
    return np.delete(np.asarray(logits), PAD_ID, axis=-1)


def test_cached_steps_equal_the_full_forward_pass(rng):
    for options in (dict(positional_encoding="sinusoidal"), dict(positional_encoding="learned"), MARIAN):
        model, source, target = _model_and_inputs(rng, **options)
        full = np.delete(model((source, target)), PAD_ID, axis=-1)
        for max_length in (None, 10):  # a growing cache, and a static one longer than needed
            incremental = _incremental_logits(model, source, target, max_length)
            np.testing.assert_allclose(_without_padding(incremental), full, atol=1e-5)


# Both caches, with a sentence's hypotheses in slots of one row or in rows of their own.
CACHES = [(None, True), (None, False), (5, True), (5, False)]


@pytest.mark.parametrize("max_length, shared_slots", CACHES)
def test_hypotheses_of_a_sentence_equal_the_sentence_repeated(max_length, shared_slots, rng):
    """Three hypotheses per sentence equal the full forward pass over the sentence repeated
    three times; with shared slots, from one projection of each sentence's encoder output."""
    model, source, _ = _model_and_inputs(rng)
    target = rng.integers(1, 40, size=(9, 5)).astype("int32")
    full = model((np.repeat(source, 3, axis=0), target))
    encoder_output, source_mask = model.encode(source)
    cache = model.init_cache(encoder_output, source_mask, hypotheses=3, max_length=max_length, shared_slots=shared_slots)
    for index in range(5):
        logits, cache = model.decode_step(target[:, index], index, cache)
        np.testing.assert_allclose(_without_padding(logits), np.delete(full[:, index], PAD_ID, axis=-1), atol=1e-5)
    rows = 3 if shared_slots else 9
    assert all(layer.cross_key.shape[0] == rows and layer.self_key.shape[:2] == (rows, 4) for layer in cache.decoder.layers)


@pytest.mark.parametrize("max_length, shared_slots", CACHES)
def test_reordered_hypotheses_attend_to_their_own_past(max_length, shared_slots, rng):
    """Beam search keeps, each step, extensions of any hypotheses of a sentence (some twice,
    some not at all) and may stop decoding a sentence: the logits of each kept hypothesis still
    equal the full forward pass over its own prefix."""
    model, source, _ = _model_and_inputs(rng)
    k = 3
    encoder_output, source_mask = model.encode(source)
    cache = model.init_cache(encoder_output, source_mask, hypotheses=k, max_length=max_length, shared_slots=shared_slots)
    sentences = np.arange(3)
    prefixes = np.full((3, k, 1), 1, "int32")  # per sentence and hypothesis: BOS, then tokens
    for index in range(5):
        logits, cache = model.decode_step(prefixes[:, :, -1].reshape(-1), index, cache)
        full = model((np.repeat(source[sentences], k, axis=0), prefixes.reshape(len(sentences) * k, -1)))
        np.testing.assert_allclose(_without_padding(logits), np.delete(full[:, -1], PAD_ID, axis=-1), atol=1e-5)
        parents = rng.integers(0, k, size=(len(sentences), k)).astype("int32")
        tokens = rng.integers(1, 40, size=(len(sentences), k, 1)).astype("int32")
        prefixes = np.concatenate([np.take_along_axis(prefixes, parents[:, :, None], axis=1), tokens], axis=2)
        if index == 2:  # the middle sentence ends
            kept = np.array([0, 2], "int32")
            cache = model.reorder_cache(cache, parents[kept], kept)
            sentences, prefixes = sentences[kept], prefixes[kept]
        else:
            cache = model.reorder_cache(cache, parents)


def test_the_growing_cache_holds_the_decoded_positions_only(rng):
    model, source, target = _model_and_inputs(rng)
    encoder_output, source_mask = model.encode(source)
    cache = model.init_cache(encoder_output, source_mask)
    for index in range(3):
        _, cache = model.decode_step(target[:, index], index, cache)
    assert all(tuple(layer.self_key.shape) == (3, 4, 3, 8) for layer in cache.decoder.layers)


@pytest.mark.parametrize("options", [{}, MARIAN], ids=["paper", "marian"])
def test_cached_step_compiles_with_xla_with_fixed_shapes(options, rng):
    model, source, target = _model_and_inputs(rng, **options)
    encoder_output, source_mask = model.encode(source)
    step = tf.function(model.decode_step, jit_compile=True)
    cache = model.init_cache(encoder_output, source_mask, max_length=6)
    shapes = [tuple(t.shape) for t in tf.nest.flatten(cache) if t is not None]
    for index in range(6):
        logits, cache = step(target[:, index], tf.constant(index), cache)
        assert [tuple(t.shape) for t in tf.nest.flatten(cache) if t is not None] == shapes
    np.testing.assert_allclose(_without_padding(logits), np.delete(model((source, target))[:, -1], PAD_ID, axis=-1), atol=1e-5)
    assert step.experimental_get_tracing_count() == 1
