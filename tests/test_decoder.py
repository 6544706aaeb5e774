import numpy as np
import tensorflow as tf

from keras_transformer import PAD_ID, Transformer, TransformerConfig
from keras_transformer.common import NEG_INF


def _model_and_inputs(rng, positional_encoding="sinusoidal"):
    config = TransformerConfig.tiny(40, d_model=32, num_heads=4, d_ff=64, positional_encoding=positional_encoding)
    model = Transformer(config)
    source = rng.integers(1, 40, size=(3, 7)).astype("int32")
    source[1, 4:] = 0
    target = rng.integers(1, 40, size=(3, 6)).astype("int32")
    return model, source, target


def _incremental_logits(model, source, target, max_length=None):
    encoder_output, source_mask = model.encode(source)
    cache = model.init_cache(encoder_output, max_length=max_length)
    steps = []
    for index in range(target.shape[1]):
        logits, cache = model.decode_step(target[:, index], index, cache, source_mask)
        steps.append(logits)
    return np.stack(steps, axis=1)


def _without_padding(logits):
    """Decoding never generates padding: its logit is NEG_INF, the others are the model's."""
    np.testing.assert_array_equal(np.asarray(logits)[..., PAD_ID], NEG_INF)
    return np.delete(np.asarray(logits), PAD_ID, axis=-1)


def test_cached_steps_equal_the_full_forward_pass(rng):
    for positional_encoding in ("sinusoidal", "learned"):
        model, source, target = _model_and_inputs(rng, positional_encoding)
        full = np.delete(model((source, target)), PAD_ID, axis=-1)
        for max_length in (None, 10):  # a growing cache, and a static one longer than needed
            incremental = _incremental_logits(model, source, target, max_length)
            np.testing.assert_allclose(_without_padding(incremental), full, atol=1e-5)


def test_hypotheses_of_a_sentence_share_its_cross_attention_cache(rng):
    """Three hypotheses per sentence, decoded from one projection of each sentence's encoder
    output, equal the full forward pass over the sentence repeated three times."""
    model, source, _ = _model_and_inputs(rng)
    target = rng.integers(1, 40, size=(9, 5)).astype("int32")
    full = model((np.repeat(source, 3, axis=0), target))
    encoder_output, source_mask = model.encode(source)
    for max_length in (None, 5):
        cache = model.init_cache(encoder_output, hypotheses=3, max_length=max_length)
        for index in range(5):
            logits, cache = model.decode_step(target[:, index], index, cache, source_mask)
            np.testing.assert_allclose(_without_padding(logits), np.delete(full[:, index], PAD_ID, axis=-1), atol=1e-5)
        assert all(layer.cross_key.shape[0] == 3 and layer.self_key.shape[0] == 9 for layer in cache.layers)


def test_the_growing_cache_holds_the_decoded_positions_only(rng):
    model, source, target = _model_and_inputs(rng)
    encoder_output, source_mask = model.encode(source)
    cache = model.init_cache(encoder_output)
    for index in range(3):
        _, cache = model.decode_step(target[:, index], index, cache, source_mask)
    assert all(tuple(layer.self_key.shape) == (3, 4, 3, 8) for layer in cache.layers)


def test_cached_step_compiles_with_xla_with_fixed_shapes(rng):
    model, source, target = _model_and_inputs(rng)
    encoder_output, source_mask = model.encode(source)
    step = tf.function(model.decode_step, jit_compile=True)
    cache = model.init_cache(encoder_output, max_length=6)
    shapes = [tuple(t.shape) for t in tf.nest.flatten(cache)]
    for index in range(6):
        logits, cache = step(target[:, index], tf.constant(index), cache, source_mask)
        assert [tuple(t.shape) for t in tf.nest.flatten(cache)] == shapes
    np.testing.assert_allclose(_without_padding(logits), np.delete(model((source, target))[:, -1], PAD_ID, axis=-1), atol=1e-5)
    assert step.experimental_get_tracing_count() == 1
