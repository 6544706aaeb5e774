"""training.train as users run it: in subprocesses, killed and resumed, on two workers."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A small, fast run: no dropout, so that two runs over the same data give the same weights.
FAST = ["--steps", "40", "--checkpoint-every", "8", "--steps-per-call", "4", "--dropout", "0", "--batch-tokens", "512",
        "--max-length", "24", "--vocab-size", "500", "--no-evaluate", "--strategy", "cpu"]  # fmt: skip


def _train_command(run_dir, *extra):
    return [sys.executable, "-m", "training.train", "--run-dir", str(run_dir), *FAST, *extra]


def _weights(run_dir):
    code = (
        "import sys, numpy as np; from training.run_folder import RunFolder;"
        "model, _ = RunFolder(sys.argv[1]).load_model(); np.savez(sys.argv[2], *model.get_weights())"
    )
    path = os.path.join(str(run_dir), "weights.npz")
    subprocess.run([sys.executable, "-c", code, str(run_dir), path], check=True, cwd=ROOT, capture_output=True)
    with np.load(path) as saved:
        return [saved[name] for name in saved.files]


@pytest.mark.slow
def test_training_killed_with_sigkill_resumes_where_it_stopped(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    subprocess.run(_train_command(straight), check=True, cwd=ROOT, capture_output=True)
    os.makedirs(resumed)
    shutil.copy(straight / "tokenizer.model", resumed / "tokenizer.model")

    process = subprocess.Popen(_train_command(resumed), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not (resumed / "checkpoints" / "checkpoint").exists():
        assert process.poll() is None and time.time() < deadline, "training ended before its first checkpoint"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = sorted(int(p.name[5:-6]) for p in (resumed / "checkpoints").glob("ckpt-*.index"))
    assert killed_at and killed_at[-1] < 40, "the process finished before it was killed"

    rerun = subprocess.run(_train_command(resumed), check=True, cwd=ROOT, capture_output=True, text=True)
    assert f"Resumed from {resumed}/checkpoints/ckpt-{killed_at[-1]} at step {killed_at[-1]}" in rerun.stdout
    for run in (straight, resumed):
        assert json.loads((run / "metrics.json").read_text())["steps"] == 40
    for after_resume, uninterrupted in zip(_weights(resumed), _weights(straight)):
        np.testing.assert_allclose(after_resume, uninterrupted, rtol=1e-4, atol=1e-5)


def test_max_minutes_stops_early_with_a_checkpoint(tmp_path):
    result = subprocess.run(_train_command(tmp_path, "--max-minutes", "0.0001"), check=True, cwd=ROOT,
                            capture_output=True, text=True)  # fmt: skip
    # The first call (4 steps) takes longer than 6 ms: training stops there and saves it.
    assert "Stopped at step 4 of 40: --max-minutes 0.0001 reached." in result.stdout
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == 4
    assert (tmp_path / "checkpoints" / "ckpt-4.index").exists()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_multiworker_trains_on_two_processes_with_equal_weights(tmp_path):
    cluster = {"worker": [f"127.0.0.1:{_free_port()}" for _ in range(2)]}
    processes = []
    for index in range(2):
        env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}
        command = [sys.executable, os.path.join(ROOT, "tests", "multiworker_worker.py"), "--run-dir", str(tmp_path / "run"),
                   *FAST[:-2], "--steps", "6", "--checkpoint-every", "3", "--strategy", "multiworker",
                   "--weights-out", str(tmp_path / f"worker{index}.npz")]  # fmt: skip
        processes.append(subprocess.Popen(command, cwd=ROOT, env={**env, "PYTHONPATH": ROOT}, stderr=subprocess.PIPE, text=True))
    for process in processes:
        _, stderr = process.communicate(timeout=900)
        assert process.returncode == 0, stderr[-3000:]
    with np.load(tmp_path / "worker0.npz") as first, np.load(tmp_path / "worker1.npz") as second:
        assert first.files == second.files and len(first.files) > 10
        for name in first.files:
            np.testing.assert_array_equal(first[name], second[name])
    assert (tmp_path / "run" / "checkpoints" / "ckpt-6.index").exists()
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["steps"] == 6


def _scalar_tags(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return set(accumulator.Tags()["tensors"]) | set(accumulator.Tags()["scalars"])


@pytest.mark.slow
def test_train_evaluate_and_average_from_the_command_line(tmp_path):
    run = tmp_path / "run"
    command = _train_command(run, "--eval-sentences", "20")
    command[command.index("--no-evaluate")] = "--eval-every=16"
    subprocess.run(command, check=True, cwd=ROOT, capture_output=True)
    metrics = json.loads((run / "metrics.json").read_text())
    assert {"bleu", "chrf", "signature", "chrf_signature", "steps", "train_seconds", "dev_bleu"} <= set(metrics)
    assert metrics["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert metrics["steps"] == 40 and metrics["sentences"] == 1000
    assert len((run / "translations.test.txt").read_text().splitlines()) == 1000
    assert {"loss", "learning_rate", "target_tokens_per_second", "dropped_pairs"} <= _scalar_tags(run / "logs" / "train")
    assert {"bleu", "chrf"} <= _scalar_tags(run / "logs" / "dev")

    averaged = subprocess.run([sys.executable, "-m", "training.average_checkpoints", "--run-dir", str(run), "--last", "3"],
                              check=True, cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert "Averaged 3 checkpoints (ckpt-24, ckpt-32, ckpt-40)" in averaged.stdout
    evaluated = subprocess.run([sys.executable, "-m", "training.evaluate", "--run-dir", str(run), "--split", "dev", "--limit", "30"],
                               check=True, cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    dev = json.loads(evaluated.stdout[evaluated.stdout.index("{") :])
    assert dev["sentences"] == 30 and dev["checkpoint"].endswith("averaged/ckpt-40.weights.h5")


def test_average_checkpoints_is_the_mean_of_the_weights(tmp_path):
    import tensorflow as tf

    from keras_transformer import Transformer, TransformerConfig
    from training.average_checkpoints import average_checkpoints
    from training.run_folder import RunFolder

    run = RunFolder(str(tmp_path))
    config = TransformerConfig.tiny(50, d_model=16, d_ff=32, num_layers=1)
    run.write_json(run.config_path, config.to_dict())
    models = [Transformer(config) for _ in range(3)]
    for step, model in enumerate(models, start=1):
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), run.checkpoint_dir, max_to_keep=5)
        manager.save(checkpoint_number=step)
    average_checkpoints(str(tmp_path), last=2)
    averaged, path = run.load_model()
    assert path.endswith("averaged/ckpt-3.weights.h5")
    for mean, second, third in zip(averaged.get_weights(), models[1].get_weights(), models[2].get_weights()):
        np.testing.assert_allclose(mean, (second + third) / 2, rtol=1e-6)
