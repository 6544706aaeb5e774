import numpy as np

from keras_transformer import PositionwiseFeedForward, SharedEmbedding


def test_embedding_is_scaled_by_sqrt_d_model():
    layer = SharedEmbedding(vocab_size=11, d_model=16)
    ids = np.array([[3, 0, 10]])
    vectors = layer(ids)
    matrix = layer.embeddings.numpy()
    np.testing.assert_allclose(vectors[0], matrix[[3, 0, 10]] * 4.0, rtol=1e-6)


def test_logits_use_the_same_matrix(rng):
    layer = SharedEmbedding(vocab_size=11, d_model=16)
    layer(np.array([[1]]))
    hidden = rng.normal(size=(2, 3, 16)).astype("float32")
    np.testing.assert_allclose(layer.logits(hidden), hidden @ layer.embeddings.numpy().T, rtol=1e-5, atol=1e-5)
    assert len(layer.weights) == 1


def test_the_logits_bias_is_trained_and_added_to_every_position(rng):
    layer = SharedEmbedding(vocab_size=11, d_model=16, logits_bias=True)
    layer(np.array([[1]]))
    assert [weight.path.split("/")[-1] for weight in layer.trainable_weights] == ["embeddings", "bias"]
    bias = rng.normal(size=11).astype("float32")
    layer.bias.assign(bias)
    hidden = rng.normal(size=(2, 3, 16)).astype("float32")
    expected = hidden @ layer.embeddings.numpy().T + bias
    np.testing.assert_allclose(layer.logits(hidden), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer.bias_or_zeros(), bias)


def test_feed_forward_with_swish_is_x_times_sigmoid_x(rng):
    layer = PositionwiseFeedForward(d_ff=32, activation="swish")
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    output = layer(x)
    w1, b1, w2, b2 = layer.get_weights()
    inner = x @ w1 + b1
    np.testing.assert_allclose(output, (inner / (1 + np.exp(-inner))) @ w2 + b2, rtol=1e-5, atol=1e-5)


def test_feed_forward_is_equation_2(rng):
    layer = PositionwiseFeedForward(d_ff=32)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    output = layer(x)
    w1, b1, w2, b2 = layer.get_weights()
    assert w1.shape == (8, 32) and w2.shape == (32, 8)
    np.testing.assert_allclose(output, np.maximum(0, x @ w1 + b1) @ w2 + b2, rtol=1e-5, atol=1e-5)


def test_feed_forward_dropout_drops_inner_activations_in_training_only(rng):
    rate = 0.5
    layer = PositionwiseFeedForward(d_ff=8, dropout=rate)
    x = rng.normal(size=(4, 6, 8)).astype("float32")
    layer(x)
    w1, b1, _, _ = layer.get_weights()
    layer.set_weights([w1, b1, np.eye(8, dtype="float32"), np.zeros(8, "float32")])  # W_2 = I shows the inner units
    inner = np.maximum(0, x @ w1 + b1)
    np.testing.assert_allclose(layer(x), inner, rtol=1e-5, atol=1e-6)
    dropped = np.asarray(layer(x, training=True))
    kept = np.isclose(dropped, inner / (1 - rate), rtol=1e-5, atol=1e-6)
    zeroed = dropped == 0
    assert np.all(kept | zeroed)
    active = inner > 0
    assert 0.3 < np.mean(zeroed[active]) < 0.7  # about `rate` of the active units are dropped
