"""The SavedModel's `options` and `score` signatures (export/serving.py) against the library, on the
suite's shared export of beam 4 (tests/artifacts.py)."""

import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from conftest import SCORE_TOLERANCE, loaded_export
from search_helpers import _length_penalty
from export.signatures import SIGNATURE
from keras_transformer import BOS_ID, PAD_ID, UNK_ID
from keras_transformer.search import OPTION, OPTIONS, DecodingSettings, decode
from keras_transformer.search.input_length import cut
from training.run_folder import RunFolder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTENCES = [
    "Yesterday the small dog saw the red car.",
    "I think that my friends help the old teacher in the park.",
    "The cat follows a horse.",
]
# One value per sentence of SENTENCES for each option: each processor on for some sentence.
PER_SENTENCE = {
    "beam_size": [4, 1, 2],
    "alpha": [0.6, 0.0, 1.0],
    "max_length_a": [1.0, 1.0, 0.5],
    "max_length_b": [50, 50, 4],
    "min_length": [0, 16, 0],
    "no_repeat_ngram_size": [1, 0, 2],
    "repetition_penalty": [1.0, 2.0, 1.0],
    "disable_unk": [True, False, True],
    "suppress_sequences": [["Hund", "rote"], ["", ""], ["Katze", ""]],
    "max_input_length": [0, 6, 0],
}

# The `customised` export's decoding values, other than the table's defaults.
EXPORTED = {"no_repeat_ngram_size": 3, "alpha": 1.0}
# Sentences on which each option of ALONE binds for some sentence, and the export's values
# differ from the table's defaults.
BINDING = SENTENCES + [
    "The dog sees the dog sees the dog.",
    "The dog sees the dog sees the dog sees the dog sees the dog sees the dog.",
    "I think that I think that I think.",
    "The children help the old teacher in the park.",
]
# Each option's value in a request of its own, on BINDING (the length limit's two terms each
# with the other as a companion: one term alone leaves the limit far from the outputs).
ALONE = {
    "beam_size": {"beam_size": 1},
    "alpha": {"alpha": 3.0},
    "max_length_a": {"max_length_a": 0.3, "max_length_b": 1},
    "max_length_b": {"max_length_b": 3, "max_length_a": 0.0},
    "min_length": {"min_length": 16},
    "no_repeat_ngram_size": {"no_repeat_ngram_size": 1},
    "repetition_penalty": {"repetition_penalty": 2.0},
    "disable_unk": {"disable_unk": True},
    "suppress_sequences": {"suppress_sequences": ["Pferd"]},
    "max_input_length": {"max_input_length": 4},
}
assert sorted(ALONE) == sorted(option.name for option in OPTIONS)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(artifacts):
    return loaded_export(artifacts.exports[4])


@pytest.fixture(scope="module")
def customised(artifacts, tmp_path_factory):
    """The shared run's model exported with EXPORTED's decoding, the unknown token's embedding row
    made a little larger than "Hund"'s, so that the model writes the unknown token where it
    would write "Hund" (the trained model never writes it, and `disable_unk` would change
    nothing): (the export, the model, the run folder)."""
    from export.saved_model import export

    folder = tmp_path_factory.mktemp("customised")
    run = RunFolder(artifacts.tf_run)
    model, _ = run.load_model()
    tokenizer = run.load_tokenizer()
    (hund,) = tokenizer.target.tokenize(tf.constant("Hund")).numpy()
    (embeddings,) = [weight for weight in model.weights if weight.path.endswith("embeddings")]
    rows = embeddings.numpy()
    rows[UNK_ID] = 1.01 * rows[hund]
    embeddings.assign(rows)
    weights = str(folder / "unk.weights.h5")
    model.save_weights(weights)
    path = export(artifacts.tf_run, str(folder / "exports"), DecodingSettings(**EXPORTED), checkpoint=weights)
    loaded_export(path)  # before any test makes a tokenizer (see `library`)
    return path, model, run


@pytest.fixture
def library(artifacts, served):
    """The run's model and tokenizer, loaded after the export (loading a SavedModel can drop the
    SentencePiece resource of a tokenizer made before it)."""
    run = RunFolder(artifacts.tf_run)
    model, _ = run.load_model()
    return model, run.load_tokenizer()


def _inputs(values):
    specs = {tensor.name: tensor.spec for tensor in SIGNATURE["options"].inputs}
    return {name: tf.constant(value, specs[name].dtype) for name, value in values.items()}


def test_every_option_is_an_input_of_its_kind(served):
    specs = served.signatures["options"].structured_input_signature[1]
    assert {name: (spec.dtype, spec.shape.as_list()) for name, spec in specs.items()} == {
        "text": (tf.string, [None]),
        **{option.name: (tf.as_dtype(option.kind.served_dtype), [None] * option.kind.served_rank) for option in OPTIONS},
    }


def test_an_omitted_option_is_the_exports_value_in_the_signature_def_and_in_the_decoding(customised):
    path = customised[0]
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    defaults = {name: tf.make_ndarray(proto) for name, proto in saved.meta_graphs[0].signature_def["options"].defaults.items()}
    assert sorted(defaults) == sorted(option.name for option in OPTIONS)  # TF Serving feeds these for omitted inputs
    for option in OPTIONS:
        if option.kind.tokenized:
            assert defaults[option.name].shape == (1, 0)
        else:  # the export's own values, not the table's
            value = EXPORTED.get(option.name, option.default)
            np.testing.assert_array_equal(defaults[option.name], np.array([value], option.kind.served_dtype), option.name)
    assert defaults["alpha"] != [OPTION["alpha"].default] and defaults["no_repeat_ngram_size"] != [OPTION["no_repeat_ngram_size"].default]
    # Omitted: the export's decoding, serving_default's translations, not the table's decoding.
    served, text = loaded_export(path), tf.constant(BINDING)
    best, result = served.translate(text), served.options(text)
    np.testing.assert_array_equal(result["translation"], best["translation"])
    np.testing.assert_allclose(result["score"], best["score"], **SCORE_TOLERANCE)
    assert not np.any(result["cut"])
    table = served.options(text, **_inputs({name: [OPTION[name].default] for name in EXPORTED}))
    assert np.any(table["translation"].numpy() != result["translation"].numpy())
    # The score signature's alpha, omitted: the export's.
    scored = served.score(text, best["translation"])
    penalties = [_length_penalty(length, EXPORTED["alpha"]) for length in scored["length"].numpy().tolist()]
    np.testing.assert_allclose(scored["score"], scored["log_prob"].numpy() / penalties, rtol=1e-5)


def test_each_option_alone_where_it_binds_decodes_as_the_library(customised):
    """One request per option of ALONE (with its companion): the library's output with the
    export's decoding and the request's values, and not the same request's output without the
    option. The library decodes all requests' sentences in one batch, each with its values."""
    path, model, run = customised
    served, text = loaded_export(path), tf.constant(BINDING)
    tokenizer = run.load_tokenizer()
    results, rows = {}, []
    for option, values in ALONE.items():
        results[option] = served.options(text, **_inputs({name: [value] for name, value in values.items()}))
        without = served.options(text, **_inputs({name: [value] for name, value in values.items() if name != option}))
        assert np.any(results[option]["translation"].numpy() != without["translation"].numpy()), f"{option} changed nothing"
        rows += [{**{o.name: EXPORTED.get(o.name, o.default) for o in OPTIONS}, **values}] * len(BINDING)
    source_ids, was_cut = cut(tokenizer.encode_source(tf.constant(BINDING * len(ALONE))).to_tensor(),
                              np.array([row["max_input_length"] for row in rows]))  # fmt: skip
    phrases = tokenizer.target.tokenize(tf.constant([(row["suppress_sequences"] or [""])[0] for row in rows])).to_tensor()
    settings = DecodingSettings(**{o.name: np.array([row[o.name] for row in rows], o.kind.dtype) for o in OPTIONS
                                   if o.name not in ("suppress_sequences", "max_input_length")},
                                suppress_sequences=phrases[:, None])  # fmt: skip
    longest = int(model.config.max_length * DecodingSettings.max_length_a) + DecodingSettings.max_length_b
    expected = decode(model, source_ids, settings, width=4, max_length=longest)
    translations, scores, was_cut = tokenizer.target.detokenize(expected.tokens).numpy(), np.asarray(expected.scores), np.asarray(was_cut)
    for index, (option, result) in enumerate(results.items()):
        part = slice(index * len(BINDING), (index + 1) * len(BINDING))
        np.testing.assert_array_equal(result["translation"], translations[part], err_msg=option)
        np.testing.assert_allclose(result["score"], scores[part], **SCORE_TOLERANCE, err_msg=option)
        np.testing.assert_array_equal(result["cut"], was_cut[part], err_msg=option)


def test_per_sentence_options_give_what_the_library_gives_each_sentence(served, library):
    model, tokenizer = library
    text = tf.constant(SENTENCES)
    result = served.options(text, **_inputs(PER_SENTENCE))
    source_ids, was_cut = cut(tokenizer.encode_source(text).to_tensor(), np.array(PER_SENTENCE["max_input_length"]))
    suppressed = tf.reshape(tokenizer.target.tokenize(tf.reshape(tf.constant(PER_SENTENCE["suppress_sequences"]), [-1])).to_tensor(),
                            [3, 2, -1])  # fmt: skip
    values = {name: np.array(value) for name, value in PER_SENTENCE.items() if name != "suppress_sequences"}
    settings = DecodingSettings(**values, suppress_sequences=suppressed)
    longest = int(model.config.max_length * DecodingSettings.max_length_a) + DecodingSettings.max_length_b
    expected = decode(model, source_ids, settings, width=4, max_length=longest)
    np.testing.assert_array_equal(result["translation"], tokenizer.target.detokenize(expected.tokens))
    np.testing.assert_allclose(result["score"], expected.scores, **SCORE_TOLERANCE)
    np.testing.assert_array_equal(result["cut"], was_cut)
    assert result["cut"].numpy().tolist() == [False, True, False]
    translations = [t.decode() for t in result["translation"].numpy()]
    assert "Hund" not in translations[0] and "Katze" not in translations[2]
    best = [t.decode() for t in served.translate(text)["translation"].numpy()]
    assert [a != b for a, b in zip(translations, best)] == [True, True, True], (translations, best)
    # One value for every sentence.
    one = served.options(text, no_repeat_ngram_size=tf.constant([1]))
    each = served.options(text, no_repeat_ngram_size=tf.constant([1, 1, 1]))
    np.testing.assert_array_equal(one["translation"], each["translation"])


BEAM_ERROR = re.escape("beam_size must be at least 1, and at most the search width (the beam size of an export): at most 4 in this export")


def test_bad_option_values_are_invalid_arguments_that_name_the_option(served):
    text = tf.constant(SENTENCES)
    for name, value, error in (
        ("beam_size", [5], BEAM_ERROR),
        ("beam_size", [0], BEAM_ERROR),
        ("alpha", [math.nan], "alpha must be >= 0 and finite"),
        ("alpha", [-1.0], "alpha must be >= 0 and finite"),
        ("alpha", [math.inf], "alpha must be >= 0 and finite"),
        ("min_length", [2, -1, 0], "min_length must be >= 0"),
        ("repetition_penalty", [0.0], "repetition_penalty must be > 0 and finite"),
        ("repetition_penalty", [math.inf], "repetition_penalty must be > 0 and finite"),
        ("max_length_a", [math.nan], "max_length_a must be >= 0 and finite"),
        ("max_length_a", [math.inf], "max_length_a must be >= 0 and finite"),
        ("no_repeat_ngram_size", [1, 2], r"no_repeat_ngram_size must hold one value per sentence of text \(or one for all\)"),
    ):
        with pytest.raises(tf.errors.InvalidArgumentError, match=error):
            served.options(text, **_inputs({name: value}))


def test_a_source_longer_than_the_limit_is_cut_never_refused_and_the_response_says_so(served):
    text = tf.constant(["word " * 20000, SENTENCES[0], SENTENCES[1]])
    result = served.options(text, max_input_length=tf.constant([0, 3, 0]))
    assert result["cut"].numpy().tolist() == [True, True, False]  # the model's limit, the request's, none
    assert all(len(t) > 0 for t in result["translation"].numpy()[:2])


def test_a_phrase_longer_than_any_output_costs_nothing_and_changes_nothing(served, library):
    """Each value a request may send costs at most what the largest that can change the output
    does: a phrase of more pieces than the longest output becomes padding before the search (its
    pieces never reach a step), and the translation is the one without it."""
    from export.serving import Translator

    model, tokenizer = library
    translator = Translator(model, tokenizer, languages={"de": ""})
    phrases = tf.constant([["Hund " * 2000, "Hund"], ["rote", ""]])
    pieces = translator._pieces_of_phrases(phrases).numpy()  # [2, 2, pieces]
    assert pieces.shape[2] <= translator.longest_output and not pieces[0, 0].any()
    np.testing.assert_array_equal(pieces[:, 1:], translator._pieces_of_phrases(phrases[:, 1:]).numpy())
    text = tf.constant(SENTENCES[:2])
    with_long = served.options(text, suppress_sequences=phrases)["translation"].numpy()
    np.testing.assert_array_equal(with_long, served.options(text, suppress_sequences=phrases[:, 1:])["translation"].numpy())


def _full_forward_log_probs(model, source_ids, target_ids):
    """Each target token's log-probability by one teacher-forced pass, log-softmax in NumPy over
    every token but padding (which is never generated)."""
    inputs = np.concatenate([np.full((len(target_ids), 1), BOS_ID), target_ids[:, :-1]], axis=1)
    logits = np.asarray(model((source_ids, inputs)), "float64")[..., 1:]
    top = logits.max(-1, keepdims=True)
    log_probs = logits - top - np.log(np.sum(np.exp(logits - top), -1, keepdims=True))
    return [[log_probs[row, i, t - 1] for i, t in enumerate(target) if t != PAD_ID] for row, target in enumerate(target_ids)]


def test_score_is_a_full_forward_pass_and_equals_the_searchs_own_score(served, library):
    model, tokenizer = library
    text = tf.constant(SENTENCES)
    best = served.translate(text)
    result = {key: value.numpy() for key, value in served.score(text, best["translation"]).items()}
    # The search's own score of its translation (each ended with the end of sentence).
    np.testing.assert_allclose(result["score"], best["score"].numpy(), rtol=1e-4)
    source_ids = tokenizer.encode_source(text).to_tensor().numpy()
    targets = ["Der Hund sieht das Auto.", "Ich denke.", "Die Katze folgt einem Pferd und einem Hund."]
    scored = {key: value.numpy() for key, value in served.score(text, tf.constant(targets), alpha=tf.constant([0.0])).items()}
    target_ids = tokenizer.target.encode(tf.constant(targets)).to_tensor().numpy()
    expected = _full_forward_log_probs(model, source_ids, target_ids)
    for row, tokens in enumerate(expected):
        assert scored["length"][row] == len(tokens) == np.sum(target_ids[row] != PAD_ID)
        np.testing.assert_allclose(scored["token_log_probs"][row, : len(tokens)], tokens, rtol=1e-4, atol=1e-5)
        assert np.all(scored["token_log_probs"][row, len(tokens) :] == 0)
        np.testing.assert_allclose(scored["log_prob"][row], sum(tokens), rtol=1e-4)
    np.testing.assert_allclose(scored["score"], scored["log_prob"], rtol=1e-6)  # alpha 0: no length penalty
    alpha = [0.6, 1.0, 2.0]
    penalised = served.score(text, tf.constant(targets), alpha=tf.constant(alpha))["score"].numpy()
    penalties = [_length_penalty(length, a) for length, a in zip(scored["length"].tolist(), alpha)]  # GNMT's, written out
    np.testing.assert_allclose(penalised, scored["log_prob"] / penalties, rtol=1e-5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="target must hold one value per sentence of text"):
        served.score(text, tf.constant(targets[:2]))


def test_translate_command_line_takes_each_option_and_scores_a_file(artifacts, tmp_path, capsys, monkeypatch):
    from export import translate

    monkeypatch.setattr(translate, "use_serving_threads", lambda: None)  # set at a process' start: this one has begun

    def run(*arguments):
        capsys.readouterr()
        translate.main([str(argument) for argument in arguments])
        return capsys.readouterr()

    export = artifacts.exports[4]
    served = loaded_export(export)
    monkeypatch.setattr(tf.saved_model, "load", loaded_export)  # translate.main's load: this one
    printed = run(export, *SENTENCES, "--no-repeat-ngram-size", 1, "--disable-unk", "--suppress-sequences", "Hund",
                  "--max-input-length", 6)  # fmt: skip
    expected = served.options(tf.constant(SENTENCES), no_repeat_ngram_size=tf.constant([1]), disable_unk=tf.constant([True]),
                              suppress_sequences=tf.constant([["Hund"]]), max_input_length=tf.constant([6]))  # fmt: skip
    assert printed.out.splitlines() == [t.decode() for t in expected["translation"].numpy()]
    assert printed.err.splitlines() == [f"sentence {i + 1}: its source was cut" for i in np.flatnonzero(expected["cut"])]
    targets = tmp_path / "targets.txt"
    targets.write_text("Der Hund.\nIch denke.\nDie Katze.\n", encoding="utf-8")
    lines = [line.split("\t") for line in run(export, *SENTENCES, "--score", targets).out.splitlines()]
    scored = served.score(tf.constant(SENTENCES), tf.constant(["Der Hund.", "Ich denke.", "Die Katze."]))
    np.testing.assert_allclose([float(score) for score, _, _ in lines], scored["score"].numpy(), atol=1e-4)
    for (_, log_prob, tokens), length, row in zip(lines, scored["length"].numpy(), scored["token_log_probs"].numpy()):
        np.testing.assert_allclose([float(t) for t in tokens.split()], row[:length], atol=1e-4)
        np.testing.assert_allclose(float(log_prob), row.sum(), atol=1e-3)
    for arguments, error in (
        ([export, "x", "--score", targets], "has 3 lines for 1 sentences"),
        ([export, "x", "--n-best", "2", "--min-length", "3"], "decoding options apply to plain translations"),
    ):
        with pytest.raises(SystemExit, match=error):
            translate.main([str(a) for a in arguments])
