import json
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import op_def_registry

from export.__main__ import export
from training.evaluate import make_translator
from training.run_folder import RunFolder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTENCES = [
    "Yesterday the small dog saw the red car.",
    "I think that my friends help the old teacher in the park.",
    "The cat follows a horse.",
]
BAD_INPUTS = ["", "   \t ", "word " * 20000, "bytes \xff\xfe that are not UTF-8", "日本語のテキスト"]


# Every test here exports the shared trained run (conftest's cli_run).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(cli_run):
    return str(cli_run)


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("exports"))
    return {beam: export(run_dir, base, beam_size=beam, version=beam) for beam in (1, 4)}


def _project_translations(run_dir, beam_size, sentences):
    run = RunFolder(run_dir)
    model, _ = run.load_model()
    translate = make_translator(model, run.load_tokenizer(), beam_size=beam_size, jit_compile=False)
    return translate(sentences)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_process_with_only_tensorflow_and_tf_text_translates_like_the_project(beam_size, run_dir, exported, tmp_path):
    script = (
        "import json, sys\n"
        "import tensorflow as tf\n"
        "import tensorflow_text  # the SentencePiece ops\n"
        "loaded = tf.saved_model.load(sys.argv[1])\n"
        "result = loaded.translate(tf.constant(json.loads(sys.argv[2])))\n"
        "assert not any(name.split('.')[0] in ('keras_transformer', 'training', 'export') for name in sys.modules)\n"
        "print(json.dumps([[t.decode() for t in result['translation'].numpy()], result['score'].numpy().tolist()]))\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    output = subprocess.run(
        [sys.executable, "-c", script, exported[beam_size], json.dumps(SENTENCES)],
        check=True, capture_output=True, text=True, cwd=tmp_path, env=env,
    ).stdout  # fmt: skip
    translations, scores = json.loads(output.splitlines()[-1])
    expected_translations, expected_scores = _project_translations(run_dir, beam_size, SENTENCES)
    assert translations == expected_translations
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-4)


def test_the_signature_and_assets(exported):
    loaded = tf.saved_model.load(exported[4])
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


def test_saved_model_cli_shows_the_signature_and_runs_it(exported):
    shown = subprocess.run(
        ["saved_model_cli", "show", "--dir", exported[4], "--tag_set", "serve", "--signature_def", "serving_default"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert "inputs['text'] tensor_info:\n      dtype: DT_STRING\n      shape: (-1)" in shown
    assert "outputs['translation'] tensor_info:\n      dtype: DT_STRING" in shown
    assert "outputs['score'] tensor_info:\n      dtype: DT_FLOAT" in shown
    # saved_model_cli with tensorflow-text's ops registered, as TF Serving's binary has them.
    cli = "import sys, tensorflow_text; from tensorflow.python.tools import saved_model_cli; sys.exit(saved_model_cli.main())"
    ran = subprocess.run(
        [sys.executable, "-c", cli, "run", "--dir", exported[4], "--tag_set", "serve", "--signature_def",
         "serving_default", "--input_exprs", f"text={json.dumps(SENTENCES[:1])}"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    loaded = tf.saved_model.load(exported[4])
    translation = loaded.translate(tf.constant(SENTENCES[:1]))["translation"].numpy()[0]
    assert f"Result for output key translation:\n[{translation!r}]" in ran


def _predict(signature, inputs):
    """What TF Serving does with a request: match inputs to the signature by name, dtype, shape."""
    specs = signature.structured_input_signature[1]
    assert set(inputs) == set(specs)
    tensors = {}
    for name, value in inputs.items():
        tensor = tf.convert_to_tensor(value, specs[name].dtype)
        assert specs[name].shape.is_compatible_with(tensor.shape)
        tensors[name] = tensor
    return {name: value.numpy().tolist() for name, value in signature(**tensors).items()}


def test_tf_serving_rest_and_grpc_requests_map_onto_the_signature(exported):
    from tensorflow_serving.apis import predict_pb2

    loaded = tf.saved_model.load(exported[4])  # keep it: the signature needs its variables
    signature = loaded.signatures["serving_default"]
    # REST, row format: each instance is one value of the only input.
    rows = json.loads(json.dumps({"instances": SENTENCES}))
    by_rows = _predict(signature, {"text": rows["instances"]})
    # REST, column format: named inputs.
    columns = json.loads(json.dumps({"inputs": {"text": SENTENCES}}))
    by_columns = _predict(signature, columns["inputs"])
    # gRPC: a PredictRequest with a string TensorProto.
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "translator", "serving_default"
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(SENTENCES, dtype=tf.string))
    request = predict_pb2.PredictRequest.FromString(request.SerializeToString())
    by_grpc = _predict(signature, {name: tf.make_ndarray(proto) for name, proto in request.inputs.items()})
    assert by_rows == by_columns == by_grpc
    assert len(by_rows["translation"]) == len(by_rows["score"]) == 3


def test_every_op_is_registered_by_tensorflow_or_tf_text_and_none_is_xla(exported):
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(exported[4], "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    graph = saved_model.meta_graphs[0].graph_def
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops |= {node.op for node in function.node_def}
        assert not function.attr["_XlaMustCompile"].b, function.signature.name
    defined = {function.signature.name for function in graph.library.function}
    unregistered = {op for op in ops - defined if op_def_registry.get(op) is None}
    assert not unregistered
    assert "SentencepieceOp" in ops and not {op for op in ops if op.startswith("Xla")}


def test_bad_inputs_each_get_a_result(exported):
    loaded = tf.saved_model.load(exported[4])
    texts = [t.encode("latin-1") if "\xff" in t else t.encode() for t in BAD_INPUTS]
    result = loaded.translate(tf.constant(texts))
    assert result["translation"].shape == result["score"].shape == (len(BAD_INPUTS),)
    assert np.all(np.isfinite(result["score"].numpy()))
    empty = loaded.translate(tf.constant([], tf.string))
    assert empty["translation"].shape == (0,)
    mixed = [SENTENCES[i % 3] * (1 + i % 7) for i in range(256)]
    assert loaded.translate(tf.constant(mixed))["translation"].shape == (256,)


def test_tfsm_layer_inside_another_keras_model(exported):
    text = keras.Input(shape=(), dtype="string")
    outputs = keras.layers.TFSMLayer(exported[1], call_endpoint="serving_default")(text)
    model = keras.Model(text, outputs["translation"])
    translations = model(tf.constant(SENTENCES))
    loaded = tf.saved_model.load(exported[1])
    expected = loaded.translate(tf.constant(SENTENCES))["translation"]
    np.testing.assert_array_equal(translations, expected)


@pytest.mark.slow
def test_an_interrupted_export_leaves_no_version(run_dir, tmp_path):
    base = tmp_path / "exports"
    process = subprocess.Popen(
        [sys.executable, "-m", "export", "--run-dir", run_dir, "--out", str(base), "--version", "7"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 300
    while not (base.exists() and any(name.startswith(".export-") for name in os.listdir(base))):
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (base / "7").exists()
    assert export(run_dir, str(base)) == str(base / "1")  # hidden leftovers do not count as versions
