"""The JAX training path: the same step as TensorFlow's, data parallelism, checkpoints, and run
folders that the TensorFlow commands average and export. The JAX side of every check runs in one
JAX process of two host devices (the `under_jax` fixture: tests/backend_worker.py session),
besides the suite's shared JAX run and its export (tests/artifacts.py); this process runs
TensorFlow."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from artifacts import JAX_RUN
from training.recipes import MECHANICS
from conftest import (ACCUMULATION_CONFIG, CLOCKED, CLOCKED_CHECKPOINTS, CLOCKED_STOP, ROOT, WORKER, accumulation_batches,
                      assert_accumulation_is_exact, run_under)
from keras_transformer import Transformer, TransformerConfig
from keras_transformer.search import DecodingSettings
from training.evaluate import make_translator
from training.languages import tagged
from training.run_folder import RunFolder

# Every test here reads what JAX processes computed: slow. (tests/test_search.py compares the
# backends' decoding.)
# One worker runs them all: they share one JAX process (the under_jax module fixture).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("jax")]


def _weights(path, config):
    """[(name, value)] of the weights in `path`, in the model's order."""
    model = Transformer(config)
    model.load_weights(path)
    return [(weight.name, weight.numpy()) for weight in model.weights]


def _assert_same_weights(first, second, config, steps=3):
    """The weights after `steps` of backend_worker's `step` (warm-up 10) agree to 1e-4, but for
    Adam's steps on float noise.

    Adam moves a weight by about the learning rate a step whatever the size of its gradient, so
    where a gradient is float noise the two backends may step apart by up to twice the learning
    rates: everywhere in a key bias (no gradient in exact arithmetic: softmax ignores a shift of
    all scores), and at a rare element of another weight (seen: 1 of 1,024 of a query kernel)."""
    from training.schedule import TransformerSchedule

    schedule = TransformerSchedule(config.d_model, warmup_steps=10)
    noise = 2 * sum(float(schedule(step)) for step in range(steps))  # the updates at iterations 0 to steps - 1
    for (name, a), (_, b) in zip(_weights(first, config), _weights(second, config)):
        np.testing.assert_allclose(a, b, rtol=0, atol=noise, err_msg=name)
        if not name.endswith("key_bias"):
            close = np.isclose(a, b, rtol=1e-4, atol=1e-4)
            assert close.mean() >= 0.99, (name, np.abs(a - b)[~close])


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


@pytest.fixture(scope="module")
def accumulation(tmp_path_factory):
    """conftest's batches for accumulation checks, and initial weights of their model: (batch
    paths, token counts, weights path, config)."""
    path = tmp_path_factory.mktemp("accumulation")
    config = TransformerConfig(**ACCUMULATION_CONFIG)
    Transformer(config).save_weights(str(path / "init.weights.h5"))
    (path / "init.json").write_text(config.to_json())
    paths, tokens = accumulation_batches(str(path))
    return paths, tokens, str(path / "init.weights.h5"), config


# The JAX steps: name -> (policy, devices).
JAX_STEPS = {"jax-float32": ("float32", 1), "jax-two": ("float32", 2), "jax-mixed_bfloat16": ("mixed_bfloat16", 1)}
OVERFIT_PAIRS = 8
# The accumulation runs: (batches, updates, devices).
ACCUMULATION_RUNS = [("a", 1, 1), ("b", 1, 1), ("union", 1, 1), ("a+b", 1, 1), ("a+b", 1, 2), ("union", 3, 1), ("a+b", 3, 1)]


@pytest.fixture(scope="module")
def under_jax(start, accumulation, artifacts, synthetic_corpus, synthetic_sentencepiece, tmp_path_factory):
    """What one JAX process (two host devices) did and printed, in order: the steps of
    JAX_STEPS; SGD updates on the accumulation batches (ACCUMULATION_RUNS: one each of a, b,
    their union and a+b accumulated, on one device and on two; three of the union and of a+b); a
    run of training/recipes.py's MECHANICS that crashes while saving, resumed; the shared JAX run
    (averaged here, under TensorFlow) evaluated; a run on ram:// trained, resumed and averaged;
    conftest's CLOCKED run on a fake clock; greedy and beam search of a run that `python -m
    training.train --backend jax` trained on 8 pairs; and a run started from the suite's
    TensorFlow run (--init-from). Returns (its outputs by name, folder, the 8 pairs)."""
    from training.average_checkpoints import average_checkpoints
    from training.tokenizer import Tokenizer

    folder = tmp_path_factory.mktemp("jax")
    # Eight pairs of one bucket (length 8), as test_train's overfit, with the synthetic corpus' tokenizer.
    tokenizer = Tokenizer(synthetic_sentencepiece)
    pairs = [p for p in synthetic_corpus.text_pairs("train", 400) if all(len(tokenizer.source.tokenize(t)) < 8 for t in p)][:OVERFIT_PAIRS]
    data, overfit = folder / "eight", folder / "overfit"
    data.mkdir()
    overfit.mkdir()
    for side, lang in enumerate(("en", "de")):
        (data / f"train.{lang}").write_text("".join(pair[side] + "\n" for pair in pairs))
    (overfit / "tokenizer.model").write_bytes(synthetic_sentencepiece)
    # No label smoothing and no dropout, so that the memorised pairs become near-certain. From a
    # shell without KERAS_BACKEND: --backend jax starts the command again under JAX.
    flags = ["--run-dir", str(overfit), "--dataset", str(data), "--source-lang", "en", "--target-lang", "de", "--steps",
             "300", "--warmup-steps", "40", "--learning-rate-scale", "1", "--label-smoothing", "0", "--dropout", "0",
             "--batch-tokens", "128", "--max-length", "16", "--vocab-size", "1000", "--checkpoint-every", "300",
             "--steps-per-call", "50", "--no-evaluate", "--strategy", "cpu"]  # fmt: skip
    trained = subprocess.run(["timeout", "900", sys.executable, "-m", "training.train", "--backend", "jax", *flags], cwd=ROOT,
                             capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"})  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]

    shared = folder / "shared"  # the suite's JAX run, averaged here under TensorFlow
    shutil.copytree(artifacts.jax_run, shared)
    average_checkpoints(str(shared), last=2)

    path, _ = start
    crashed = str(folder / "crashed")
    commands = {
        **{name: ["step", str(path / "init.weights.h5"), str(path / "batch.npz"), "3", str(folder / name), policy, str(devices)]
           for name, (policy, devices) in JAX_STEPS.items()},
        **{f"accumulate-{batches}-{updates}-{devices}": ["step", accumulation[2], accumulation[0][batches], str(updates),
                                                         str(folder / f"accumulate-{batches}-{updates}-{devices}"), "float32",
                                                         str(devices), "2" if batches == "a+b" else "1", "sgd"]
           for batches, updates, devices in ACCUMULATION_RUNS},
        "crash": ["crash-mid-save", crashed, *JAX_RUN, "--no-evaluate"],  # the suite's JAX run's flags
        "resume": ["train", "--run-dir", crashed, *JAX_RUN, "--no-evaluate"],
        "evaluate": ["evaluate", "--run-dir", str(shared), "--split", "test", "--limit", "8"],
        "remote": ["remote", "ram://runs/jax", str(folder / "remote.weights.h5"), *JAX_RUN,
                   "--checkpoint-every", "4", "--no-evaluate"],  # the suite's JAX run, resumed on the way
        "clocked": ["clocked", str(folder / "clocked"), *CLOCKED],
        "translate": ["translate", str(overfit), json.dumps([source for source, _ in pairs])],
        "tuned": ["train", "--run-dir", str(folder / "tuned"), *MECHANICS, "--steps", "4", "--checkpoint-every", "2",
                  "--steps-per-call", "2", "--warmup-steps", "10", "--no-evaluate", "--encoder-layers", "2",
                  "--decoder-layers", "2", "--init-from", artifacts.tf_run],  # the TensorFlow recipe's depths
    }  # fmt: skip
    outputs = json.loads(run_under("jax", WORKER, "session", json.dumps(list(commands.values())), devices=2).splitlines()[-1])
    return dict(zip(commands, outputs)), folder, pairs


def _step(name, start, under_jax):
    """(the step's record, its weights file): JAX's from the session, TensorFlow's computed here."""
    from backend_worker import step

    path, _ = start
    out = str(under_jax[1] / name)
    if name.startswith("tensorflow") and not os.path.exists(out + ".json"):
        step(str(path / "init.weights.h5"), str(path / "batch.npz"), 3, out, name.split("-", 1)[1])
    with open(out + ".json") as f:
        return json.load(f), out + ".weights.h5"


def test_a_jax_run_started_from_a_tensorflow_one_has_its_weights_and_a_fresh_optimizer_at_step_0(artifacts, under_jax):
    outputs, folder, _ = under_jax
    source, run = RunFolder(artifacts.tf_run), RunFolder(str(folder / "tuned"))
    assert f"Started from {source.checkpoint('latest')} (step 160 of {artifacts.tf_run})" in outputs["tuned"]
    assert [step for step, _ in run.checkpoints()] == [0, 2, 4]
    assert run.segments()[0]["settings"]["init_from"]["checkpoint"] == source.checkpoint("latest")
    # The source is a tf.train.Checkpoint, which a TensorFlow process converted for JAX.
    step_0 = _weights(os.path.join(run.checkpoint("0"), "model.weights.h5"), run.config())
    for (name, ours), value in zip(step_0, source.load_model("latest")[0].get_weights()):
        np.testing.assert_array_equal(ours, value, err_msg=name)
    with np.load(os.path.join(run.checkpoint("0"), "training_state.npz")) as saved:
        optimizer = [saved[key] for key in saved.files if key.startswith("optimizer/")]
    assert optimizer and not any(np.any(value) for value in optimizer)  # no update yet: every slot and the count 0
    tuned = _weights(os.path.join(run.checkpoint("4"), "model.weights.h5"), run.config())
    assert not np.allclose(tuned[0][1], step_0[0][1])


def test_jax_steps_equal_tensorflow_steps(start, under_jax):
    jax_run, jax_weights = _step("jax-float32", start, under_jax)
    tf_run, tf_weights = _step("tensorflow-float32", start, under_jax)
    assert (jax_run["backend"], tf_run["backend"]) == ("jax", "tensorflow")
    np.testing.assert_allclose(jax_run["losses"], tf_run["losses"], rtol=1e-5)
    _assert_same_weights(jax_weights, tf_weights, start[1])
    init, moved = _weights(str(start[0] / "init.weights.h5"), start[1]), _weights(jax_weights, start[1])
    assert all(not np.allclose(a, b) for (name, a), (_, b) in zip(init, moved) if name.endswith("kernel"))


def test_jax_data_parallel_over_two_devices_equals_one_device(start, under_jax):
    two, two_weights = _step("jax-two", start, under_jax)
    one, one_weights = _step("jax-float32", start, under_jax)
    assert (two["replicas"], one["replicas"]) == (2, 1)
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    assert two["losses"][2] < two["losses"][0]
    _assert_same_weights(two_weights, one_weights, start[1])


@pytest.mark.parametrize(
    "backend, policy, tolerance",
    [("tensorflow", "mixed_bfloat16", 0.02), ("tensorflow", "mixed_float16", 0.005), ("jax", "mixed_bfloat16", 0.02)],
)
def test_mixed_precision_steps_track_float32(backend, policy, tolerance, start, under_jax):
    """bfloat16 keeps 8 bits of mantissa (relative error ~0.4% per op), float16 11 bits: a few
    steps' losses stay within `tolerance` of float32's, relative."""
    reference, _ = _step(f"{backend}-float32", start, under_jax)
    mixed, weights = _step(f"{backend}-{policy}", start, under_jax)
    np.testing.assert_allclose(mixed["losses"], reference["losses"], rtol=tolerance)
    assert mixed["losses"] != reference["losses"], "the mixed-precision run computed in float32"
    assert mixed["optimizer"] == ("LossScaleOptimizer" if policy == "mixed_float16" else "Adam")
    assert all(np.all(np.isfinite(value)) for _, value in _weights(weights, start[1]))


def test_a_crash_while_saving_leaves_the_previous_checkpoint_to_resume_from_and_average(under_jax, artifacts):
    from training.average_checkpoints import average_checkpoints
    from training.run_folder import RunFolder

    outputs, folder = under_jax[0], under_jax[1]
    run = str(folder / "crashed")
    assert "crashed: disk full (simulated)" in outputs["crash"]
    # ckpt-16 was begun, but has no state.json: not a checkpoint.
    assert json.loads(outputs["crash"].splitlines()[-1]) == ["ckpt-16", "ckpt-8"]
    assert f"Resumed from {run}/checkpoints/ckpt-8 at step 8." in outputs["resume"]
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["ckpt-16", "ckpt-24", "ckpt-32", "ckpt-40", "ckpt-8"]
    # Resumed, the run ends where the suite's JAX run, never interrupted, ends (test_train_end_to_end
    # kills TensorFlow's with SIGKILL).
    config = RunFolder(run).config()
    last = os.path.join("checkpoints", "ckpt-40", "model.weights.h5")
    for (name, after_resume), (_, uninterrupted) in zip(
        _weights(os.path.join(run, last), config), _weights(os.path.join(artifacts.jax_run, last), config)
    ):
        np.testing.assert_allclose(after_resume, uninterrupted, rtol=1e-4, atol=1e-5, err_msg=name)

    # The JAX run's checkpoints average (here under TensorFlow) into the mean of their weights.
    average_checkpoints(run, last=2)
    averaged = _weights(os.path.join(run, "averaged", "ckpt-40.weights.h5"), config)
    first, second = (_weights(os.path.join(run, "checkpoints", name, "model.weights.h5"), config) for name in ("ckpt-32", "ckpt-40"))
    assert not np.allclose(first[0][1], second[0][1])
    for (_, mean), (_, a), (_, b) in zip(averaged, first, second):
        np.testing.assert_allclose(mean, (a + b) / 2, rtol=1e-5, atol=1e-7)


def test_the_commands_of_a_tensorflow_run_evaluate_and_export_a_jax_run(under_jax, artifacts):
    """In a shell where KERAS_BACKEND=jax: evaluate (the session) reads the average that
    TensorFlow made; export (tests/artifacts.py ran `python -m export` there) serves the run."""
    evaluated = under_jax[0]["evaluate"]
    assert '"sentences": 8' in evaluated and "averaged/ckpt-40.weights.h5" in evaluated
    assert f"Exported to {artifacts.exports['jax']}" in artifacts.output("jax-export")
    # Its 3 encoder layers and 1 decoder layer served as the library's search translates with them.
    run = RunFolder(artifacts.jax_run)
    model, _ = run.load_model()
    assert (len(model.encoder.layers), len(model.decoder.layers)) == (3, 1)
    sentences = [source for source, _ in run.load_corpus().text_pairs("test", 8)]
    translate = make_translator(model, run.load_tokenizer(), DecodingSettings(), jit_compile=False)
    loaded = tf.saved_model.load(artifacts.exports["jax"])
    for language in ("de", "qaa"):  # of its two
        served = loaded.translate(tf.constant(sentences), target_language=tf.constant([language]))["translation"].numpy()
        assert [t.decode() for t in served] == translate([tagged(sentence, language) for sentence in sentences])[0]


def test_a_run_folder_on_a_filesystem_that_is_not_posix_trains_resumes_and_averages(under_jax, artifacts):
    """As test_train_end_to_end's TensorFlow run on ram:// (in one process: ram:// is its memory).
    Resumed there, it ends at step 8 where the suite's JAX run, the same recipe in a local folder
    never interrupted, was at step 8."""
    outputs, folder = under_jax[0], under_jax[1]
    output = outputs["remote"]
    assert "Resumed from ram://runs/jax/checkpoints/ckpt-4 at step 4." in output
    result = json.loads(output.splitlines()[-1])
    assert result["steps"] == 8 and result["checkpoints"] == [4, 8]
    assert result["averaged"] == result["loaded"] == "ram://runs/jax/averaged/ckpt-8.weights.h5"
    config = RunFolder(artifacts.jax_run).config()
    uninterrupted = _weights(os.path.join(artifacts.jax_run, "checkpoints", "ckpt-8", "model.weights.h5"), config)
    for (name, remote), (_, local) in zip(_weights(str(folder / "remote.weights.h5"), config), uninterrupted):
        np.testing.assert_allclose(remote, local, rtol=1e-4, atol=1e-5, err_msg=name)
    later = _weights(os.path.join(artifacts.jax_run, "checkpoints", "ckpt-16", "model.weights.h5"), config)
    assert not np.allclose(uninterrupted[0][1], later[0][1])  # the weights move from step to step: the check could fail


def test_jax_overfits_8_pairs_and_the_tensorflow_export_serves_them(under_jax, tmp_path):
    from export.saved_model import export
    from keras_transformer.search import DecodingSettings

    outputs, folder, pairs = under_jax
    run = str(folder / "overfit")
    assert RunFolder(run).settings()["backend"] == "jax"
    sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
    translated = json.loads(outputs["translate"].splitlines()[-1])
    assert translated["greedy"][0] == targets
    assert translated["beam"][0] == targets

    served = tf.saved_model.load(export(run, str(tmp_path / "exports"), DecodingSettings(max_length_b=10)))
    result = served.translate(tf.constant(sources))
    assert [t.decode() for t in result["translation"].numpy()] == targets
    np.testing.assert_allclose(result["score"].numpy(), translated["beam"][1], rtol=1e-4, atol=1e-6)


def _accumulated(under_jax, batches, updates, devices, config):
    """The flat weights and the record of an accumulation run of the JAX session."""
    out = str(under_jax[1] / f"accumulate-{batches}-{updates}-{devices}")
    with open(out + ".json") as f:
        record = json.load(f)
    return np.concatenate([np.ravel(value) for _, value in _weights(out + ".weights.h5", config)]), record


@pytest.mark.parametrize("devices", [1, 2])
def test_jax_update_from_accumulated_batches_is_the_update_of_their_union(devices, accumulation, under_jax):
    _, tokens, init, config = accumulation
    start = np.concatenate([np.ravel(value) for _, value in _weights(init, config)])
    updated = {batches: _accumulated(under_jax, batches, 1, devices if batches == "a+b" else 1, config)[0]
               for batches in ("a", "b", "union", "a+b")}  # fmt: skip
    assert _accumulated(under_jax, "a+b", 1, devices, config)[1]["replicas"] == devices
    assert_accumulation_is_exact(updated, start, tokens, atol=2e-6)


def test_jax_schedule_counts_updates_not_batches(accumulation, under_jax):
    config = accumulation[3]
    (accumulated, accumulated_run), (union, union_run) = (_accumulated(under_jax, name, 3, 1, config) for name in ("a+b", "union"))
    assert accumulated_run["iterations"] == union_run["iterations"] == 3
    np.testing.assert_allclose(accumulated, union, rtol=0, atol=5e-6)


def test_jax_checkpoints_by_training_time_besides_the_step_rule_and_max_minutes_stops_with_one(under_jax):
    assert CLOCKED_STOP in under_jax[0]["clocked"]
    assert json.loads(under_jax[0]["clocked"].strip().splitlines()[-1]) == CLOCKED_CHECKPOINTS
