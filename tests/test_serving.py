"""export/serving.py's parts that need no trained run: the parallel searches of a served graph."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import SCORE_TOLERANCE
from export.serving import SERVED_EXECUTION, in_parallel
from keras_transformer import Transformer, TransformerConfig
from keras_transformer.search import DecodingSettings, decode


@pytest.mark.parametrize("beam_size", [1, 3])
def test_parallel_searches_give_what_one_search_gives(beam_size, rng):
    keras.utils.set_random_seed(8)
    model = Transformer(TransformerConfig.tiny(30, num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout=0.0))
    settings = DecodingSettings(beam_size=beam_size, max_length_b=4)

    def search(ids):
        return decode(model, ids, settings, SERVED_EXECUTION)

    unknown_batch = [tf.TensorSpec([None, None], tf.int32)]
    one = tf.function(search, input_signature=unknown_batch)
    graphs = {  # graphs that do not know the batch size (as served) and one that does (its slices' too)
        "2 searches": tf.function(lambda ids: in_parallel(search, ids, 2), input_signature=unknown_batch),
        "2 searches, static batch": tf.function(lambda ids: in_parallel(search, ids, 2)),
    }
    for batch in (0, 1, 3):  # some of the searches get no sentence
        sources = np.zeros((batch, 6), "int32")
        for row, length in enumerate([6, 2, 5][:batch]):
            sources[row, :length] = rng.integers(4, 30, size=length)
        expected = one(sources)
        for name, graph in graphs.items():
            if batch < 3 and "static" in name:  # a static batch is never empty; one size is traced once
                continue
            result = graph(sources)
            assert result.tokens.shape == expected.tokens.shape, name
            np.testing.assert_array_equal(result.tokens, expected.tokens, err_msg=name)
            np.testing.assert_allclose(result.scores, expected.scores, **SCORE_TOLERANCE, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_a_model_in_reduced_precision_decodes_as_float32_on_most_sentences(precision, reversal_model):
    from export.saved_model import in_precision

    model, _, sources = reversal_model
    reduced = in_precision(model, precision)
    assert {weight.dtype for weight in reduced.weights} == {precision} and reduced.decoder.layers[0].compute_dtype == precision
    assert in_precision(model, "float32") is model and keras.config.dtype_policy().name == "float32"
    for beam_size in (1, 4):
        settings = DecodingSettings(beam_size=beam_size, max_length_b=4)
        expected, result = (tf.function(lambda s, m=m: decode(m, s, settings, SERVED_EXECUTION))(sources) for m in (model, reduced))
        assert result.scores.dtype == "float32"
        same = np.all(result.tokens.numpy() == expected.tokens.numpy(), axis=-1)
        assert np.mean(same) >= 0.9, (beam_size, np.mean(same))
        np.testing.assert_allclose(result.scores.numpy()[same], expected.scores.numpy()[same], atol=0.05)
    with pytest.raises(ValueError, match="--precision is one of float32, bfloat16, float16; got 'int8'"):
        in_precision(model, "int8")
