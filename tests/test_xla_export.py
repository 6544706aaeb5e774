"""`python -m export --xla` (export/xla.py): serving_default compiled by XLA for a few request
shapes, the default export's graph search for the rest. Loaded in a fresh process with only
tensorflow and tensorflow-text, as a server would: it translates as the default export does, its
warm-up compiles each compiled shape once, and no later request compiles anything."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from bench.common import with_xla_flags
from conftest import loaded_export
from export.xla import CompiledShapes

# Small shapes for the suite's model (sources of at most 24 pieces): 1 x 2 compilations (which shape
# holds a request: test_compiled_shapes_choose_the_smallest_that_holds_a_request_and_none_past_the_largest).
SHAPES = CompiledShapes(batch_sizes=(4,), source_lengths=(8, 16))

FRESH_PROCESS = """
import json, os, sys
import tensorflow as tf
import tensorflow_text  # the SentencePiece ops
from tensorflow_serving.apis import prediction_log_pb2

export_dir, dump_dir, requests = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
loaded = tf.saved_model.load(export_dir)
serve = loaded.signatures["serving_default"]
for record in tf.data.TFRecordDataset(os.path.join(export_dir, "assets.extra", "tf_serving_warmup_requests")):
    request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request  # as TF Serving does
    loaded.signatures[request.model_spec.signature_name](
        **{name: tf.constant(tf.make_ndarray(proto)) for name, proto in request.inputs.items()})
warmed_up = sorted(os.listdir(dump_dir))
results = []
for texts in requests:
    result = serve(text=tf.constant(texts))
    results.append([[t.decode() for t in result["translation"].numpy()], result["score"].numpy().tolist()])
print(json.dumps({"warmed_up": warmed_up, "later": sorted(set(os.listdir(dump_dir)) - set(warmed_up)), "results": results}))
assert not any(name.split(".")[0] in ("keras_transformer", "training", "export") for name in sys.modules)
"""


def _requests():
    """Requests of compiled shapes, of shapes between them, and of none: a source longer than the
    longest compiled one (cut at the model's 24 pieces), and more sentences than the largest
    batch."""
    import random

    from training.synthetic import sentence_pair

    rng = random.Random(3)
    sentences = [sentence_pair(rng)[0] for _ in range(40)]
    long = " ".join(sentences[:6])
    return [sentences[:1], [long], sentences[1:3], sentences[3:7], [long] + sentences[7:10], sentences[10:15], sentences]


@pytest.mark.slow
def test_the_xla_export_translates_like_the_default_and_compiles_only_in_its_warmup(artifacts, tmp_path):
    from export.saved_model import export
    from keras_transformer.search import DecodingSettings

    target = export(artifacts.tf_run, str(tmp_path / "xla"), DecodingSettings(beam_size=4), compiled_shapes=SHAPES)
    with open(os.path.join(target, "assets", "metadata.json")) as f:
        assert json.load(f)["xla"] == {"batch_sizes": [4], "source_lengths": [8, 16]}
    requests = _requests()
    dump = tmp_path / "dump"
    env = with_xla_flags({key: value for key, value in os.environ.items() if key != "PYTHONPATH"},
                         f"--xla_dump_to={dump}")  # a file set per XLA compilation
    output = subprocess.run([sys.executable, "-c", FRESH_PROCESS, target, str(dump), json.dumps(requests)], check=True,
                            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900).stdout  # fmt: skip
    served = json.loads(output.splitlines()[-1])

    # The warm-up compiled each shape once; the requests after it, of every shape, compiled nothing.
    compiled = {name.split(".")[0] for name in served["warmed_up"] if name.endswith("before_optimizations.txt")}
    assert len(compiled) == len(SHAPES.shapes), served["warmed_up"]
    assert served["later"] == []

    default = loaded_export(artifacts.exports[4]).signatures["serving_default"]
    for texts, (translations, scores) in zip(requests, served["results"], strict=True):
        expected = default(text=tf.constant(texts))
        assert translations == [t.decode() for t in expected["translation"].numpy()], texts
        np.testing.assert_allclose(scores, expected["score"].numpy(), rtol=1e-4, atol=1e-4)
    assert len(set(served["results"][-1][0])) >= 30  # translations that depend on the sentence


def test_compiled_shapes_choose_the_smallest_that_holds_a_request_and_none_past_the_largest():
    shapes = CompiledShapes(batch_sizes=(1, 2, 8), source_lengths=(16, 32))
    index = lambda batch, length: int(shapes.index(tf.constant(batch), tf.constant(length)))  # noqa: E731
    assert [shapes.shapes[index(b, n)] for b, n in [(1, 1), (1, 16), (1, 17), (2, 30), (3, 32), (8, 5)]] == [
        (1, 16), (1, 16), (1, 32), (2, 32), (8, 32), (8, 16)]  # fmt: skip
    assert index(9, 5) == index(1, 33) == -1
    with pytest.raises(ValueError, match="ascending"):
        CompiledShapes(batch_sizes=(4, 1))


def test_source_lengths_past_the_models_cut_give_way_to_it():
    shapes = CompiledShapes(batch_sizes=(1, 2), source_lengths=(16, 32, 48, 64))
    assert shapes.within(24).source_lengths == (16, 24)  # sources are cut at 24: 32-64 would never run
    assert shapes.within(8).source_lengths == (8,)
    assert shapes.within(64) == shapes.within(256) == shapes
    assert shapes.within(24).batch_sizes == (1, 2)
