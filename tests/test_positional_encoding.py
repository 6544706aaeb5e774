import numpy as np
import pytest
from keras import ops

from keras_transformer import PositionalEncoding


def paper_formula(length, d_model):
    """Section 3.5 written out element by element in float64."""
    table = np.zeros((length, d_model))
    for pos in range(length):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            table[pos, 2 * i] = np.sin(angle)
            table[pos, 2 * i + 1] = np.cos(angle)
    return table


def test_sinusoids_equal_the_paper_formula():
    encoding = PositionalEncoding()(ops.zeros((1, 200, 32)))
    np.testing.assert_allclose(encoding[0], paper_formula(200, 32), atol=2e-5)


def test_the_halves_layout_holds_the_same_sinusoids_the_sines_first():
    """tensor2tensor's and Marian's table, written out: dimension i < d/2 holds sin of pair i's
    angle, dimension d/2 + i its cos."""
    interleaved = paper_formula(50, 16)
    expected = np.concatenate([interleaved[:, 0::2], interleaved[:, 1::2]], axis=1)
    layer = PositionalEncoding(halves=True)
    np.testing.assert_allclose(layer(ops.zeros((1, 50, 16)))[0], expected, atol=2e-5)
    step = layer(ops.zeros((1, 1, 16)), start_index=ops.convert_to_tensor(7))
    np.testing.assert_allclose(step[0, 0], expected[7], atol=2e-5)


def test_start_index_continues_the_sequence():
    layer = PositionalEncoding()
    full = layer(ops.zeros((2, 10, 16)))
    for start in (0, 3, 9):
        step = layer(ops.zeros((2, 1, 16)), start_index=ops.convert_to_tensor(start))
        np.testing.assert_allclose(step[:, 0], full[:, start], atol=1e-6)


def test_adds_to_the_inputs(rng):
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    np.testing.assert_allclose(PositionalEncoding()(x), x + paper_formula(5, 8)[None], atol=1e-5)


def test_learned_table_is_trained_and_sliced():
    layer = PositionalEncoding(max_length=12, learned=True)
    full = layer(ops.zeros((1, 12, 8)))
    assert [w.shape for w in layer.trainable_weights] == [(12, 8)]
    np.testing.assert_allclose(full[0], layer.table.numpy())
    np.testing.assert_allclose(layer(ops.zeros((1, 2, 8)), start_index=5)[0], layer.table.numpy()[5:7])


def test_odd_width_is_rejected():
    with pytest.raises(ValueError, match="even d_model, got 7"):
        PositionalEncoding()(ops.zeros((1, 3, 7)))
