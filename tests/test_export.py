import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import SAVED_MODEL_CLI, SCORE_TOLERANCE, _types_of, assert_stock_cpu_graph, loaded_export, warmup_requests
from export.serving import PARALLEL_SEARCHES
from export.signatures import SIGNATURE, SIGNATURES
from keras_transformer.search import DecodingSettings
from training.evaluate import make_translator
from training.run_folder import RunFolder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTENCES = [
    "Yesterday the small dog saw the red car.",
    "I think that my friends help the old teacher in the park.",
    "The cat follows a horse.",
]
CHOICES = {"target_languages": ["de"]}  # what the suite's exports (of one pair) offer to pick (`Input.choices`)
BAD_INPUTS = ["", "   \t ", "word " * 20000, "bytes \xff\xfe that are not UTF-8", "日本語のテキスト"]


# Every test here reads the suite's shared run and its exports (tests/artifacts.py).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(artifacts):
    return artifacts.tf_run


@pytest.fixture(scope="module")
def exported(artifacts):
    """{1: greedy, 4: beam 4, "bfloat16", "float16": beam 4 in those precisions}: version folders."""
    return artifacts.exports


def _project_translations(run_dir, beam_size, sentences):
    run = RunFolder(run_dir)
    model, _ = run.load_model()
    translate = make_translator(model, run.load_tokenizer(), DecodingSettings(beam_size=beam_size), jit_compile=False)
    return translate(sentences)


def _sentences():
    """SENTENCES and 45 more of the built-in corpus' kind."""
    import random

    from training.synthetic import sentence_pair

    rng = random.Random(1)
    return SENTENCES + [sentence_pair(rng)[0] for _ in range(45)]


def test_a_fresh_process_with_only_tensorflow_and_tf_text_and_no_onednn_translates_like_the_project(run_dir, exported,
                                                                                                    tmp_path):  # fmt: skip
    """Every export, loaded where only stock TensorFlow kernels run (oneDNN off), as a server
    would: the float32 ones translate as the project's search, the bfloat16 and float16 ones as
    float32 on most sentences."""
    versions = [1, 4, "bfloat16", "float16"]
    sentences = _sentences()
    script = (
        "import json, sys\n"
        "import tensorflow as tf\n"
        "import tensorflow_text  # the SentencePiece ops\n"
        "for path in sys.argv[2:]:\n"
        "    loaded = tf.saved_model.load(path)\n"
        "    result = loaded.translate(tf.constant(json.loads(sys.argv[1])))\n"
        "    print(json.dumps([[t.decode() for t in result['translation'].numpy()], result['score'].numpy().tolist()]))\n"
        "assert not any(name.split('.')[0] in ('keras_transformer', 'training', 'export') for name in sys.modules)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    output = subprocess.run(
        [sys.executable, "-c", script, json.dumps(sentences), *(exported[version] for version in versions)],
        check=True, capture_output=True, text=True, cwd=tmp_path, env={**env, "TF_ENABLE_ONEDNN_OPTS": "0"}, timeout=600,
    ).stdout  # fmt: skip
    served = dict(zip(versions, (json.loads(line) for line in output.splitlines()[-len(versions) :]), strict=True))
    for beam_size in (1, 4):
        translations, scores = served[beam_size]
        expected_translations, expected_scores = _project_translations(run_dir, beam_size, sentences)
        assert translations == expected_translations, beam_size
        np.testing.assert_allclose(scores, expected_scores, rtol=1e-4, err_msg=str(beam_size))
    # The model's translations and scores depend on the sentence: agreement below is not that of a constant.
    assert len(set(served[4][0])) >= len(sentences) * 3 // 4, served[4][0]
    assert len(set(np.round(served[4][1], 3))) >= len(sentences) // 2, served[4][1]
    full_translations, full_scores = map(np.array, served[4])
    # 8 (bfloat16) or 11 (float16) bits of mantissa, about 0.4% or 0.05% an op; a score sums a
    # sentence's log-probabilities. Measured on these sentences over seven models of the recipe
    # (--seed 0 to 6), loaded as here: scores up to 2.4-6.2% apart (bfloat16) and 0.2-0.4%
    # (float16), translations the same on 96-100%. The bounds are twice the largest or more.
    for precision, rtol in (("bfloat16", 0.12), ("float16", 0.01)):
        translations, scores = map(np.array, served[precision])
        same = translations == full_translations
        # Where two continuations are close, the search may take the other.
        assert np.mean(same) >= 0.8, (precision, np.mean(same))
        np.testing.assert_allclose(scores[same], full_scores[same], rtol=rtol, err_msg=precision)


def test_the_signature_and_assets(exported):
    loaded = loaded_export(exported[4])
    signature = loaded.signatures["serving_default"]
    (spec,) = signature.structured_input_signature[1].values()
    assert (spec.name, spec.dtype, spec.shape.as_list()) == ("text", tf.string, [None])
    outputs = signature.structured_outputs
    assert (outputs["translation"].dtype, outputs["score"].dtype) == (tf.string, tf.float32)
    assert outputs["translation"].shape.as_list() == outputs["score"].shape.as_list() == [None]
    assets = sorted(os.listdir(os.path.join(exported[4], "assets")))
    assert assets == ["config.json", "metadata.json", "sentencepiece.model"]
    with open(os.path.join(exported[4], "assets", "metadata.json")) as f:
        metadata = json.load(f)
    assert (metadata["source_lang"], metadata["target_lang"], metadata["beam_size"], metadata["alpha"]) == ("en", "de", 4, 0.6)
    assert metadata["searches"] == PARALLEL_SEARCHES


def test_each_signature_serves_what_its_declaration_says(exported):
    loaded = loaded_export(exported[4])
    for declared in SIGNATURES:
        served = loaded.signatures[declared.name]
        inputs, outputs = served.structured_input_signature[1], served.structured_outputs
        assert {name: (spec.dtype, spec.shape.rank) for name, spec in inputs.items()} == {
            row.name: (tf.as_dtype(row.kind.served_dtype), row.kind.served_rank) for row in declared.served_inputs(CHOICES)}
        assert {name: (spec.dtype, spec.shape.rank) for name, spec in outputs.items()} == {
            output.name: (tf.as_dtype(output.dtype), output.rank) for output in declared.outputs}
        assert callable(getattr(loaded, declared.method))



def _signature_defs(export_dir):
    """Each SignatureDef of the SavedModel in `export_dir` as lines: every input's and output's
    name, dtype and shape, and an input's default (what TF Serving feeds when a request omits it)."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    described = {}
    for name, signature in sorted(saved.meta_graphs[0].signature_def.items()):
        if name.startswith("__"):  # __saved_model_init_op: TensorFlow's, not a request's
            continue
        for way, tensors in (("input", signature.inputs), ("output", signature.outputs)):
            for key, tensor in sorted(tensors.items()):
                line = f"{way} {key}: {tf.as_dtype(tensor.dtype).name} {[d.size for d in tensor.tensor_shape.dim]}"
                if way == "input" and key in signature.defaults:
                    value = tf.make_ndarray(signature.defaults[key])
                    line += f", default {list(value.shape)} {value}"
                described.setdefault(name, []).append(line)
    return described


def test_every_signature_def_is_as_recorded_for_existing_clients_and_warmup_files(exported):
    """tests/signature_defs.json holds the SignatureDefs of an export with the default decoding
    (written by this function): a change to a served input's name, dtype, shape or default, which
    clients and their warm-up files depend on, has to change that file too. A new signature has
    no clients yet: it may be served beside them."""
    with open(os.path.join(ROOT, "tests", "signature_defs.json"), encoding="utf-8") as f:
        recorded = json.load(f)
    served = _signature_defs(exported[4])
    assert {name: served.get(name) for name in recorded} == recorded
    assert "input beam_size: int32 [-1], default [1] [4]" in recorded["options"]  # the check reads defaults


def test_saved_model_cli_shows_the_signature_and_runs_it(exported):
    shown = subprocess.run(
        [*SAVED_MODEL_CLI, "show", "--dir", exported[4], "--tag_set", "serve", "--signature_def", "serving_default"],
        check=True, capture_output=True, text=True, timeout=300,
    ).stdout  # fmt: skip
    assert "inputs['text'] tensor_info:\n      dtype: DT_STRING\n      shape: (-1)" in shown
    assert "outputs['translation'] tensor_info:\n      dtype: DT_STRING" in shown
    assert "outputs['score'] tensor_info:\n      dtype: DT_FLOAT" in shown
    ran = subprocess.run(
        [*SAVED_MODEL_CLI, "run", "--dir", exported[4], "--tag_set", "serve", "--signature_def",
         "serving_default", "--input_exprs", f"text={json.dumps(SENTENCES[:1])}"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    loaded = loaded_export(exported[4])
    translation = loaded.translate(tf.constant(SENTENCES[:1]))["translation"].numpy()[0]
    assert f"Result for output key translation:\n[{translation!r}]" in ran


def _rest_body_through_signature(signature, body):
    """The conversion TF Serving's REST predict API makes, around a call of `signature`, with its
    rules: a JSON request body (`instances`, the row format, or `inputs`, the column format) to
    the signature's named tensors, and its outputs to the JSON response body (`predictions`
    rows, or `outputs` columns). Not a server: what it checks is that the signature's names,
    dtypes and shapes fit those body formats. A body the server refuses raises ValueError."""
    request = json.loads(body)
    specs = signature.structured_input_signature[1]
    if "instances" in request:  # each instance is one value of each input: bare with one input, else {name: value}
        rows = request["instances"]
        named = {isinstance(row, dict) for row in rows}
        if named == {True, False} or (len(specs) > 1 and False in named):
            raise ValueError("instances must all be objects naming the inputs (or, with one input, all bare values)")
        if True in named and any(set(row) != set(specs) for row in rows):
            raise ValueError(f"each instance must name every input: {sorted(specs)}")
        values = {name: [row[name] if isinstance(row, dict) else row for row in rows] for name in specs}
    else:  # one value (a list for a batch) per input: bare with one input, else {name: value}
        columns = request["inputs"]
        values = columns if isinstance(columns, dict) else {next(iter(specs)): columns}
        if set(values) != set(specs):
            raise ValueError(f"inputs must name every input: {sorted(specs)}")
    called = signature(**{name: tf.constant(values[name], spec.dtype) for name, spec in specs.items()})
    outputs = {key: _decoded(value.numpy().tolist()) for key, value in called.items()}
    if "instances" not in request:
        return json.dumps({"outputs": outputs})
    # A row holds the row-th value of every output: all outputs must have the batch's size.
    expected = len(next(iter(outputs.values())))
    for key, value in outputs.items():
        if len(value) != expected:
            raise ValueError(f"Tensor name: {key} has inconsistent batch size: {len(value)} expecting: {expected}")
    return json.dumps({"predictions": [dict(zip(outputs, row)) for row in zip(*outputs.values())]})


def _decoded(value):
    """A tensor's `tolist()` with its bytes read as UTF-8 (JSON has no bytes)."""
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    return value.decode() if isinstance(value, bytes) else value


def _grpc_body_through_signature(signature, signature_name, serialized_request):
    """The conversion TF Serving's gRPC Predict makes, around a call of `signature` (named
    `signature_name`): a serialized PredictRequest's TensorProtos to the signature's tensors, its
    outputs to a serialized PredictResponse. Not a server (as `_rest_body_through_signature`)."""
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest.FromString(serialized_request)
    assert request.model_spec.signature_name == signature_name
    specs = signature.structured_input_signature[1]
    if set(request.inputs) != set(specs):
        raise ValueError(f"the request's inputs {sorted(request.inputs)} are not the signature's {sorted(specs)}")
    inputs = {name: tf.constant(tf.make_ndarray(proto)) for name, proto in request.inputs.items()}
    response = predict_pb2.PredictResponse()
    for name, value in signature(**inputs).items():
        response.outputs[name].CopyFrom(tf.make_tensor_proto(value))
    return response.SerializeToString()


def _served(function, folder, **specs):
    """`function` with named inputs `specs`, as a SavedModel serves it: its signature, loaded."""
    module = tf.Module()
    module.function = tf.function(function)
    tf.saved_model.save(module, str(folder), signatures=module.function.get_concrete_function(**specs))
    module = tf.saved_model.load(str(folder))
    return module.signatures["serving_default"], module  # the module: the signature needs it alive


def test_the_body_converters_refuse_what_tf_serving_refuses(tmp_path):
    strings, ints = tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int32)
    # An output whose first dimension is not the batch's.
    signature, _module = _served(lambda text: {"echo": text, "first": text[:1]}, tmp_path / "uneven", text=strings)
    assert json.loads(_rest_body_through_signature(signature, json.dumps({"inputs": ["a", "b"]})))["outputs"]["first"] == ["a"]
    with pytest.raises(ValueError, match=r"Tensor name: (first|echo) has inconsistent batch size: (1|2) expecting: (2|1)"):
        _rest_body_through_signature(signature, json.dumps({"instances": ["a", "b"]}))

    signature, _module = _served(lambda text, n: {"text": text, "n": n}, tmp_path / "two", text=strings, n=ints)
    assert json.loads(_rest_body_through_signature(signature, json.dumps({"instances": [{"text": "a", "n": 1}]})))
    for bad in ({"instances": [{"text": "a", "n": 1}, "b"]}, {"instances": ["a"]}, {"instances": [{"text": "a"}]},
                {"inputs": {"text": ["a"]}}):  # fmt: skip
        with pytest.raises(ValueError):
            _rest_body_through_signature(signature, json.dumps(bad))


def _requests():
    """One request of each signature: {signature name: {input name: a list, one value a sentence}};
    one not written here has its warm-up request's inputs (its declaration's) for SENTENCES."""
    written = {
        "serving_default": {"text": SENTENCES},
        "n_best": {"text": SENTENCES, "n": [2, 3, 1]},
        "alignments": {"text": SENTENCES},
        "prefix": {"text": SENTENCES, "prefix": ["Der", "", "Die Katze"]},
        "sample": {"text": SENTENCES, "samples": [2, 1, 3], "temperature": [1.0, 1.5, 0.8], "top_k": [0, 5, 0],
                   "top_p": [1.0, 0.9, 0.95], "seed": [0, 1, 2]},
        "options": {"text": SENTENCES, "beam_size": [4, 1, 2], "alpha": [0.6, 0.0, 1.0], "max_length_a": [1.0, 1.0, 0.5],
                    "max_length_b": [50, 50, 4], "min_length": [0, 5, 0], "no_repeat_ngram_size": [1, 0, 2],
                    "repetition_penalty": [1.0, 2.0, 1.0], "disable_unk": [True, False, True],
                    "suppress_sequences": [["Hund", ""], ["", ""], ["Katze", "rote"]], "max_input_length": [0, 6, 0]},
        "score": {"text": SENTENCES, "target": ["Der Hund.", "Ich denke.", "Die Katze."], "alpha": [0.6, 0.0, 1.0]},
    }  # fmt: skip
    warmup = {s.name: s.warmup(np.array(SENTENCES), DecodingSettings(), CHOICES) for s in SIGNATURES if s.name not in written}
    return {**written, **{name: {key: value.tolist() for key, value in inputs.items()} for name, inputs in warmup.items()}}


def _call(signature, inputs):
    specs = signature.structured_input_signature[1]
    return signature(**{key: tf.constant(value, specs[key].dtype) for key, value in inputs.items()})


def test_rest_and_grpc_bodies_of_every_signature_convert_to_the_signature_and_back(exported):
    from tensorflow_serving.apis import predict_pb2

    loaded = loaded_export(exported[4])
    assert set(loaded.signatures) == set(_requests())
    for name, inputs in _requests().items():
        signature = loaded.signatures[name]
        called = _call(signature, inputs)
        expected = {key: _decoded(value.numpy().tolist()) for key, value in called.items()}
        if name == "alignments":
            assert np.asarray(expected["attention"]).ndim == 3
        rows = [dict(zip(inputs, row)) for row in zip(*inputs.values())]
        predictions = [dict(zip(expected, row)) for row in zip(*expected.values(), strict=True)]
        assert json.loads(_rest_body_through_signature(signature, json.dumps({"instances": rows}))) == {"predictions": predictions}
        assert json.loads(_rest_body_through_signature(signature, json.dumps({"inputs": inputs}))) == {"outputs": expected}
        if len(inputs) == 1:  # one input: bare values in both formats
            (values,) = inputs.values()
            bare = json.loads(_rest_body_through_signature(signature, json.dumps({"instances": values})))
            assert bare == {"predictions": predictions}
            assert json.loads(_rest_body_through_signature(signature, json.dumps({"inputs": values}))) == {"outputs": expected}

        request = predict_pb2.PredictRequest()
        request.model_spec.name, request.model_spec.signature_name = "translator", name
        specs = signature.structured_input_signature[1]
        for key, value in inputs.items():
            request.inputs[key].CopyFrom(tf.make_tensor_proto(value, dtype=specs[key].dtype))
        response = predict_pb2.PredictResponse.FromString(_grpc_body_through_signature(signature, name, request.SerializeToString()))
        assert set(response.outputs) == set(expected)
        for key, value in called.items():
            np.testing.assert_array_equal(tf.make_ndarray(response.outputs[key]), value.numpy(), err_msg=f"{name} {key}")


@pytest.mark.parametrize("name, option", [("n_best", "n"), ("sample", "samples")])
def test_server_side_batching_merges_requests_of_different_list_lengths(exported, name, option):
    """TF Serving's batching concatenates the inputs of several requests along the first
    dimension, runs the signature once and splits every output the same way: each request gets
    its own rows, as wide as the longest list among those merged, the rest padded."""
    loaded = loaded_export(exported[4])
    signature = loaded.signatures[name]
    whole = _requests()[name]
    requests = [{key: value[:2] for key, value in whole.items()}, {key: value[2:] for key, value in whole.items()}]
    requests[0][option], requests[1][option] = [1, 1], [3]

    def call(inputs):
        return {key: value.numpy() for key, value in _call(signature, inputs).items()}

    merged = call({key: requests[0][key] + requests[1][key] for key in whole})
    assert all(value.shape[0] == len(whole["text"]) for value in merged.values())
    start = 0
    for inputs in requests:
        alone, rows, width = call(inputs), len(inputs["text"]), max(inputs[option])
        for key, value in merged.items():
            mine = value[start : start + rows]
            if key == "translations":
                np.testing.assert_array_equal(mine[:, :width], alone[key])
            else:  # other rows beside it: float noise
                np.testing.assert_allclose(mine[:, :width], alone[key], **SCORE_TOLERANCE, err_msg=key)
            assert np.all(mine[:, width:] == (b"" if key == "translations" else -1e9)), key
        start += rows


@pytest.mark.parametrize("version", [4, 1])  # the greedy export's beam_size is cut to 1
def test_the_warmup_requests_are_prediction_logs_the_signatures_accept(exported, version):
    loaded = loaded_export(exported[version])
    requests = []
    for name, inputs in warmup_requests(exported[version]):
        result = loaded.signatures[name](**inputs)
        batch = len(inputs[SIGNATURE[name].inputs[0].name])  # the first input gives the batch
        assert "text" not in inputs or all(len(t) > 0 for t in inputs["text"].numpy())
        assert result[SIGNATURE[name].outputs[0].name].shape[0] == batch
        requests.append((name, sorted(inputs), batch))
    # Every signature, with every input it has, at each batch size.
    expected = [(name, sorted(signature.structured_input_signature[1]), batch)
                for name, signature in loaded.signatures.items() for batch in (1, 32)]  # fmt: skip
    assert sorted(requests) == sorted(expected) and set(loaded.signatures) == {signature.name for signature in SIGNATURES}


def test_n_best_lists_start_with_the_translation_are_sorted_and_refuse_an_n_beyond_the_beam(exported):
    loaded = loaded_export(exported[4])
    signature = loaded.signatures["n_best"]
    specs = signature.structured_input_signature[1]
    assert {name: (spec.dtype, spec.shape.as_list()) for name, spec in specs.items()} == {
        "text": (tf.string, [None]), "n": (tf.int32, [None])}
    assert {key: spec.shape.as_list() for key, spec in signature.structured_outputs.items()} == {
        "translations": [None, None], "scores": [None, None]}
    best = loaded.translate(tf.constant(SENTENCES))
    lists = {n: signature(text=tf.constant(SENTENCES), n=tf.fill([len(SENTENCES)], n)) for n in (1, 2, 4)}
    for n, result in lists.items():
        assert result["translations"].shape == result["scores"].shape == (len(SENTENCES), n)
        np.testing.assert_array_equal(result["translations"][:, 0], best["translation"])
        np.testing.assert_allclose(result["scores"][:, 0], best["score"], **SCORE_TOLERANCE)
        np.testing.assert_array_equal(result["translations"], lists[4]["translations"][:, :n])
    assert np.all(np.diff(lists[4]["scores"].numpy(), axis=1) <= 0)
    assert all(len(set(row)) == 4 for row in lists[4]["translations"].numpy())
    # Each sentence its own n: as many columns as the largest, the others padded.
    mixed = signature(text=tf.constant(SENTENCES), n=tf.constant([1, 3, 2]))
    asked = np.arange(3)[None] < np.array([1, 3, 2])[:, None]
    np.testing.assert_array_equal(mixed["translations"].numpy()[asked], lists[4]["translations"].numpy()[:, :3][asked])
    assert set(mixed["translations"].numpy()[~asked]) == {b""} and np.all(mixed["scores"].numpy()[~asked] == -1e9)
    assert signature(text=tf.constant([], tf.string), n=tf.constant([], tf.int32))["translations"].shape == (0, 0)
    too_many = re.escape("n must be 1 to the beam size: at most 4 in this export")
    for bad, error in (([0, 1, 1], too_many), ([1, 5, 1], too_many),
                       ([1, 1], "n must hold one value per sentence of text")):  # fmt: skip
        with pytest.raises(tf.errors.InvalidArgumentError, match=error):
            signature(text=tf.constant(SENTENCES), n=tf.constant(bad))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Shape of tensor n .* not compatible with expected shape \[\?\]"):
        signature._call_flat([tf.constant(2), tf.constant(SENTENCES)], signature.captured_inputs)  # inputs in name order
    greedy = loaded_export(exported[1])
    one = greedy.n_best(tf.constant(SENTENCES), tf.constant([1, 1, 1]))
    np.testing.assert_array_equal(one["translations"][:, 0], greedy.translate(tf.constant(SENTENCES))["translation"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="n must be 1 to the beam size: at most 1 in this export"):
        greedy.n_best(tf.constant(SENTENCES), tf.constant([1, 2, 1]))


def test_alignments_are_the_models_attention_for_the_translation_it_serves(exported, run_dir):
    from keras_transformer.search import alignments

    loaded = loaded_export(exported[4])
    signature = loaded.signatures["alignments"]
    outputs = {key: (spec.dtype, spec.shape.as_list()) for key, spec in signature.structured_outputs.items()}
    assert outputs == {"translation": (tf.string, [None]), "score": (tf.float32, [None]),
                       "source_pieces": (tf.string, [None, None]), "source_length": (tf.int32, [None]),
                       "target_pieces": (tf.string, [None, None]), "target_length": (tf.int32, [None]),
                       "attention": (tf.float32, [None, None, None])}  # fmt: skip
    result = {key: value.numpy() for key, value in signature(text=tf.constant(SENTENCES)).items()}
    best = loaded.translate(tf.constant(SENTENCES))
    np.testing.assert_array_equal(result["translation"], best["translation"])
    np.testing.assert_allclose(result["score"], best["score"], **SCORE_TOLERANCE)
    run = RunFolder(run_dir)
    tokenizer, (model, _) = run.load_tokenizer(), run.load_model()
    source_ids = tokenizer.encode_source(tf.constant(SENTENCES)).to_tensor().numpy()
    np.testing.assert_array_equal(result["source_length"], np.sum(source_ids != 0, axis=1))
    target_ids = tokenizer.target.sentencepiece.string_to_id(tf.constant(result["target_pieces"])).numpy()
    target_ids[result["target_pieces"] == b""] = 0
    assert b"".join(result["source_pieces"][0]).decode().replace("\u2581", " ").strip() == SENTENCES[0] + "</s>"
    expected = np.asarray(alignments(model, source_ids, target_ids))  # the last layer's, as exported
    np.testing.assert_allclose(result["attention"], expected, atol=1e-5)
    for row, (source_length, target_length) in enumerate(zip(result["source_length"], result["target_length"])):
        attention = result["attention"][row]
        np.testing.assert_allclose(attention[:target_length, :source_length].sum(axis=-1), 1.0, atol=1e-5)
        assert not np.any(attention[target_length:]) and not np.any(attention[:, source_length:])
        assert set(result["source_pieces"][row, source_length:]) <= {b""} and b"" not in result["target_pieces"][row, :target_length]


def _signature_inputs(signature):
    return {name: (spec.dtype, spec.shape.as_list()) for name, spec in signature.structured_input_signature[1].items()}


def test_a_prefix_starts_the_translation_as_the_library_forces_it_and_one_too_long_is_refused(exported, run_dir):
    from keras_transformer.search import decode

    loaded = loaded_export(exported[4])
    signature = loaded.signatures["prefix"]
    assert _signature_inputs(signature) == {"text": (tf.string, [None]), "prefix": (tf.string, [None])}
    best = loaded.translate(tf.constant(SENTENCES))
    empty = signature(text=tf.constant(SENTENCES), prefix=tf.constant(["", "", ""]))
    np.testing.assert_array_equal(empty["translation"], best["translation"])
    np.testing.assert_allclose(empty["score"], best["score"], **SCORE_TOLERANCE)
    # Each sentence's own prefix, one that its best translation does not start with, or none.
    prefixes = ["Der kleine Hund", "Meine", ""]
    assert not any(t.decode().startswith(p) for t, p in zip(best["translation"].numpy()[:2], prefixes[:2]))
    result = signature(text=tf.constant(SENTENCES), prefix=tf.constant(prefixes))
    translations = [t.decode() for t in result["translation"].numpy()]
    assert all(t.startswith(p) for t, p in zip(translations, prefixes)) and translations[2] == best["translation"][2].numpy().decode()
    run = RunFolder(run_dir)
    tokenizer, (model, _) = run.load_tokenizer(), run.load_model()
    expected = decode(model, tokenizer.encode_source(tf.constant(SENTENCES)).to_tensor(), DecodingSettings(),
                      target_prefix=tokenizer.target.tokenize(tf.constant(prefixes)).to_tensor())  # fmt: skip
    np.testing.assert_array_equal(result["translation"], tokenizer.target.detokenize(expected.tokens))
    np.testing.assert_allclose(result["score"], expected.scores, **SCORE_TOLERANCE)
    # A prefix as long as the translation may be is served; one piece more is refused.
    word = next(w for w in ("dog", "the", "car", "man") if len(tokenizer.target.tokenize(w)) == 1)
    longest = signature(text=tf.constant(["a"]), prefix=tf.constant([" ".join([word] * (len(tokenizer.target.tokenize("a")) + 1 + 50))]))
    assert longest["translation"].numpy()[0].decode().split() == [word] * (len(tokenizer.target.tokenize("a")) + 1 + 50)
    for text, prefix, error in ((["a"], [" ".join([word] * 60)], "prefix has more pieces than a translation of its sentence may have"),
                                (SENTENCES, ["Ein"], "prefix must hold one value per sentence of text")):  # fmt: skip
        with pytest.raises(tf.errors.InvalidArgumentError, match=error):
            signature(text=tf.constant(text), prefix=tf.constant(prefix))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Shape of tensor prefix.* not compatible with expected shape \[\?\]"):
        signature._call_flat([tf.constant([["Ein"]]), tf.constant(["a"])], signature.captured_inputs)  # inputs in name order


def test_samples_are_drawn_as_the_library_draws_them_top_k_1_is_greedy_and_bad_options_are_refused(exported, run_dir):
    from keras_transformer.search import sample_search

    loaded = loaded_export(exported[4])
    signature = loaded.signatures["sample"]
    assert _signature_inputs(signature) == {"text": (tf.string, [None]), "samples": (tf.int32, [None]),
                                            "temperature": (tf.float32, [None]), "top_k": (tf.int32, [None]),
                                            "top_p": (tf.float32, [None]), "seed": (tf.int32, [None])}  # fmt: skip

    def sample(text=SENTENCES, samples=3, temperature=1.0, top_k=0, top_p=1.0, seed=(5, 6, 7)):
        values = dict(samples=samples, temperature=temperature, top_k=top_k, top_p=top_p)
        inputs = {name: tf.fill([len(text)], value) for name, value in values.items()}
        return {key: value.numpy() for key, value in signature(text=tf.constant(text), seed=tf.constant(seed), **inputs).items()}

    greedy_export = loaded_export(exported[1])
    greedy = greedy_export.translate(tf.constant(SENTENCES))
    top_1 = sample(top_k=1)
    for column in range(3):
        np.testing.assert_array_equal(top_1["translations"][:, column], greedy["translation"])
        np.testing.assert_allclose(top_1["scores"][:, column], greedy["score"], **SCORE_TOLERANCE)
    drawn = sample(temperature=1.5, top_p=0.95)
    np.testing.assert_array_equal(sample(temperature=1.5, top_p=0.95)["translations"], drawn["translations"])
    assert len(set(drawn["translations"].ravel())) > 4
    # As the library draws them, and a sentence's samples depend on its seed, not on its batch.
    run = RunFolder(run_dir)
    tokenizer, (model, _) = run.load_tokenizer(), run.load_model()
    expected = sample_search(model, tokenizer.encode_source(tf.constant(SENTENCES)).to_tensor(), [5, 6, 7], num_samples=3,
                             temperature=1.5, top_p=0.95)  # fmt: skip
    texts = tokenizer.target.detokenize(tf.reshape(expected.tokens, [9, -1])).numpy().reshape(3, 3)
    np.testing.assert_array_equal(drawn["translations"], texts)
    np.testing.assert_allclose(drawn["scores"], expected.scores, **SCORE_TOLERANCE)
    alone = sample(text=SENTENCES[1:2], temperature=1.5, top_p=0.95, seed=[6])
    np.testing.assert_array_equal(alone["translations"][0], drawn["translations"][1])
    # Each sentence its own count: as many columns as the largest, the others padded.
    mixed = {key: value.numpy() for key, value in signature(
        text=tf.constant(SENTENCES), samples=tf.constant([1, 3, 2]), temperature=tf.fill([3], 1.5),
        top_k=tf.fill([3], 0), top_p=tf.fill([3], 0.95), seed=tf.constant([5, 6, 7])).items()}  # fmt: skip
    asked = np.arange(3)[None] < np.array([1, 3, 2])[:, None]
    np.testing.assert_array_equal(mixed["translations"][asked], drawn["translations"][asked])
    assert set(mixed["translations"][~asked]) == {b""} and np.all(mixed["scores"][~asked] == -1e9)
    for bad, error in ((dict(samples=0), "samples must be 1 to 100"), (dict(samples=101), "samples must be 1 to 100"),
                       (dict(temperature=-1.0), "temperature must be > 0"), (dict(temperature=0.0), "temperature must be > 0"),
                       (dict(temperature=float("inf")), "temperature must be > 0 and finite"),
                       (dict(temperature=float("nan")), "temperature must be > 0 and finite"),
                       (dict(top_p=float("nan")), "top_p must be in \\(0, 1\\]"),
                       (dict(top_k=-1), "top_k must be >= 0"), (dict(top_p=0.0), "top_p must be in \\(0, 1\\]"),
                       (dict(top_p=1.5), "top_p must be in \\(0, 1\\]"),
                       (dict(seed=[1, 2]), "seed must hold one value per sentence of text")):  # fmt: skip
        with pytest.raises(tf.errors.InvalidArgumentError, match=error):
            sample(**bad)


def test_a_request_that_is_not_a_vector_of_strings_is_an_invalid_argument_naming_text(exported):
    loaded = loaded_export(exported[1])
    signature = loaded.signatures["serving_default"]
    # TF Serving's C++ runtime feeds any shape it is sent; _call_flat does too (Python callers
    # are checked against the signature before the graph runs).
    for bad in (tf.constant([["a", "b"]]), tf.constant([["a"]]), tf.constant("a")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"Shape of tensor text .* not compatible with expected shape \[\?\]"):
            signature._call_flat([bad], signature.captured_inputs)
    with pytest.raises(tf.errors.InvalidArgumentError, match="expected to be a string tensor"):
        signature._call_flat([tf.constant([1.0])], signature.captured_inputs)


@pytest.mark.parametrize("version", [1, 4, "bfloat16", "float16"])
def test_every_node_has_a_stock_cpu_kernel_for_its_dtypes_and_none_is_xla(exported, version):
    nodes = assert_stock_cpu_graph(exported[version])
    if version in ("bfloat16", "float16"):  # the test sees the reduced dtype where it is
        assert any(tf.as_dtype(version).as_datatype_enum in _types_of(a) for node in nodes if node.op in ("MatMul", "BatchMatMulV2")
                   for a in node.attr.values())  # fmt: skip


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_a_reduced_precision_export_holds_its_weights_in_that_precision_and_scores_in_float32(exported, precision):
    """(How it translates: test_a_fresh_process_with_only_tensorflow_and_tf_text_and_no_onednn_...)"""
    reduced, full = loaded_export(exported[precision]), loaded_export(exported[4])
    kernels = [v for v in reduced.model_variables if v.name.endswith("kernel:0") or "embedding" in v.name]
    assert kernels and {v.dtype for v in kernels} == {tf.as_dtype(precision)}
    assert {v.dtype for v in full.model_variables} == {tf.float32}
    with open(os.path.join(exported[precision], "assets", "metadata.json")) as f:
        assert json.load(f)["precision"] == precision
    assert reduced.translate(tf.constant(SENTENCES))["score"].dtype == tf.float32


def test_bad_inputs_get_what_the_readme_promises(exported, run_dir):
    loaded = loaded_export(exported[4])
    translate = lambda texts: loaded.translate(tf.constant(texts))  # noqa: E731
    texts = [t.encode("latin-1") if "\xff" in t else t.encode() for t in BAD_INPUTS]
    result = translate(texts)
    assert result["translation"].shape == result["score"].shape == (len(BAD_INPUTS),)
    assert np.all(np.isfinite(result["score"].numpy()))
    assert translate(tf.constant([], tf.string))["translation"].shape == (0,)

    # Bytes that are not UTF-8 are read as U+FFFD.
    replaced = translate(["bytes \ufffd\ufffd that are not UTF-8".encode()])
    assert result["translation"][3] == replaced["translation"][0]

    # A source is cut at max_length tokens (its last one the end of sentence).
    tokenizer, max_length = RunFolder(run_dir).load_tokenizer(), RunFolder(run_dir).config().max_length
    word = next(w for w in ("dog", "the", "car", "man") if len(tokenizer.target.tokenize(w)) == 1)
    cut = translate([(word + " ") * 20000, (word + " ") * (max_length - 1)])
    assert cut["translation"][0] == cut["translation"][1]
    np.testing.assert_allclose(cut["score"][0], cut["score"][1], **SCORE_TOLERANCE)
    # Outputs have at most max_length + max_length_b tokens.
    pieces = tokenizer.target.tokenize(cut["translation"]).row_lengths().numpy()
    assert np.all(pieces <= max_length + 50)


def test_translate_command_line(exported, tmp_path, capsys, monkeypatch):
    from export import translate

    monkeypatch.setattr(translate, "use_serving_threads", lambda: None)  # set at a process' start: this one has begun

    def run(*arguments):
        capsys.readouterr()
        translate.main([str(argument) for argument in arguments])
        return capsys.readouterr().out.splitlines()

    base = os.path.dirname(exported[4])  # versions 1 (greedy) and 4: the base path means the highest
    loaded = loaded_export(exported[4])
    expected = loaded.translate(tf.constant(SENTENCES))
    translations = [t.decode() for t in expected["translation"].numpy()]
    command = [sys.executable, "-m", "export.translate", base]

    as_a_user = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}  # conftest sets it
    by_arguments = subprocess.run(command + SENTENCES[:2], check=True, cwd=ROOT, capture_output=True, text=True,
                                  env=as_a_user, timeout=300)  # fmt: skip
    assert by_arguments.stdout.splitlines() == translations[:2]
    assert by_arguments.stderr == "", "TensorFlow's C++ logs leaked into a quiet command"
    monkeypatch.setattr(tf.saved_model, "load", loaded_export)  # the calls below: the load of this process

    sentences = tmp_path / "sentences.txt"
    sentences.write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    from_file = run(base, "--input-file", sentences, "--batch-size", 2, "--scores")
    assert [line.split("\t", 1)[1] for line in from_file] == translations
    np.testing.assert_allclose([float(line.split("\t")[0]) for line in from_file], expected["score"].numpy(), atol=1e-4)
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(SENTENCES)))
    assert run(base) == translations

    lines = [line.split("\t") for line in run(exported[4], *SENTENCES[:2], "--n-best", 3)]
    assert [(sentence, rank) for sentence, rank, _, _ in lines] == [(s, r) for s in "12" for r in "123"]
    expected = loaded.n_best(tf.constant(SENTENCES[:2]), tf.constant([3, 3]))
    assert [text for *_, text in lines] == [t.decode() for t in expected["translations"].numpy().ravel()]
    np.testing.assert_allclose([float(score) for _, _, score, _ in lines], expected["scores"].numpy().ravel(), atol=1e-4)
    aligned = run(exported[4], *SENTENCES, "--alignments")
    result = loaded.alignments(tf.constant(SENTENCES))
    assert [line.split("\t")[0] for line in aligned] == [t.decode() for t in result["translation"].numpy()]
    for line, source_length, target_length in zip(aligned, result["source_length"].numpy(), result["target_length"].numpy()):
        pairs = [tuple(map(int, pair.split("-"))) for pair in line.split("\t")[1].split()]
        assert [j for _, j in pairs] == list(range(target_length)) and all(0 <= i < source_length for i, _ in pairs)
    first_word = result["translation"].numpy()[0].decode().split()[0]
    prefixed = run(exported[4], *SENTENCES, "--prefix", first_word)
    expected = loaded.prefix(tf.constant(SENTENCES), tf.constant([first_word] * 3))["translation"].numpy()
    assert prefixed == [t.decode() for t in expected] and all(line.startswith(first_word) for line in prefixed)
    lines = [line.split("\t") for line in run(exported[4], *SENTENCES, "--sample", 2, "--temperature", 1.5, "--seed", 5)]
    assert [(sentence, rank) for sentence, rank, _, _ in lines] == [(s, r) for s in "123" for r in "12"]
    size = [len(SENTENCES)]
    expected = loaded.sample(tf.constant(SENTENCES), tf.fill(size, 2), tf.fill(size, 1.5), tf.fill(size, 0), tf.fill(size, 1.0),
                             tf.constant([5, 6, 7]))  # fmt: skip
    assert [text for *_, text in lines] == [t.decode() for t in expected["translations"].numpy().ravel()]

    # Bad flags end the command before the model is loaded.
    for arguments, error in (
        ([exported[4], "x", "--sample", "2", "--top-p", "1.5"], re.escape("error: --top-p must be in (0, 1]; got 1.5.")),
        ([exported[4], "x", "--sample", "101"], "error: --sample must be 1 to 100; got 101."),
        ([exported[4], "x", "--n-best", "9"], "error: --n-best must be 1 to the beam size: at most 4 in this export; got 9."),
        ([str(tmp_path / "nothing"), "x"], "is neither a SavedModel nor a base path with numbered versions"),
    ):
        with pytest.raises(SystemExit, match=error):
            translate.main(arguments)


def test_export_versions_count_up_a_clash_is_refused_and_the_checkpoint_is_recorded(exported, run_dir, tmp_path, capsys):
    from export.__main__ import main
    from export.saved_model import next_version

    base = tmp_path / "exports"  # the shared versions 1 and 4, and the new ones
    base.mkdir()
    for version in (1, 4):
        os.symlink(exported[version], base / str(version))
    export_command = ["--run-dir", run_dir, "--out", str(base)]
    for flags, error in ((["--version", "4"], f"error: {base}/4 exists already: choose another --version."),
                         (["--beam-size", "0"], "error: Decoding option beam_size must be at least 1"),
                         (["--alignment-layer", "7"], r"error: alignment_layer 7: the decoder has 2 layers \(-2 to 1\)"),
                         (["--searches", "0"], "error: --searches must be at least 1; got 0.")):  # fmt: skip
        with pytest.raises(SystemExit, match=error):  # before anything is traced
            main(export_command + flags)

    assert next_version(str(base)) == 5
    first_step, first = RunFolder(run_dir).checkpoints()[0]
    options = ["--checkpoint", first, "--beam-size", "1", "--max-length-b", "0", "--searches", "3", "--stopping", "first_k"]
    capsys.readouterr()
    main(export_command + options)
    assert capsys.readouterr().out.strip() == f"Exported to {base}/5" and next_version(str(base)) == 6
    with open(os.path.join(base, "5", "assets", "metadata.json")) as f:
        metadata = json.load(f)
    recorded = [metadata[key] for key in ("checkpoint", "beam_size", "max_length_b", "searches", "stopping")]
    assert recorded == [first, 1, 0, 3, "first_k"]
    assert first_step < RunFolder(run_dir).checkpoints()[-1][0]
    # With no extra length an output is at most as long as its source (with its end of sentence).
    tokenizer = RunFolder(run_dir).load_tokenizer()
    loaded = tf.saved_model.load(os.path.join(base, "5"))  # kept: its function needs its variables
    result = loaded.translate(tf.constant(SENTENCES))
    source_lengths = tokenizer.encode_source(tf.constant(SENTENCES)).row_lengths().numpy()
    assert np.all(tokenizer.target.tokenize(result["translation"]).row_lengths().numpy() <= source_lengths)


def test_tfsm_layer_inside_another_keras_model(exported):
    text = keras.Input(shape=(), dtype="string")
    outputs = keras.layers.TFSMLayer(exported[1], call_endpoint="serving_default")(text)
    model = keras.Model(text, outputs["translation"])
    translations = model(tf.constant(SENTENCES))
    loaded = loaded_export(exported[1])
    expected = loaded.translate(tf.constant(SENTENCES))["translation"]
    np.testing.assert_array_equal(translations, expected)


# Killed once the hidden staging folder exists (before the save), and once the SavedModel is
# complete in it but not yet renamed into place (os.rename held back until the kill).
INTERRUPTED_EXPORT = """
import os, sys, time
rename = os.rename
def held_back(source, target):
    if target.endswith(os.sep + "7"):
        open(sys.argv[3], "w").close()
        time.sleep(600)
    rename(source, target)
os.rename = held_back
from export.saved_model import export
from keras_transformer.search import DecodingSettings
export(sys.argv[1], sys.argv[2], DecodingSettings(beam_size=1), version=7)  # greedy: less to trace, the same staging
"""


@pytest.mark.parametrize("when", ["before the save", "before the rename"])
def test_an_interrupted_export_leaves_no_version(when, run_dir, tmp_path):
    base, renaming = tmp_path / "exports", tmp_path / "renaming"
    process = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_EXPORT, run_dir, str(base), str(renaming)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.time() + 300
        while not (renaming.exists() if when == "before the rename" else
                   base.exists() and any(name.startswith(".export-") for name in os.listdir(base))):  # fmt: skip
            assert process.poll() is None and time.time() < deadline
            time.sleep(0.01)
        if when == "before the rename":
            staged = [name for name in os.listdir(base) if name.startswith(".export-")]
            assert len(staged) == 1 and os.path.exists(base / staged[0] / "model" / "saved_model.pb")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    from export.saved_model import next_version

    assert not (base / "7").exists()
    assert next_version(str(base)) == 1  # hidden leftovers do not count as versions
