"""The CTranslate2 export (export/ctranslate2.py): the suite's trained run converted, translated by
the README's recipe, against the SavedModel's translations of the same run. CI installs
ctranslate2 (export/requirements.txt); where it is missing, these tests say how to install it."""

import json

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf

from conftest import loaded_export
from export import ctranslate2 as conversion
from keras_transformer.search import DecodingSettings
from training.evaluate import make_translator
from training.languages import tagged
from training.run_folder import RunFolder

SENTENCES = 200
MAX_LENGTH_B = DecodingSettings.max_length_b


def _needs_ctranslate2():
    if not conversion.available():
        pytest.skip(f"ctranslate2 is not installed: {conversion.INSTALL}")


@pytest.fixture(scope="module")
def test_pairs(artifacts):
    return RunFolder(artifacts.tf_run).load_corpus().text_pairs("test", SENTENCES)


def _ctranslate2(model_dir, sources, beam_size, alpha=0.6):
    """The README's recipe, one sentence a call: at most as many pieces as our export allows
    (the source's pieces, its end of sentence, + max_length_b)."""
    import ctranslate2
    import sentencepiece

    translator = ctranslate2.Translator(model_dir, device="cpu")
    pieces = sentencepiece.SentencePieceProcessor(model_file=f"{model_dir}/sentencepiece.model")
    translations = []
    for source in pieces.encode(sources, out_type=str):
        (result,) = translator.translate_batch([source], beam_size=beam_size, length_penalty=alpha,
                                               max_decoding_length=len(source) + 1 + MAX_LENGTH_B)  # fmt: skip
        translations.append(pieces.decode(result.hypotheses[0]))
    return translations


def _served(export_dir, sources, **options):
    """The export's translations, with `options` (the `options` signature's inputs) if any."""
    loaded = loaded_export(export_dir)
    translate = loaded.options if options else loaded.translate
    return [t.decode() for t in translate(text=tf.constant(sources), **options)["translation"].numpy()]


@pytest.mark.slow
def test_the_conversion_translates_as_the_saved_model_greedy_token_for_token_and_beam_within_the_bleu(
    artifacts, test_pairs, tmp_path, capsys
):
    _needs_ctranslate2()
    sources, references = [list(side) for side in zip(*test_pairs)]
    out = str(tmp_path / "float32")
    conversion.main(["--run-dir", artifacts.tf_run, "--out", out])
    assert f"({'float32'}) to {out}" in capsys.readouterr().out
    with open(f"{out}/config.json") as f:
        assert json.load(f)["add_source_eos"] is True  # what the model needs beyond the pieces
    assert _ctranslate2(out, sources, 1) == _served(artifacts.exports[1], sources)
    # Beam search without a length penalty: the same objective, and nearly always the same
    # translation (the two stop a sentence by different rules).
    unpenalized = _served(artifacts.exports[4], sources, alpha=tf.constant([0.0]))
    same = np.mean([a == b for a, b in zip(unpenalized, _ctranslate2(out, sources, 4, alpha=0.0))])
    assert same >= 0.98, same
    # With alpha 0.6 the penalties differ (GNMT's ((5 + |Y|) / 6) ** alpha against CTranslate2's
    # |Y| ** alpha): close BLEUs (bench/README.md measures them on real text); int8 close to float32.
    bleu = lambda translations: sacrebleu.corpus_bleu(translations, [references]).score  # noqa: E731
    ours, theirs = bleu(_served(artifacts.exports[4], sources)), bleu(_ctranslate2(out, sources, 4))
    assert abs(ours - theirs) <= 0.5, (ours, theirs)
    conversion.main(["--run-dir", artifacts.tf_run, "--out", str(tmp_path / "int8"), "--quantization", "int8"])
    assert abs(bleu(_ctranslate2(str(tmp_path / "int8"), sources, 4)) - theirs) <= 1.0


@pytest.mark.slow
def test_a_deep_encoder_and_a_shallow_decoder_convert_with_their_own_depths(artifacts, tmp_path):
    """The suite's JAX run (3 encoder layers, 1 decoder layer, two target languages, Marian's model
    options): CTranslate2's greedy search gives the library's, for each language its tag asks for."""
    _needs_ctranslate2()
    run = RunFolder(artifacts.jax_run)
    model, _ = run.load_model()
    config = model.config  # training.train's flags reached the run's config.json
    assert (config.activation, config.positional_encoding, config.layer_norm_epsilon, config.logits_bias) == (
        "swish", "sinusoidal_halves", 1e-5, True)
    assert np.any(model.embedding.bias.numpy() != 0)  # trained
    out = conversion.export(artifacts.jax_run, str(tmp_path / "ct2"))
    translate = make_translator(model, run.load_tokenizer(), DecodingSettings(beam_size=1), jit_compile=False)
    for language in ("de", "qaa"):
        sources = [tagged(source, language) for source, _ in run.load_corpus().text_pairs("test", 20)]
        assert _ctranslate2(out, sources, 1) == translate(sources)[0]


def test_bad_input_is_named_and_a_missing_ctranslate2_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit):
        conversion.main(["--run-dir", str(tmp_path), "--out", str(tmp_path / "out"), "--quantization", "int4"])
    assert "argument --quantization: invalid choice: 'int4'" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="--out .*full exists and is not empty"):
        conversion.export(str(tmp_path), str(tmp_path / "full"))
    monkeypatch.setattr(conversion, "available", lambda: False)
    with pytest.raises(SystemExit, match="needs the ctranslate2 package: pip install -r export/requirements.txt"):
        conversion.main(["--run-dir", str(tmp_path), "--out", str(tmp_path / "out")])


# The paper's model, and one with Marian's options (OPUS-MT's), each other than the paper's.
MARIAN = dict(activation="swish", positional_encoding="sinusoidal_halves", layer_norm_epsilon=1e-5, logits_bias=True)


@pytest.mark.parametrize("options", [{}, MARIAN], ids=["paper", "marian"])
def test_the_weights_map_one_to_one(options, tmp_path, rng):
    """A random model's logits, step by step, against CTranslate2's scores of a forced output.
    Every weight is random, the layer norms' and the biases too (a new model's are 1 and 0, alike
    wherever they are), so that each must reach its own place."""
    _needs_ctranslate2()
    import ctranslate2

    from keras_transformer import BOS_ID, EOS_ID, Transformer, TransformerConfig

    config = TransformerConfig.tiny(30, encoder_layers=2, decoder_layers=1, d_model=32, num_heads=4, d_ff=64, **options)
    model = Transformer(config)
    for weight in model.weights:
        if weight.path.endswith(("gamma", "beta", "bias")):
            weight.assign(rng.normal(1.0 if weight.path.endswith("gamma") else 0.0, 0.5, weight.shape))
    vocabulary = ["<pad>", "<unk>", "<s>", "</s>", *(f"t{i}" for i in range(4, 30))]
    conversion.convert(model, str(tmp_path), vocabulary)
    source, target = [5, 9, 7, 12], [8, 6, 11]
    logits = model((np.array([[*source, EOS_ID]]), np.array([[BOS_ID, *target]])))[0].numpy()
    logits[:, 0] = -np.inf  # padding, which neither generates
    log_probs = logits - np.log(np.sum(np.exp(logits), axis=-1, keepdims=True))
    expected = [log_probs[i, token] for i, token in enumerate([*target, EOS_ID])]
    translator = ctranslate2.Translator(str(tmp_path), device="cpu")
    (result,) = translator.score_batch([[vocabulary[i] for i in source]], [[vocabulary[i] for i in target]])
    np.testing.assert_allclose(result.log_probs, expected, atol=1e-4)
