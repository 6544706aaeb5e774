"""The JAX training path, each check in subprocesses with KERAS_BACKEND set (this process runs
TensorFlow): the same step as TensorFlow's, data parallelism, checkpoints, and a run folder that
the TensorFlow export serves."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import ROOT, WORKER, run_under
from keras_transformer import Transformer, TransformerConfig

# Every test here starts TensorFlow or JAX processes: slow. (tests/test_search.py compares the
# backends' decoding in the fast suite.)
pytestmark = pytest.mark.slow


def _weights(path, config):
    """[(name, value)] of the weights in `path`, in the model's order."""
    model = Transformer(config)
    model.load_weights(path)
    return [(weight.name, weight.numpy()) for weight in model.weights]


def _assert_same_weights(first, second, config):
    for (name, a), (_, b) in zip(_weights(first, config), _weights(second, config)):
        # A key bias has no gradient in exact arithmetic (softmax ignores a shift of all scores),
        # so Adam turns float noise into steps of up to the learning rate there, either way.
        atol = 1e-2 if name.endswith("key_bias") else 1e-4
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=atol, err_msg=name)


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """Initial weights (dropout 0) and one batch whose halves hold different token counts."""
    path = tmp_path_factory.mktemp("start")
    config = TransformerConfig.tiny(60, num_layers=1, d_model=32, num_heads=2, d_ff=64, dropout=0.0, max_length=16)
    Transformer(config).save_weights(str(path / "init.weights.h5"))
    (path / "init.json").write_text(config.to_json())
    rng = np.random.default_rng(0)
    lengths = [8, 3, 5, 8, 2, 6]
    target = np.zeros((6, 8), np.int32)
    for row, length in enumerate(lengths):
        target[row, :length] = rng.integers(4, 60, size=length)
    source = rng.integers(4, 60, size=(6, 8)).astype(np.int32)
    batch = {
        "source": source,
        "target_input": np.concatenate([np.full((6, 1), 2, np.int32), target[:, :-1]], axis=1),
        "target_output": target,
        "dropped_pairs": np.zeros([6], np.int64),
    }
    np.savez(path / "batch.npz", **batch)
    return path, config


def _step(backend, start, steps, name, devices=1, policy="float32"):
    path, _ = start
    out = str(path / name)
    if os.path.exists(out + ".json"):  # measured already by another test of this module
        with open(out + ".json") as f:
            return json.load(f), out + ".weights.h5"
    run_under(backend, WORKER, "step", str(path / "init.weights.h5"), str(path / "batch.npz"), str(steps), out, policy,
              devices=devices)  # fmt: skip
    with open(out + ".json") as f:
        return json.load(f), out + ".weights.h5"


def test_jax_steps_equal_tensorflow_steps(start):
    jax_run, jax_weights = _step("jax", start, 3, "jax-float32")
    tf_run, tf_weights = _step("tensorflow", start, 3, "tensorflow-float32")
    assert (jax_run["backend"], tf_run["backend"]) == ("jax", "tensorflow")
    np.testing.assert_allclose(jax_run["losses"], tf_run["losses"], rtol=1e-5)
    _assert_same_weights(jax_weights, tf_weights, start[1])
    init, moved = _weights(str(start[0] / "init.weights.h5"), start[1]), _weights(jax_weights, start[1])
    assert all(not np.allclose(a, b) for (name, a), (_, b) in zip(init, moved) if name.endswith("kernel"))


def test_jax_data_parallel_over_two_devices_equals_one_device(start):
    two, two_weights = _step("jax", start, 3, "jax-two", devices=2)
    one, one_weights = _step("jax", start, 3, "jax-float32", devices=1)
    assert (two["replicas"], one["replicas"]) == (2, 1)
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    assert two["losses"][2] < two["losses"][0]
    _assert_same_weights(two_weights, one_weights, start[1])


@pytest.mark.parametrize(
    "backend, policy, tolerance",
    [("tensorflow", "mixed_bfloat16", 0.02), ("tensorflow", "mixed_float16", 0.005), ("jax", "mixed_bfloat16", 0.02)],
)
def test_mixed_precision_steps_track_float32(backend, policy, tolerance, start):
    """bfloat16 keeps 8 bits of mantissa (relative error ~0.4% per op), float16 11 bits: a few
    steps' losses stay within `tolerance` of float32's, relative."""
    reference, _ = _step(backend, start, 3, f"{backend}-float32")
    mixed, weights = _step(backend, start, 3, f"{backend}-{policy}", policy=policy)
    np.testing.assert_allclose(mixed["losses"], reference["losses"], rtol=tolerance)
    assert mixed["losses"] != reference["losses"], "the mixed-precision run computed in float32"
    assert mixed["optimizer"] == ("LossScaleOptimizer" if policy == "mixed_float16" else "Adam")
    assert all(np.all(np.isfinite(value)) for _, value in _weights(weights, start[1]))


FAST = ["--steps", "16", "--checkpoint-every", "8", "--steps-per-call", "4", "--dropout", "0", "--batch-tokens", "512",
        "--max-length", "24", "--vocab-size", "500", "--no-evaluate", "--strategy", "cpu"]  # fmt: skip


def test_a_crash_while_saving_leaves_the_previous_checkpoint_to_resume_from_and_average(tmp_path):
    run = str(tmp_path / "run")
    output = run_under("jax", WORKER, "crash-mid-save", run, *FAST)
    assert "crashed: disk full (simulated)" in output
    left = json.loads(output.splitlines()[-1])
    # ckpt-16 was begun, but has no state.json: not a checkpoint.
    assert left == ["ckpt-16", "ckpt-8"] and not os.path.exists(os.path.join(run, "checkpoints", "ckpt-16", "state.json"))
    resumed = run_under("jax", "-m", "training.train", "--run-dir", run, *FAST)
    assert f"Resumed from {run}/checkpoints/ckpt-8 at step 8." in resumed
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["ckpt-16", "ckpt-8"]
    from training.run_folder import RunFolder

    # Resumed, the run ends where a run never interrupted ends (test_train_end_to_end kills
    # TensorFlow's with SIGKILL).
    straight = str(tmp_path / "straight")
    run_under("jax", "-m", "training.train", "--run-dir", straight, *FAST)
    config = RunFolder(run).config()
    last = os.path.join("checkpoints", "ckpt-16", "model.weights.h5")
    for (name, after_resume), (_, uninterrupted) in zip(
        _weights(os.path.join(run, last), config), _weights(os.path.join(straight, last), config)
    ):
        np.testing.assert_allclose(after_resume, uninterrupted, rtol=1e-4, atol=1e-5, err_msg=name)

    # The JAX run's checkpoints average (here under TensorFlow) into the mean of their weights.
    run_under("tensorflow", "-m", "training.average_checkpoints", "--run-dir", run, "--last", "2")
    averaged = _weights(os.path.join(run, "averaged", "ckpt-16.weights.h5"), config)
    first, second = (_weights(os.path.join(run, "checkpoints", name, "model.weights.h5"), config) for name in ("ckpt-8", "ckpt-16"))
    assert not np.allclose(first[0][1], second[0][1])
    for (_, mean), (_, a), (_, b) in zip(averaged, first, second):
        np.testing.assert_allclose(mean, (a + b) / 2, rtol=1e-5, atol=1e-7)

    # The same commands as for a TensorFlow run, in a shell where KERAS_BACKEND=jax.
    evaluated = run_under("jax", "-m", "training.evaluate", "--run-dir", run, "--split", "test", "--limit", "8")
    assert '"sentences": 8' in evaluated and "averaged/ckpt-16.weights.h5" in evaluated
    exported = run_under("jax", "-m", "export", "--run-dir", run, "--out", str(tmp_path / "exports"))
    assert f"Exported to {tmp_path}/exports/1" in exported


def test_a_run_folder_on_a_filesystem_that_is_not_posix_trains_resumes_and_averages():
    """As test_train_end_to_end's TensorFlow run on ram:// (in one process: ram:// is its memory)."""
    output = run_under("jax", WORKER, "remote", "ram://runs/jax", *FAST)
    assert "Resumed from ram://runs/jax/checkpoints/ckpt-4 at step 4." in output
    result = json.loads(output.splitlines()[-1])
    assert result["steps"] == 8 and result["checkpoints"] == [4, 8]
    assert result["averaged"] == result["loaded"] == "ram://runs/jax/averaged/ckpt-8.weights.h5"


def test_jax_overfits_8_pairs_and_the_tensorflow_export_serves_them(
    synthetic_corpus, synthetic_sentencepiece, synthetic_tokenizer, tmp_path
):
    from export.saved_model import export
    from keras_transformer.search import DecodingSettings

    def tokens(text):
        return len(synthetic_tokenizer.tokenize(text))

    # As test_train's overfit: eight pairs of one bucket (length 8), the synthetic corpus' tokenizer.
    pairs = [p for p in synthetic_corpus.text_pairs("train", 400) if tokens(p[0]) < 8 and tokens(p[1]) < 8][:8]
    data = tmp_path / "eight"
    data.mkdir()
    for side, lang in enumerate(("en", "de")):
        (data / f"train.{lang}").write_text("".join(pair[side] + "\n" for pair in pairs))
    run = str(tmp_path / "run")
    os.makedirs(run)
    with open(os.path.join(run, "tokenizer.model"), "wb") as f:
        f.write(synthetic_sentencepiece)
    # No label smoothing and no dropout, so that the memorised pairs become near-certain.
    flags = ["--run-dir", run, "--dataset", str(data), "--source-lang", "en", "--target-lang", "de", "--steps", "300",
             "--warmup-steps", "40", "--learning-rate-scale", "1", "--label-smoothing", "0", "--dropout", "0",
             "--batch-tokens", "128", "--max-length", "16", "--vocab-size", "1000", "--checkpoint-every", "300",
             "--steps-per-call", "50", "--no-evaluate", "--strategy", "cpu"]  # fmt: skip
    trained = subprocess.run([sys.executable, "-m", "training.train", "--backend", "jax", *flags], cwd=ROOT,
                             capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"})  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    with open(os.path.join(run, "training.json")) as f:
        assert json.load(f)["backend"] == "jax"
    sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
    under_jax = json.loads(run_under("jax", WORKER, "translate", run, json.dumps(sources)).splitlines()[-1])
    assert under_jax["greedy"][0] == targets
    assert under_jax["beam"][0] == targets

    served = tf.saved_model.load(export(run, str(tmp_path / "exports"), DecodingSettings(max_extra_length=10)))
    result = served.translate(tf.constant(sources))
    assert [t.decode() for t in result["translation"].numpy()] == targets
    np.testing.assert_allclose(result["score"].numpy(), under_jax["beam"][1], rtol=1e-4, atol=1e-6)
