import numpy as np
import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig


def _model_and_inputs(rng, positional_encoding="sinusoidal"):
    config = TransformerConfig.tiny(40, d_model=32, num_heads=4, d_ff=64, positional_encoding=positional_encoding)
    model = Transformer(config)
    source = rng.integers(1, 40, size=(3, 7)).astype("int32")
    source[1, 4:] = 0
    target = rng.integers(1, 40, size=(3, 6)).astype("int32")
    return model, source, target


def _incremental_logits(model, source, target, cache_length):
    encoder_output, source_mask = model.encode(source)
    cache = model.init_cache(encoder_output, cache_length)
    steps = []
    for index in range(target.shape[1]):
        logits, cache = model.decode_step(target[:, index], index, cache, source_mask)
        steps.append(logits)
    return np.stack(steps, axis=1)


def test_cached_steps_equal_the_full_forward_pass(rng):
    for positional_encoding in ("sinusoidal", "learned"):
        model, source, target = _model_and_inputs(rng, positional_encoding)
        full = model((source, target))
        np.testing.assert_allclose(_incremental_logits(model, source, target, 10), full, atol=1e-5)


def test_cached_step_compiles_with_xla_with_fixed_shapes(rng):
    model, source, target = _model_and_inputs(rng)
    encoder_output, source_mask = model.encode(source)
    step = tf.function(model.decode_step, jit_compile=True)
    cache = model.init_cache(encoder_output, 6)
    shapes = [tuple(t.shape) for t in tf.nest.flatten(cache)]
    for index in range(6):
        logits, cache = step(target[:, index], tf.constant(index), cache, source_mask)
        assert [tuple(t.shape) for t in tf.nest.flatten(cache)] == shapes
    np.testing.assert_allclose(logits, model((source, target))[:, -1], atol=1e-5)
    assert step.experimental_get_tracing_count() == 1
