import keras
import numpy as np
import pytest

from keras_transformer import MultiHeadAttention


def _pair(rng, batch=2, target_len=5, source_len=7, d_model=16, heads=4):
    ours = MultiHeadAttention(num_heads=heads, key_dim=d_model // heads)
    reference = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=d_model // heads)
    query = rng.normal(size=(batch, target_len, d_model)).astype("float32")
    value = rng.normal(size=(batch, source_len, d_model)).astype("float32")
    ours(query, value)
    reference(query, value)
    reference.set_weights(ours.get_weights())
    return ours, reference, query, value


def test_equals_keras_attention_without_mask(rng):
    ours, reference, query, value = _pair(rng)
    np.testing.assert_allclose(ours(query, value), reference(query, value), atol=1e-5)


def test_equals_keras_attention_with_padding_mask(rng):
    ours, reference, query, value = _pair(rng)
    lengths = np.array([7, 3])
    key_mask = np.arange(7)[None, :] < lengths[:, None]  # [batch, source_len]
    expected = reference(query, value, attention_mask=np.repeat(key_mask[:, None, :], 5, axis=1))
    actual = ours(query, value, attention_mask=key_mask[:, None, :])
    np.testing.assert_allclose(actual, expected, atol=1e-5)


def test_equals_keras_attention_with_causal_mask(rng):
    ours, reference, x, _ = _pair(rng, target_len=6, source_len=6)
    expected, expected_weights = reference(x, x, use_causal_mask=True, return_attention_scores=True)
    actual, weights = ours(x, x, use_causal_mask=True, return_attention_scores=True)
    np.testing.assert_allclose(actual, expected, atol=1e-5)
    np.testing.assert_allclose(weights, expected_weights, atol=1e-5)
    # No weight on later positions, and each row is a distribution.
    assert np.all(np.triu(np.asarray(weights)[0, 0], k=1) == 0)
    np.testing.assert_allclose(np.sum(weights, axis=-1), 1.0, atol=1e-5)


def test_precomputed_key_value_equals_keras_attention(rng):
    ours, reference, query, value = _pair(rng)
    key, projected_value = ours.compute_key_value(value)
    weights = {w.name: np.asarray(w) for w in ours.weights}
    # Heads before positions: [batch, heads, len, key_dim].
    expected_key = np.einsum("bsd,dnh->bnsh", value, weights["key_kernel"]) + weights["key_bias"][:, None]
    expected_value = np.einsum("bsd,dnh->bnsh", value, weights["value_kernel"]) + weights["value_bias"][:, None]
    np.testing.assert_allclose(key, expected_key, atol=1e-5)
    np.testing.assert_allclose(projected_value, expected_value, atol=1e-5)
    np.testing.assert_allclose(ours(query, key_value=(key, projected_value)), reference(query, value), atol=1e-5)


def test_attention_dropout_changes_training_output_only(rng):
    layer = MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.5)
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    np.testing.assert_allclose(layer(x, x), layer(x, x, training=False))
    assert not np.allclose(layer(x, x, training=True), layer(x, x))


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_softmax_runs_in_float32_under_mixed_precision(policy, rng):
    keras.config.set_dtype_policy(policy)
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    output, weights = layer(x, x, return_attention_scores=True)
    assert output.dtype == keras.config.dtype_policy().compute_dtype
    assert weights.dtype == "float32"
    assert layer.query_kernel.dtype == "float32"
