"""Positional encodings (section 3.5)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEncoding(keras.layers.Layer):
    """Adds position information to a sequence of embeddings.

    Sinusoidal (section 3.5), for position `pos` and dimension pair `i`:
    `PE(pos, 2i) = sin(pos / 10000^(2i / d_model))`, `PE(pos, 2i + 1) = cos(...)` with the same
    angle; or, with `halves`, the same sines in dimensions `[0, d_model / 2)` and cosines in the
    rest (tensor2tensor's and Marian's layout). Computed on the fly, so any length works. Learned
    (Table 3 row E): a trained table of `max_length` rows.

    Args:
        max_length: rows of the learned table; unused by the sinusoids.
        learned: use the learned table instead of the sinusoids.
        halves: the sinusoids' sines in the first half of the dimensions, cosines in the second.

    Call arguments:
        inputs: `[batch, length, d_model]`.
        start_index: position of `inputs[:, 0]` (an int or scalar tensor), for decoding one
            position at a time.

    Returns:
        `inputs + PE[start_index : start_index + length]`, `[batch, length, d_model]`.

    Example:
    >>> encoding = PositionalEncoding()
    >>> encoding(ops.zeros((1, 4, 8)))[0, 0]  # position 0: sin 0 = 0, cos 0 = 1
    array([0., 1., 0., 1., 0., 1., 0., 1.], dtype=float32)
    """

    def __init__(self, max_length=256, learned=False, halves=False, **kwargs):
        super().__init__(**kwargs)
        self.max_length = max_length
        self.learned = learned
        self.halves = halves

    def build(self, input_shape):
        d_model = input_shape[-1]
        if self.learned:
            self.table = self.add_weight(
                name="table",
                shape=(self.max_length, d_model),
                initializer=keras.initializers.RandomNormal(stddev=d_model**-0.5),
            )
        elif d_model % 2:
            raise ValueError(f"Sinusoidal positional encoding needs an even d_model, got {d_model}.")

    def call(self, inputs, start_index=0):
        positions = ops.arange(ops.shape(inputs)[1]) + ops.cast(start_index, "int32")
        if self.learned:
            encoding = ops.take(self.table, positions, axis=0)
        else:
            encoding = sinusoids(positions, ops.shape(inputs)[-1], self.halves)
        return inputs + ops.cast(encoding, inputs.dtype)

    def get_config(self):
        return {**super().get_config(), "max_length": self.max_length, "learned": self.learned, "halves": self.halves}


def sinusoids(positions, d_model, halves=False):
    """The encodings of section 3.5 for integer `positions` `[length]`: float32 `[length, d_model]`,
    sin and cos interleaved (even dimensions sin), or with `halves` all sines then all cosines."""
    pair_index = ops.arange(d_model // 2, dtype="float32")
    inverse_wavelength = ops.power(10000.0, -2.0 * pair_index / d_model)
    angles = ops.cast(positions, "float32")[:, None] * inverse_wavelength[None, :]
    if halves:
        return ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)
    return ops.reshape(ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1), (-1, d_model))
