import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    MultiHeadAttention,
    PositionalEncoding,
    PositionwiseFeedForward,
    SharedEmbedding,
    Transformer,
    TransformerConfig,
)

VOCAB = 50


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(7)
    model = Transformer(TransformerConfig.tiny(VOCAB, num_layers=2, d_model=32, num_heads=4, d_ff=64))
    return model


def _ids(rng, batch, length, pad_from=None):
    ids = rng.integers(1, VOCAB, size=(batch, length)).astype("int32")
    if pad_from is not None:
        for row, start in enumerate(pad_from):
            ids[row, start:] = 0
    return ids


def test_logits_shape_and_dtype(model, rng):
    logits = model((_ids(rng, 3, 7), _ids(rng, 3, 5)))
    assert logits.shape == (3, 5, VOCAB) and logits.dtype == "float32"


def test_decoder_is_causal(model, rng):
    source, target = _ids(rng, 2, 6), _ids(rng, 2, 8)
    logits = model((source, target))
    for t in range(8):
        changed = target.copy()
        changed[:, t + 1 :] = _ids(rng, 2, 8)[:, t + 1 :]
        np.testing.assert_allclose(model((source, changed))[:, : t + 1], logits[:, : t + 1], atol=1e-5)
        if t < 7:
            assert not np.allclose(model((source, changed))[:, t + 1 :], logits[:, t + 1 :], atol=1e-5)


def test_padding_does_not_change_real_positions(model, rng):
    source = _ids(rng, 2, 6, pad_from=[6, 4])
    target = _ids(rng, 2, 5, pad_from=[5, 3])
    logits = model((source, target))
    padded = model((np.pad(source, [(0, 0), (0, 9)]), np.pad(target, [(0, 0), (0, 4)])))
    np.testing.assert_allclose(padded[0, :5], logits[0, :5], atol=1e-5)
    np.testing.assert_allclose(padded[1, :3], logits[1, :3], atol=1e-5)


def test_source_padding_is_ignored_by_attention(model, rng):
    source = _ids(rng, 1, 6, pad_from=[4])  # 4 real tokens, then 2 padding positions
    target = _ids(rng, 1, 3)
    # The padded source translates as the same 4 tokens without padding...
    np.testing.assert_allclose(model((source, target)), model((source[:, :4], target)), atol=1e-5)
    # ...while real tokens in those 2 positions change the output.
    filled = source.copy()
    filled[0, 4:] = _ids(rng, 1, 2)
    assert not np.allclose(model((filled, target)), model((source, target)), atol=1e-5)


def _parameters(config):
    """The parameter count of section 3, by hand: a shared embedding (3.4); per encoder layer one
    attention block (4 d x d projections with biases), the FFN (eq. 2) and 2 layer norms; per
    decoder layer two attention blocks, the FFN and 3 layer norms; with a logits bias, its vocab."""
    d, d_ff = config.d_model, config.d_ff
    attention = 4 * (d * d + d)
    ffn = d * d_ff + d_ff + d_ff * d + d
    norm = 2 * d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    bias = config.vocab_size if config.logits_bias else 0
    return config.vocab_size * d + bias + config.encoder_layers * encoder_layer + config.decoder_layers * decoder_layer


def test_parameter_count_is_the_papers_architecture(model):
    assert model.count_params() == _parameters(model.config)


def test_a_deep_encoder_and_a_shallow_decoder_have_their_own_depths(rng):
    model = Transformer(TransformerConfig.tiny(VOCAB, encoder_layers=3, decoder_layers=1, d_model=32, d_ff=64))
    assert (len(model.encoder.layers), len(model.decoder.layers)) == (3, 1)
    assert model.count_params() == _parameters(model.config)
    assert len(model.cross_attention_weights(_ids(rng, 2, 6), _ids(rng, 2, 5))) == 1


def test_marians_options_reach_every_layer():
    config = TransformerConfig.tiny(VOCAB, d_model=32, d_ff=64, activation="swish", layer_norm_epsilon=1e-5,
                                    positional_encoding="sinusoidal_halves", logits_bias=True)  # fmt: skip
    model = Transformer(config)
    assert model.count_params() == _parameters(config)
    layers = [*model.encoder.layers, *model.decoder.layers]
    names = ("self_attention_norm", "cross_attention_norm", "feed_forward_norm")
    norms = [getattr(layer, name) for layer in layers for name in names if hasattr(layer, name)]
    assert len(norms) == 2 * config.encoder_layers + 3 * config.decoder_layers
    assert {norm.epsilon for norm in norms} == {1e-5}
    assert {layer.feed_forward.inner.activation.__name__ for layer in layers} == {"silu"}  # Keras names swish silu
    assert model.positional_encoding.halves and not model.positional_encoding.learned
    assert Transformer.from_config(model.get_config()).config == config


@pytest.mark.parametrize("preset, paper", [("base", 65e6), ("big", 213e6)])
def test_parameter_count_matches_the_paper(preset, paper):
    assert abs(_parameters(TransformerConfig.preset(preset, 37000)) - paper) / paper < 0.05


def test_one_embedding_matrix_serves_source_target_and_output(model):
    matrices = [w for w in model.weights if w.shape == (VOCAB, 32)]
    assert len(matrices) == 1
    assert matrices[0] is model.embedding.embeddings


def test_a_source_vocabulary_of_its_own_has_its_embedding_and_the_target_keeps_the_output(rng, tmp_path):
    model = Transformer(TransformerConfig.tiny(VOCAB, source_vocab_size=VOCAB + 7, num_layers=1, d_model=32, d_ff=64))
    assert model.source_embedding.embeddings.shape == (VOCAB + 7, 32)
    assert model.embedding.embeddings.shape == (VOCAB, 32)
    source = rng.integers(4, VOCAB + 7, size=(2, 6))  # ids past the target's vocabulary
    target = rng.integers(4, VOCAB, size=(2, 5))
    logits = model((source, target))
    assert logits.shape == (2, 5, VOCAB)
    model.source_embedding.embeddings.assign(model.source_embedding.embeddings * 2.0)  # the source's own matrix is read
    assert not np.allclose(model((source, target)), logits)
    model.save_weights(str(tmp_path / "separate.weights.h5"))
    loaded = Transformer.from_config(model.get_config())
    loaded.load_weights(str(tmp_path / "separate.weights.h5"))
    np.testing.assert_allclose(loaded((source, target)), model((source, target)), rtol=1e-6, atol=1e-6)


def test_save_and_load_reproduce_the_logits(model, rng, tmp_path):
    source, target = _ids(rng, 2, 6), _ids(rng, 2, 4)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.config == model.config
    np.testing.assert_allclose(loaded((source, target)), model((source, target)), atol=1e-6)


def test_xla_forward_equals_eager(model, rng):
    source, target = _ids(rng, 2, 6, pad_from=[6, 2]), _ids(rng, 2, 4)
    compiled = tf.function(lambda s, t: model((s, t)), jit_compile=True)
    np.testing.assert_allclose(compiled(source, target), model((source, target)), atol=1e-5)


def test_dropout_is_active_only_in_training(model, rng):
    inputs = (_ids(rng, 2, 6), _ids(rng, 2, 4))
    np.testing.assert_allclose(model(inputs), model(inputs, training=False))
    assert not np.allclose(model(inputs, training=True), model(inputs))


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_keeps_logits_in_float32(policy, rng):
    keras.config.set_dtype_policy(policy)
    model = Transformer(TransformerConfig.tiny(VOCAB, d_model=32, d_ff=64))
    logits = model((_ids(rng, 2, 6), _ids(rng, 2, 4)))
    assert logits.dtype == "float32"
    assert np.all(np.isfinite(logits))
    assert all(w.dtype == "float32" for w in model.weights)


LAYERS = [
    (lambda: MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.1), lambda x: (x, x)),
    (lambda: PositionwiseFeedForward(d_ff=16, dropout=0.1), lambda x: (x,)),
    (lambda: PositionwiseFeedForward(d_ff=16, activation="swish"), lambda x: (x,)),
    (lambda: PositionalEncoding(max_length=9, learned=True), lambda x: (x,)),
    (lambda: PositionalEncoding(halves=True), lambda x: (x,)),
    (lambda: EncoderLayer(num_heads=2, d_ff=16, dropout=0.2), lambda x: (x,)),
    (lambda: EncoderLayer(num_heads=2, d_ff=16, activation="swish", layer_norm_epsilon=1e-3), lambda x: (x,)),
    (lambda: Encoder(num_layers=2, num_heads=2, d_ff=16, relu_dropout=0.1), lambda x: (x,)),
    (lambda: DecoderLayer(num_heads=2, d_ff=16, attention_dropout=0.1, relu_dropout=0.2), lambda x: (x, x)),
    (lambda: Decoder(num_layers=2, num_heads=2, d_ff=16), lambda x: (x, x)),
]


@pytest.mark.parametrize("make, args", LAYERS)
def test_layers_round_trip_through_config(make, args, rng):
    layer = make()
    inputs = args(rng.normal(size=(2, 5, 8)).astype("float32"))
    expected = layer(*inputs)
    clone = type(layer).from_config(layer.get_config())
    clone(*inputs)
    clone.set_weights(layer.get_weights())
    assert clone.get_config() == layer.get_config()
    np.testing.assert_allclose(clone(*inputs), expected, atol=1e-6)


def test_embedding_and_model_round_trip_through_config():
    for logits_bias in (False, True):
        embedding = SharedEmbedding(vocab_size=7, d_model=4, logits_bias=logits_bias)
        assert SharedEmbedding.from_config(embedding.get_config()).get_config() == embedding.get_config()
    model = Transformer(TransformerConfig.tiny(VOCAB))
    assert Transformer.from_config(model.get_config()).config == model.config


def test_tf_train_checkpoint_holds_every_weight(model, rng, tmp_path):
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    saved = [n for n in tf.train.load_checkpoint(path).get_variable_to_shape_map() if n.startswith("model/")]
    assert len(saved) == len(model.weights)
    restored = Transformer(model.config)
    tf.train.Checkpoint(model=restored).restore(path).assert_existing_objects_matched()
    source, target = _ids(rng, 2, 6), _ids(rng, 2, 4)
    np.testing.assert_allclose(restored((source, target)), model((source, target)), atol=1e-6)


def test_projections_start_different():
    attention = Transformer(TransformerConfig.tiny(VOCAB)).encoder.layers[0].self_attention
    kernels = [attention.query_kernel, attention.key_kernel, attention.value_kernel]
    assert not np.allclose(kernels[0], kernels[1]) and not np.allclose(kernels[1], kernels[2])


def test_cross_attention_weights_are_distributions_over_real_source_tokens(model, rng):
    source = _ids(rng, 2, 6, pad_from=[6, 4])
    weights = model.cross_attention_weights(source, _ids(rng, 2, 5))
    assert len(weights) == model.config.decoder_layers
    for layer_weights in weights:
        assert layer_weights.shape == (2, model.config.num_heads, 5, 6)
        np.testing.assert_allclose(np.sum(layer_weights, axis=-1), 1.0, atol=1e-5)
        assert np.all(np.asarray(layer_weights)[1, :, :, 4:] == 0)
