"""training.train as users run it: killed and resumed, on two workers, on a filesystem that is not
POSIX; the commands after it (average, evaluate) on the suite's shared run."""

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

from artifacts import MARIAN, suite_environment
from training.recipes import MECHANICS, TINY
from conftest import CLOCKED, CLOCKED_CHECKPOINTS, CLOCKED_STOP, ROOT
from training.run_folder import RunFolder


def _weights(run_dir, checkpoint=None):
    """The model weights of the run's latest checkpoint (or of `checkpoint`)."""
    from training.run_folder import RunFolder

    model, _ = RunFolder(str(run_dir)).load_model(checkpoint)
    return model.get_weights()


def _assert_same_weights(first, second, atol=1e-5):
    assert len(first) == len(second) > 10
    for a, b in zip(first, second):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=atol)


# Under JAX, test_jax's crash while saving checks the same: a resumed run ends as one never stopped.
@pytest.mark.slow
def test_training_killed_with_sigkill_resumes_where_it_stopped(artifacts, tmp_path):
    straight = artifacts.tf_run  # the same recipe, uninterrupted, with evaluation (which changes no weight)
    resumed = tmp_path / "resumed"
    os.makedirs(resumed)
    shutil.copy(os.path.join(straight, "tokenizer.model"), resumed / "tokenizer.model")
    flags = ["--run-dir", str(resumed), *TINY, "--steps", "40", "--no-evaluate"]  # its first 40 steps
    command = ["timeout", "600", sys.executable, "-m", "training.train", *flags]
    env = suite_environment(os.environ, optimized=True)  # XLA's kernels as the shared run's, which rounded alike

    # Killed as soon as the run announces its checkpoint at step 20, then run again.
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               start_new_session=True)  # fmt: skip
    for line in process.stdout:
        if "checkpoints/ckpt-20 at step 20." in line:
            os.killpg(process.pid, signal.SIGKILL)  # the group: `timeout` and the training (a SIGKILL is not passed on)
            break
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before its checkpoint at step 20"
    rerun = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    out = rerun.stdout
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    resumed_from = int(out.split("Resumed from ")[1].split(" at step ")[1].split(".")[0])
    assert 20 <= resumed_from < 40, out
    assert f"Resumed from {resumed}/checkpoints/ckpt-{resumed_from} at step {resumed_from}." in out
    for run, steps in ((straight, 160), (resumed, 40)):
        with open(os.path.join(run, "metrics.json")) as f:
            metrics = json.load(f)
        assert (metrics["steps"], metrics["backend"]) == (steps, "tensorflow")
    _assert_same_weights(_weights(resumed), _weights(straight, os.path.join(straight, "checkpoints", "ckpt-40")))


@pytest.mark.slow
def test_checkpoints_are_written_by_training_time_besides_the_step_rule_and_max_minutes_stops_with_one(tmp_path, capsys):
    from backend_worker import clocked

    clocked(str(tmp_path), *CLOCKED, "--no-xla")  # the clock's rules, not the step: no compilation
    out = capsys.readouterr().out
    assert CLOCKED_STOP in out
    assert json.loads(out.strip().splitlines()[-1]) == CLOCKED_CHECKPOINTS
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == 12


# What a TensorFlow worker prints when its gRPC server cannot bind its port. TensorFlow's servers
# refuse SO_REUSEPORT, so a port cannot be held for them (bench.common.held_port): one taken between
# its choice and the bind makes both workers start again on other ports.
PORT_TAKEN = "Could not start gRPC server"


def _start_workers(run_dir, flags, weights_out, attempts=3):
    """Two TensorFlow workers on 127.0.0.1 (TF_CONFIG), each training through training.train;
    returns their outputs."""
    for attempt in range(attempts):
        ports = []
        for _ in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
        outputs, statuses = _run_workers(run_dir, flags, weights_out, {"worker": [f"127.0.0.1:{port}" for port in ports]})
        if not any(PORT_TAKEN in output for output in outputs) or attempt == attempts - 1:
            break
    for status, output in zip(statuses, outputs):
        assert status == 0, output[-3000:]
    return outputs


def _run_workers(run_dir, flags, weights_out, cluster, limit_seconds=900):
    """The outputs and exit statuses of the two workers of `cluster`; if one could not bind its
    port, both are stopped."""
    processes, logs = [], [weights_out / f"worker{index}.out" for index in range(2)]
    for index, log in enumerate(logs):
        env = {**os.environ, "PYTHONPATH": ROOT,
               "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}  # fmt: skip
        command = [sys.executable, os.path.join(ROOT, "tests", "multiworker_worker.py"), "--run-dir", str(run_dir), *flags,
                   "--strategy", "multiworker", "--weights-out", str(weights_out / f"worker{index}.npz"),
                   "--shards-written", str(weights_out / f"shards{index}.json")]  # fmt: skip
        with open(log, "w") as out:
            processes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + limit_seconds
    try:
        while any(process.poll() is None for process in processes):
            # A worker whose server could not start may not end by itself: its log says so.
            if any(PORT_TAKEN in log.read_text() for log in logs) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return [log.read_text() for log in logs], [process.returncode for process in processes]


def _shards_written(folder):
    """The tokenized shards each worker wrote (tests/multiworker_worker.py --shards-written)."""
    return [json.loads((folder / f"shards{index}.json").read_text()) for index in range(2)]


@pytest.mark.slow
def test_two_workers_each_read_a_share_and_train_and_resume_as_one_device_on_the_same_global_batches(
    artifacts, three_shard_corpus, tmp_path
):
    from backend_worker import batches_of_two_shares
    from training.train import parse_args, train

    data = ["--dataset", str(three_shard_corpus), "--source-lang", "en", "--target-lang", "de"]
    # Started from the suite's JAX run (Marian's model options): a start from another run, of the other
    # backend, across workers, with another --max-length (24 there), which sinusoidal positions allow.
    flags = [*MECHANICS, *MARIAN, *data, "--checkpoint-every", "3", "--max-length", "16", "--no-evaluate",
             "--max-minutes", "60", "--init-from", artifacts.jax_run]  # fmt: skip
    run, reference = tmp_path / "run", tmp_path / "reference"
    outputs = _start_workers(run, [*flags, "--steps", "6"], tmp_path)
    assert f"Started from {RunFolder(artifacts.jax_run).checkpoint('latest')}" in outputs[0] and "Started" not in outputs[1]
    for ours, theirs in zip(_weights(run, "0"), _weights(artifacts.jax_run)):
        np.testing.assert_array_equal(ours, theirs)
    assert (run / "checkpoints" / "ckpt-6.index").exists() and (run / "checkpoints" / "worker-1" / "ckpt-6.index").exists()
    assert RunFolder(str(run)).settings()["processes"] == 2
    # Each worker wrote the shards of its own share: 0 and 2, and 1.
    assert _shards_written(tmp_path) == [[0, 2], [1]]
    assert len(list((run / "data").glob("tokenized-*/shard-*.tfrecord"))) == 3
    # Resumed, each worker from its own checkpoint (its position in its share), writing no shard again.
    outputs = _start_workers(run, [*flags, "--steps", "9"], tmp_path)
    assert f"Resumed from {run}/checkpoints/ckpt-6 at step 6." in outputs[0] and "Resumed" not in outputs[1]
    assert _shards_written(tmp_path) == [[], []]

    # One device, never interrupted, on global batches made of the two shares' rows the same way.
    os.makedirs(reference)
    shutil.copy(run / "tokenizer.model", reference / "tokenizer.model")
    with batches_of_two_shares():
        train(parse_args(["--run-dir", str(reference), *flags, "--steps", "9", "--strategy", "cpu"]))
    expected = _weights(reference)
    for worker in ("worker0", "worker1"):
        with np.load(tmp_path / f"{worker}.npz") as weights:
            # All-reduce sums in another order; key biases turn float noise into Adam steps (test_train).
            _assert_same_weights([weights[name] for name in weights.files], expected, atol=5e-5)
    assert json.loads((run / "metrics.json").read_text())["steps"] == 9


def _scalar_tags(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return set(accumulator.Tags()["tensors"]) | set(accumulator.Tags()["scalars"])


@pytest.mark.slow
def test_train_evaluate_and_average_from_the_command_line(artifacts, tmp_path, capsys):
    from training import average_checkpoints, evaluate

    run = tmp_path / "run"
    shutil.copytree(artifacts.tf_run, run)  # averaging writes into it
    metrics = json.loads((run / "metrics.json").read_text())
    assert {"bleu", "chrf", "signature", "chrf_signature", "steps", "train_seconds", "dev_bleu"} <= set(metrics)
    assert metrics["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert metrics["steps"] == 160 and metrics["sentences"] == 1000
    assert len((run / "translations.test.txt").read_text().splitlines()) == 1000
    assert {"loss", "learning_rate", "target_tokens_per_second", "dropped_pairs"} <= _scalar_tags(run / "logs" / "train")
    assert {"bleu", "chrf"} <= _scalar_tags(run / "logs" / "dev")
    printed = artifacts.output("tensorflow")  # what `python -m training.train` printed
    assert "160/160" in printed and f"Test BLEU {metrics['bleu']}" in printed

    capsys.readouterr()
    average_checkpoints.main(["--run-dir", str(run), "--last", "3"])
    assert "Averaged 3 checkpoints (ckpt-120, ckpt-140, ckpt-160)" in capsys.readouterr().out
    evaluate.main(["--run-dir", str(run), "--split", "dev", "--limit", "30"])
    out = capsys.readouterr().out
    dev = json.loads(out[out.index("{") :])
    assert dev["sentences"] == 30 and dev["checkpoint"].endswith("averaged/ckpt-160.weights.h5")


def test_average_checkpoints_is_the_mean_and_is_used_only_while_newest(tmp_path, capsys):
    import tensorflow as tf

    from keras_transformer import Transformer, TransformerConfig
    from training.average_checkpoints import average_checkpoints
    from training.run_folder import RunFolder

    run = RunFolder(str(tmp_path))
    config = TransformerConfig.tiny(50, d_model=16, d_ff=32, num_layers=1)
    run.write_json(run.config_path, config.to_dict())
    models = [Transformer(config) for _ in range(4)]
    for step, model in enumerate(models[:3], start=1):
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), run.checkpoint_dir, max_to_keep=5)
        manager.save(checkpoint_number=step)
    average_checkpoints(str(tmp_path), last=2)
    averaged, path = run.load_model()
    assert path.endswith("averaged/ckpt-3.weights.h5")
    for mean, second, third in zip(averaged.get_weights(), models[1].get_weights(), models[2].get_weights()):
        np.testing.assert_allclose(mean, (second + third) / 2, rtol=1e-6)
    assert run.averaged()[1] == [2, 3]

    # Training goes on past the average: the newer checkpoint wins, and the command says why.
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=models[3]), run.checkpoint_dir, max_to_keep=5)
    manager.save(checkpoint_number=4)
    capsys.readouterr()
    latest, path = run.load_model()
    assert path.endswith("checkpoints/ckpt-4")
    assert f"the average in {run.averaged_dir} is of steps [2, 3], older" in capsys.readouterr().err
    for loaded, newest in zip(latest.get_weights(), models[3].get_weights()):
        np.testing.assert_array_equal(loaded, newest)


@pytest.mark.slow
def test_a_run_folder_on_a_filesystem_that_is_not_posix_trains_resumes_averages_and_exports_as_a_local_one(
    synthetic_corpus, tmp_path, capsys
):
    """TensorFlow's in-memory filesystem (ram://) stands in for a bucket: no POSIX calls, and a
    folder cannot be renamed. A text-file corpus, so that the cut is written there too. The same
    run in a local folder, never interrupted, ends with the same weights and translations. Each
    update is made of two batches: checkpoints fall between updates, so the resumed run reads the
    batches of its next update as the run never stopped does."""
    import tensorflow as tf

    from export.saved_model import export
    from keras_transformer.search import DecodingSettings
    from training import evaluate, learning_curve
    from training.average_checkpoints import average_checkpoints
    from training.evaluate import make_translator
    from training.run_folder import RunFolder
    from training.train import parse_args, train

    data = tmp_path / "data"
    data.mkdir()
    for side, lang in enumerate(("en", "de")):
        for split, count in (("train", 600), ("dev", 4), ("test", 4)):
            (data / f"{split}.{lang}").write_text("".join(pair[side] + "\n" for pair in synthetic_corpus.text_pairs(split, count)))
    flags = [*MECHANICS, "--dataset", str(data), "--source-lang", "en", "--target-lang", "de", "--checkpoint-every", "4",
             "--accumulate-steps", "2", "--batch-tokens", "1024", "--no-evaluate", "--no-xla"]  # fmt: skip
    run_dir, local_dir = "ram://runs/remote", str(tmp_path / "local")
    train(parse_args(["--run-dir", run_dir, *flags, "--steps", "4"]))
    _, metrics = train(parse_args(["--run-dir", run_dir, *flags, "--steps", "8"]))
    assert f"Resumed from {run_dir}/checkpoints/ckpt-4 at step 4." in capsys.readouterr().out
    assert metrics["steps"] == 8
    run = RunFolder(run_dir)
    assert [step for step, _ in run.checkpoints()] == [4, 8]
    assert tf.io.gfile.exists(f"{run_dir}/data/text/index.json") and tf.io.gfile.glob(f"{run_dir}/data/tokenized-*/shard-00000.tfrecord")
    assert tf.io.gfile.glob(f"{run_dir}/logs/train/events.out.tfevents.*")

    saved, _ = average_checkpoints(run_dir, last=2)
    assert saved == f"{run_dir}/averaged/ckpt-8.weights.h5" and run.latest_checkpoint() == saved
    for split in ("dev", "test"):
        evaluate.main(["--run-dir", run_dir, "--split", split, "--beam-size", "1", "--max-length-b", "4", "--no-xla"])
        assert len(tf.io.gfile.GFile(run.translations_path(split)).read().splitlines()) == 4
    assert learning_curve.plot(run_dir) == run.learning_curve_path and tf.io.gfile.exists(run.learning_curve_path)
    metrics = json.loads(tf.io.gfile.GFile(run.metrics_path).read())  # every writer's values, each kept
    assert metrics["steps"] == 8 and "train_seconds" in metrics  # training.train
    assert metrics["averaged_checkpoints"] == ["ckpt-4", "ckpt-8"]  # training.average_checkpoints
    assert {"bleu", "chrf", "dev_bleu", "dev_chrf"} <= set(metrics)  # training.evaluate on each split
    greedy = DecodingSettings(beam_size=1)  # what is checked is the run folder, not the search
    served = tf.saved_model.load(export(run_dir, str(tmp_path / "exports"), greedy))
    assert not os.path.exists("ram:") and not os.path.exists(os.path.join(ROOT, "ram:"))  # nothing went to a local "ram:" folder

    train(parse_args(["--run-dir", local_dir, *flags, "--steps", "8"]))
    average_checkpoints(local_dir, last=2)
    local = RunFolder(local_dir)
    for checkpoint in ("checkpoints/ckpt-8", "averaged/ckpt-8.weights.h5"):
        _assert_same_weights(_weights(run_dir, f"{run_dir}/{checkpoint}"), _weights(local_dir, f"{local_dir}/{checkpoint}"))
    sources = [source for source, _ in synthetic_corpus.text_pairs("test", 16)]
    result = served.signatures["serving_default"](text=tf.constant(sources))
    model, _ = local.load_model()  # the averaged weights, as exported, with the export's (default) decoding
    expected, scores = make_translator(model, local.load_tokenizer(), greedy, jit_compile=False)(sources)
    assert [t.decode() for t in result["translation"].numpy()] == expected
    np.testing.assert_allclose(result["score"].numpy(), scores, rtol=1e-4)


@pytest.mark.slow
def test_a_run_folder_of_older_code_resumes_with_another_warmup_which_is_reported_and_followed(artifacts, tmp_path, capsys):
    """The shared run's folder with training.json as code before the resume record wrote it (the
    last settings alone, without the settings recorded since), resumed for 4 steps with another
    --warmup-steps."""
    import tensorflow as tf

    from training import train
    from training.learning_curve import read_scalars
    from training.run_folder import RunFolder
    from training.schedule import TransformerSchedule

    folder = tmp_path / "run"
    shutil.copytree(artifacts.tf_run, folder)
    run = RunFolder(str(folder))
    older = {name: value for name, value in run.settings().items() if name not in ("backend", "processes")}
    run.write_json(run.settings_path, older)
    capsys.readouterr()
    train.main(["--run-dir", str(folder), *TINY, "--steps", "164", "--warmup-steps", "50", "--no-evaluate", "--no-xla"])
    out = capsys.readouterr().out
    assert f"Resumed with warmup_steps 50 (it was {older['warmup_steps']}): the run follows it from step 160 on." in out
    assert out.index("Resumed with warmup_steps") < out.index("Saved checkpoint")
    segments = run.segments()
    assert [(s["started"] is None, s["step"], s["settings"]["warmup_steps"]) for s in segments] == [
        (True, 0, older["warmup_steps"]), (False, 160, 50)]  # fmt: skip
    logged = read_scalars(os.path.join(run.log_dir, "train"))["learning_rate"][164]
    schedule = [TransformerSchedule(run.config().d_model, warmup, older["learning_rate_scale"]) for warmup in (50, older["warmup_steps"])]
    new, old = (float(tf.convert_to_tensor(s(164))) for s in schedule)
    np.testing.assert_allclose(logged, new, rtol=1e-6)
    assert abs(new - old) > 1e-2 * old


@pytest.mark.slow
def test_a_run_started_from_another_has_its_weights_tokenizer_and_a_fresh_optimizer_at_step_0(
        artifacts, synthetic_sentencepiece, tmp_path, capsys):  # fmt: skip
    import tensorflow as tf

    from keras_transformer import Transformer, TransformerConfig
    from training.schedule import TransformerSchedule, paper_optimizer
    from training.train import fine_tuned_config, initial_checkpoint, parse_args, train

    source = RunFolder(artifacts.tf_run)
    assert source.checkpoint("140").endswith("ckpt-140") and source.checkpoint("latest").endswith("ckpt-160")
    for name, error in (("7", "no checkpoint of step 7; it has steps 20, 40,"), ("averaged", "no averaged checkpoint")):
        with pytest.raises(ValueError, match=error):
            source.checkpoint(name)
    flags = [*MECHANICS, "--steps", "4", "--checkpoint-every", "2", "--steps-per-call", "2", "--warmup-steps", "10",
             "--no-evaluate", "--encoder-layers", "2", "--decoder-layers", "2", "--no-xla"]  # fmt: skip  (the recipe's depths)
    run_dir = tmp_path / "tuned"
    # A named checkpoint, not the latest: step 0 must hold its weights, not step 160's.
    train(parse_args(["--run-dir", str(run_dir), *flags, "--init-from", f"{artifacts.tf_run}:140"]))
    run = RunFolder(str(run_dir))
    assert f"Started from {source.checkpoint('140')} (step 140 of {artifacts.tf_run}) with a fresh optimizer" \
        in capsys.readouterr().out  # fmt: skip
    assert [step for step, _ in run.checkpoints()] == [0, 2, 4]
    with open(source.tokenizer_path, "rb") as f:
        assert (run_dir / "tokenizer.model").read_bytes() == f.read()
    origin = run.segments()[0]["settings"]["init_from"]
    assert origin == {"run": artifacts.tf_run, "checkpoint": source.checkpoint("140"), "step": 140, "metrics": {}}
    latest = initial_checkpoint(artifacts.tf_run, RunFolder(str(tmp_path / "new")), False, [("en", "de")])  # its metrics
    assert latest["checkpoint"] == source.checkpoint("latest") and latest["metrics"]["bleu"] == source.metrics()["bleu"]

    # Step 0: the source's weights, and an optimizer that has made no update.
    model = Transformer(run.config())
    optimizer = paper_optimizer(TransformerSchedule(run.config().d_model, 10))
    optimizer.build(model.trainable_variables)
    tf.train.Checkpoint(model=model, optimizer=optimizer).restore(run.checkpoint("0")).expect_partial() \
        .assert_existing_objects_matched()  # fmt: skip
    start, _ = source.load_model("140")
    for ours, theirs in zip(model.weights, start.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.path)
    last, _ = source.load_model("latest")
    assert not np.array_equal(model.weights[0].numpy(), last.weights[0].numpy())
    assert int(optimizer.iterations.numpy()) == 0
    assert all(not np.any(variable.numpy()) for variable in optimizer.variables)
    tuned, _ = run.load_model("4")
    assert not np.allclose(tuned.weights[0].numpy(), start.weights[0].numpy())  # it trained on

    # The model is the source's, with this command's dropout and, where positions are sinusoids,
    # max_length; model flags that differ from it, or a run folder with another tokenizer, are
    # refused with what differs.
    source_config = TransformerConfig.tiny(100, d_ff=96)
    tuned = fine_tuned_config(source_config, TransformerConfig.tiny(100, d_model=64, dropout=0.3, max_length=32), {}, "x")
    assert tuned == TransformerConfig.tiny(100, d_ff=96, dropout=0.3, max_length=32)
    learned = lambda length: TransformerConfig.tiny(100, positional_encoding="learned", max_length=length)  # noqa: E731
    with pytest.raises(ValueError, match=r"differs from the flags here \(max_length: 24 there, 32 here\)"):
        fine_tuned_config(learned(24), learned(32), {}, "x")
    with pytest.raises(ValueError, match=r"differs from the flags here \(decoder_layers: 2 there, 1 here\)"):
        fine_tuned_config(source_config, source_config, {"num_layers": 2, "decoder_layers": 1}, "x")
    with pytest.raises(ValueError, match=r"its model differs from the flags here \(d_model: 128 there, 32 here\)"):
        train(parse_args(["--run-dir", str(tmp_path / "other"), *flags, "--d-model", "32", "--init-from", artifacts.tf_run]))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "tokenizer.model").write_bytes(synthetic_sentencepiece)
    with pytest.raises(ValueError, match="tokenizer.model is not the tokenizer of"):
        train(parse_args(["--run-dir", str(tmp_path / "mine"), *flags, "--init-from", f"{artifacts.tf_run}:140"]))


@pytest.mark.slow
def test_early_stopping_keeps_the_best_across_a_resume_and_the_rotation_and_exports_it(tmp_path, capsys, monkeypatch):
    import tensorflow as tf

    from export.saved_model import export
    from keras_transformer.search import DecodingSettings
    from training import evaluate
    from training import train as training
    from training.train import parse_args, train

    scripted, evaluated = {2: 9.0, 4: 12.0, 6: 11.0, 8: 11.5, 10: 11.8}, []  # dev BLEU by step: fake evaluations
    monkeypatch.setattr(training, "_evaluate_dev", lambda *args, **kwargs: evaluated.append(args[7]) or scripted[args[7]])
    test_split = {"bleu": 1.0, "chrf": 2.0, "sentences": 3, "signature": "fake"}  # and a fake test evaluation at the end
    monkeypatch.setattr(training.evaluate, "evaluate_pairs", lambda *args, **kwargs: test_split)
    run_dir = tmp_path / "run"
    flags = ["--run-dir", str(run_dir), *MECHANICS, "--steps", "40", "--checkpoint-every", "4", "--steps-per-call", "2",
             "--eval-every", "2", "--keep-best", "--no-xla"]  # fmt: skip
    # Patience 1: the evaluation at step 6 ends it, with a checkpoint there; the best is step 4's. The
    # end's dev BLEU is step 6's, not evaluated again.
    train(parse_args([*flags, "--early-stop", "1"]))
    run = RunFolder(str(run_dir))
    best = str(run_dir / "best" / "ckpt-4.weights.h5")
    assert (f"Stopped early at step 6: 1 dev evaluations without an improvement of at least 0.0. The best: dev BLEU 12.0 "
            f"at step 4, kept in {best}.") in capsys.readouterr().out  # fmt: skip
    assert evaluated == [2, 4, 6] and run.metrics()["dev_bleu"] == 11.0 and run.metrics()["bleu"] == 1.0
    flags.append("--no-evaluate")
    assert [step for step, _ in run.checkpoints()] == [4, 6] and run.checkpoint("best") == best
    assert run.best() == {"step": 4, "bleu": 12.0, "since": 1, "file": "ckpt-4.weights.h5"}
    kept, _ = run.load_model("best")
    at_4, _ = run.load_model("4")
    for ours, theirs in zip(kept.weights, at_4.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.path)

    # Resumed with patience 3 and one checkpoint kept: it counts on from 1, stops at step 10, and
    # the rotation leaves the best alone.
    train(parse_args([*flags, "--early-stop", "3", "--keep-checkpoints", "1"]))
    assert "Stopped early at step 10: 3 dev evaluations" in capsys.readouterr().out
    assert [step for step, _ in run.checkpoints()] == [10] and run.best()["since"] == 3
    assert sorted(os.listdir(run_dir / "best")) == ["best.json", "ckpt-4.weights.h5"]
    for ours, theirs in zip(run.load_model("best")[0].weights, at_4.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.path)

    # The best exported translates as training.evaluate --checkpoint best does.
    monkeypatch.undo()  # real evaluations from here on
    exported = export(str(run_dir), str(tmp_path / "exports"), DecodingSettings(beam_size=1), checkpoint="best")
    evaluate.main(["--run-dir", str(run_dir), "--split", "dev", "--checkpoint", "best", "--limit", "8", "--beam-size", "1",
                   "--no-xla"])  # fmt: skip
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{") :])["checkpoint"] == best
    sources = [source for source, _ in run.load_corpus().text_pairs("dev", 8)]
    loaded = tf.saved_model.load(exported)  # kept: its functions need it alive
    served = loaded.translate(tf.constant(sources))["translation"].numpy()
    assert [t.decode() for t in served] == (run_dir / "translations.dev.txt").read_text(encoding="utf-8").splitlines()
    # The export holds step 4's weights, which step 10's differ from (they may translate alike).
    exported_weights = [variable.numpy() for variable in loaded.model_variables]
    assert len(exported_weights) == len(at_4.weights)
    assert all(np.array_equal(ours, theirs.numpy()) for ours, theirs in zip(exported_weights, at_4.weights))
    latest, _ = run.load_model("latest")
    assert not all(np.array_equal(ours, theirs.numpy()) for ours, theirs in zip(exported_weights, latest.weights))
    assert training.initial_checkpoint(f"{run_dir}:best", RunFolder(str(tmp_path / "new")), True, [("en", "de")])["checkpoint"] == best


@pytest.mark.slow
def test_separate_vocabularies_learn_a_model_a_side_resume_and_export_as_each_side_reads(tmp_path, capsys):
    """--separate-vocabularies: a SentencePiece model of each side's text and a source embedding
    of its own; the run resumes; the SavedModel and the CTranslate2 export read the source and
    write the target with their own side's model, token for token alike; a shortlist is refused."""
    import tensorflow as tf

    from export import ctranslate2 as conversion
    from export.saved_model import export
    from keras_transformer.search import DecodingSettings
    from training.train import parse_args, train

    run_dir = str(tmp_path / "run")
    flags = [*MECHANICS, "--checkpoint-every", "2", "--steps-per-call", "2", "--no-evaluate", "--no-xla",
             "--separate-vocabularies"]  # fmt: skip
    train(parse_args(["--run-dir", run_dir, *flags, "--steps", "2"]))
    train(parse_args(["--run-dir", run_dir, *flags, "--steps", "4"]))
    assert f"Resumed from {run_dir}/checkpoints/ckpt-2 at step 2." in capsys.readouterr().out
    run = RunFolder(run_dir)
    tokenizer, config = run.load_tokenizer(), run.config()
    assert not tokenizer.one_vocabulary and run.settings()["separate_vocabularies"]
    assert (config.source_vocab_size, config.vocab_size) == (tokenizer.source.vocab_size, tokenizer.target.vocab_size)
    source, target = set(tokenizer.source.piece_list()), set(tokenizer.target.piece_list())
    assert "▁the" in source - target and "▁der" in target - source  # English in, German out
    model, _ = run.load_model()
    assert model.source_embedding.embeddings.shape[0] == config.source_vocab_size

    greedy = DecodingSettings(beam_size=1, max_length_a=0.0, max_length_b=12)  # an untrained model's outputs: 12 pieces
    served = tf.saved_model.load(export(run_dir, str(tmp_path / "exports"), greedy))
    sentences = ["the dog sees the red car .", "a small test"]
    aligned = served.signatures["alignments"](text=tf.constant(sentences))
    pieces = [[p.decode() for p in row if p not in (b"", b"</s>")] for row in aligned["target_pieces"].numpy()]
    ids = [[tokenizer.target.piece_list().index(p) for p in row] for row in pieces]
    assert aligned["translation"].numpy().tolist() == tokenizer.target.detokenize(tf.ragged.constant(ids)).numpy().tolist()
    with pytest.raises(ValueError, match="a SentencePiece model for each side"):
        export(run_dir, str(tmp_path / "exports"), greedy, shortlist="run")
    if not conversion.available():
        pytest.skip(f"the CTranslate2 export's check: ctranslate2 is not installed: {conversion.INSTALL}")
    import ctranslate2
    import sentencepiece

    out = conversion.export(run_dir, str(tmp_path / "ct2"))
    source_model = sentencepiece.SentencePieceProcessor(model_file=os.path.join(out, "sentencepiece.model"))
    results = ctranslate2.Translator(out).translate_batch([source_model.encode(s, out_type=str) for s in sentences],
                                                          beam_size=1, max_decoding_length=12)  # fmt: skip
    assert [result.hypotheses[0] for result in results] == pieces
