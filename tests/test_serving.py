"""export/serving.py's parts that need no trained run: the parallel searches of a served graph,
the target-language tag in front of each source that an export of a tagged run serves."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import SCORE_TOLERANCE
from export.serving import SERVED_EXECUTION, in_parallel
from keras_transformer import Transformer, TransformerConfig
from keras_transformer.search import DecodingSettings, decode
from training.languages import tag, tagged


@pytest.mark.slow
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


SOURCES = ["a dog sees a cat", "the red car"]


def _export_of_tagged_run(tmp_path, monkeypatch, pairs):
    """What `export.saved_model.export` serves of a run of `pairs` ("en-de,en-qaa", or one pair
    of such a run, fine-tuned onto it with --init-from) whose vocabulary has the tags of de and
    qaa, a random tiny model: (its `Translator`, its metadata.json). Stopped at the SavedModel's
    save, which traces every signature (many seconds)."""
    from export import saved_model
    from training.run_folder import RunFolder
    from training.tokenizer import Tokenizer, train_sentencepiece

    class Saved(Exception):
        pass

    sentences = [tagged(text, language) for text in SOURCES for language in ("de", "qaa")]
    tokenizer = Tokenizer(train_sentencepiece(sentences * 50, 60, symbols=[tag("de"), tag("qaa")]))
    run = RunFolder(str(tmp_path / "run"))
    os.makedirs(run.path)
    run.save_tokenizer(tokenizer)
    config = TransformerConfig.tiny(tokenizer.target.vocab_size, num_layers=1, d_model=32, num_heads=2, d_ff=64, max_length=16)
    source, target = pairs.split(",")[0].split("-")
    run.record_segment(config, {"dataset": "synthetic", "source_lang": source, "target_lang": target, "pairs": pairs,
                                "seed": 0}, 0)  # fmt: skip
    checkpoint = str(tmp_path / "ckpt-1.weights.h5")
    Transformer(config).save_weights(checkpoint)
    saved = {}

    def save(translator, path, signatures):
        with open(os.path.join(os.path.dirname(path), "_assets", "metadata.json")) as f:
            saved.update(translator=translator, metadata=json.load(f))
        raise Saved

    monkeypatch.setattr(tf.saved_model, "save", save)
    with pytest.raises(Saved):
        saved_model.export(run.path, str(tmp_path / "exports"), DecodingSettings(beam_size=1, max_length_b=2),
                           checkpoint=checkpoint, searches=1)  # fmt: skip
    return saved["translator"], saved["metadata"]


def _tags_read(result):
    """The first two pieces of each source that an `alignments` result says the model read: the
    word boundary of SentencePiece and the tag, for a source asking for a language."""
    return [tuple(piece.decode() for piece in row[:2]) for row in result["source_pieces"].numpy()]


def test_a_one_language_export_of_a_tagged_run_puts_its_tag_in_front_of_each_source(tmp_path, monkeypatch):
    translator, metadata = _export_of_tagged_run(tmp_path, monkeypatch, "en-qaa")
    assert (metadata["pairs"], metadata["target_languages"]) == (["en-qaa"], ["qaa"])
    text = tf.constant(SOURCES)
    assert _tags_read(translator.alignments(text)) == [("\u2581", "<2qaa>")] * 2  # as the model learned to read it


def test_an_export_of_several_languages_writes_its_first_unless_a_request_asks_for_another(tmp_path, monkeypatch):
    translator, metadata = _export_of_tagged_run(tmp_path, monkeypatch, "en-de,en-qaa")
    assert (metadata["target_lang"], metadata["target_languages"]) == ("de", ["de", "qaa"])
    text = tf.constant(SOURCES)
    assert _tags_read(translator.alignments(text)) == [("\u2581", "<2de>")] * 2  # a request's that names none
    asked = translator.alignments(text, target_language=tf.constant(["qaa", "de"]))
    assert _tags_read(asked) == [("\u2581", "<2qaa>"), ("\u2581", "<2de>")]


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
