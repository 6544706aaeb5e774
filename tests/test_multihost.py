"""Training across hosts under JAX, as several processes on 127.0.0.1 (JAX's multi-controller
runtime, CPU collectives over gloo): two processes of two host devices each train as one process
of four devices does on the same global batches, resume where a killed run stopped, and end with
one clear message when a peer dies (training/supervisor.py). The runs start from the suite's JAX
run (`--init-from`), so that a start from another run is checked across processes too."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from artifacts import MARIAN
from bench.common import held_port, with_xla_flags
from training.recipes import MECHANICS
from conftest import ROOT, WORKER
from keras_transformer import Transformer
from training.run_folder import RunFolder
from training.supervisor import EXIT_LOST, JAX_FATAL, MARKER

# training/recipes.py's MECHANICS, shorter.
FLAGS = [*MECHANICS, "--steps", "24", "--checkpoint-every", "4", "--no-evaluate"]
# The uninterrupted run, its one-process reference and the killed run make each update from two
# batches, so that accumulation across processes and its resume are checked too (MECHANICS'
# 512-token batches), 12 of them: the 24 batches of the others.
ACCUMULATED = ["--accumulate-steps", "2", "--batch-tokens", "1024", "--steps", "12"]
LIMIT_SECONDS = 600  # each process a test starts ends by itself within this
TRAINER = os.path.join(ROOT, "tests", "multiworker_worker.py")  # training.train, recording the shards written
# One worker runs them all: two of them compare with the two_processes module fixture's run.
pytestmark = pytest.mark.xdist_group("multihost")


def _environment(devices):
    return with_xla_flags({**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": ROOT},
                          f"--xla_force_host_platform_device_count={devices}")


@contextlib.contextmanager
def _processes(run_dir, corpus, *flags, command=None):
    """While open, two processes of `training.train` with two host devices each, joined on
    127.0.0.1, on the folder `corpus` (None: the built-in corpus); killed if still running at the
    end. `command` is what runs the training; by default tests/multiworker_worker.py, which
    writes the numbers of the shards it tokenized to RUN_DIR/../shards-written-INDEX.json."""
    with held_port() as port:
        processes = _start(f"127.0.0.1:{port}", run_dir, corpus, *flags, command=command)
        try:
            yield processes
        finally:
            for process in processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.communicate()


def _start(address, run_dir, corpus, *flags, command=None):
    dataset = [] if corpus is None else ["--dataset", str(corpus), "--source-lang", "en", "--target-lang", "de"]

    def arguments(index):
        if command is not None:
            return command
        return [TRAINER, "--shards-written", str(run_dir.parent / f"shards-written-{index}.json")]

    return [
        subprocess.Popen(
            ["timeout", str(LIMIT_SECONDS), sys.executable, *arguments(index), "--run-dir", str(run_dir), *dataset,
             *FLAGS, *flags, "--processes", "2", "--coordinator-address", address, "--process-id", str(index)],
            cwd=ROOT, env=_environment(2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # a group of its own: `timeout` and the training process are killed together
        )  # fmt: skip
        for index in range(2)
    ]


def _run(run_dir, corpus, *flags):
    """The outputs of two processes (`_processes`) run to their end."""
    with _processes(run_dir, corpus, *flags) as processes:
        outputs = [process.communicate(timeout=LIMIT_SECONDS)[0] for process in processes]
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-4000:]
    return outputs


def _weights(run_dir, step):
    run = RunFolder(str(run_dir))
    model = Transformer(run.config())
    model.load_weights(os.path.join(run.checkpoint_dir, f"ckpt-{step}", "model.weights.h5"))
    return [(weight.name, weight.numpy()) for weight in model.weights]


@pytest.fixture(scope="module")
def corpus(three_shard_corpus):
    return three_shard_corpus


@pytest.fixture(scope="module")
def accumulated(artifacts):
    """ACCUMULATED, started from the suite's JAX run (of the same model: Marian's options)."""
    return [*ACCUMULATED, *MARIAN, "--init-from", artifacts.jax_run]


@pytest.fixture(scope="module")
def two_processes(corpus, accumulated, tmp_path_factory):
    """A run of 12 updates of 2 batches by two processes from the suite's JAX run, never interrupted,
    ending with the average of its last 2 checkpoints."""
    run_dir = tmp_path_factory.mktemp("two") / "run"
    outputs = _run(run_dir, corpus, *accumulated, "--average-last", "2")
    return run_dir, outputs


@pytest.mark.slow
def test_two_processes_train_as_one_process_of_four_devices(two_processes, corpus, accumulated, artifacts, tmp_path):
    run_dir, outputs = two_processes
    # Step 0 holds the source's weights, as each process loaded them.
    source = RunFolder(artifacts.jax_run).checkpoint("latest")
    assert f"Started from {source}" in outputs[0] and "Started from" not in outputs[1]
    for (name, ours), (_, theirs) in zip(_weights(run_dir, 0), _weights(artifacts.jax_run, 40)):
        np.testing.assert_array_equal(ours, theirs, err_msg=name)
    # One process speaks: the bar and the checkpoints are printed by process 0 alone.
    assert "Saved checkpoint" in outputs[0] and "Saved checkpoint" not in outputs[1]
    assert "12/12" in outputs[0] and "12/12" not in outputs[1]
    assert RunFolder(str(run_dir)).settings()["processes"] == 2
    # Each process wrote the shards of its own share: 0 and 2, and 1.
    written = [json.loads((run_dir.parent / f"shards-written-{index}.json").read_text()) for index in range(2)]
    assert written == [[0, 2], [1]]
    tokenized = next((run_dir / "data").glob("tokenized-*"))
    assert sorted(p.name for p in tokenized.iterdir()) == [f"shard-0000{i}.tfrecord" for i in range(3)]

    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "tokenizer.model").write_bytes((run_dir / "tokenizer.model").read_bytes())
    result = subprocess.run(
        ["timeout", str(LIMIT_SECONDS), sys.executable, WORKER, "two-shares", str(reference), "--dataset", str(corpus),
         "--source-lang", "en", "--target-lang", "de", *FLAGS, *accumulated],
        cwd=ROOT, env=_environment(4), capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    for (name, two), (_, one) in zip(_weights(run_dir, 12), _weights(reference, 12)):
        # As test_jax: a key bias has no gradient in exact arithmetic, so Adam steps on float noise.
        atol = 1e-2 if name.endswith("key_bias") else 1e-4
        np.testing.assert_allclose(two, one, rtol=1e-4, atol=atol, err_msg=name)
    assert not np.allclose(_weights(run_dir, 4)[0][1], _weights(run_dir, 12)[0][1])  # it trained

    # Process 0 averaged the last 2 checkpoints; process 1 waited for the file and loaded it too (else it would
    # have failed to read it).
    averaged = RunFolder(str(run_dir)).checkpoint("averaged")
    assert f"Averaged the last 2 checkpoints (steps 8, 12) into {averaged}." in outputs[0]
    assert "Averaged" not in outputs[1]
    model = Transformer(RunFolder(str(run_dir)).config())
    model.load_weights(averaged)
    for weight, (_, at_8), (_, at_12) in zip(model.weights, _weights(run_dir, 8), _weights(run_dir, 12)):
        np.testing.assert_allclose(weight.numpy(), (at_8 + at_12) / 2, rtol=1e-6, atol=1e-7, err_msg=weight.name)


def _kill_after_the_first_checkpoint(run_dir, corpus, killed, *flags, ends_within):
    """Starts two processes as the README does (`python -m training.train`, with `flags`), kills
    process `killed` once the first checkpoint is complete; returns the survivor's output and exit
    status. The survivor must end within `ends_within` seconds of the other's death (a bound for a
    hung process, several times what it takes)."""
    with _processes(run_dir, corpus, *flags, command=["-m", "training.train"]) as processes:
        deadline = time.monotonic() + LIMIT_SECONDS
        while not (run_dir / "checkpoints" / "ckpt-4" / "state.json").exists():
            assert time.monotonic() < deadline and processes[0].poll() is None, processes[0].communicate()[0][-4000:]
            time.sleep(0.05)
        os.killpg(processes[killed].pid, signal.SIGKILL)
        survivor = processes[1 - killed]
        try:
            output = survivor.communicate(timeout=ends_within)[0]
        except subprocess.TimeoutExpired:
            pytest.fail(f"process {1 - killed} still ran {ends_within} s after process {killed} was killed")
    return output, survivor.returncode


def _collective_failed(survivor):
    """The first line of the message when process `survivor` (of 2) learns of the other's death
    from a failed collective."""
    return (r"The (barrier '.+'|training steps' gradient all-reduce|broadcast of process 0's training time) failed "
            rf"in process {survivor} of 2 \(.+\): another process stopped answering, so process {survivor} ends\.")


def _last_complete_checkpoint(run_dir):
    """(step, path) of the newest checkpoint folder with its state.json, as the disk holds them."""
    step = max(int(state.parent.name.removeprefix("ckpt-")) for state in (run_dir / "checkpoints").glob("ckpt-*/state.json"))
    return step, str(run_dir / "checkpoints" / f"ckpt-{step}")


def _assert_one_clear_message(output, status, first_line, run_dir):
    """The survivor ended with EXIT_LOST and the message of training/supervisor.py as its last
    lines: who stopped, the checkpoint that a rerun resumes from, what to do; neither a Python
    traceback nor JAX's C++ report with its stack trace."""
    assert status == EXIT_LOST, output[-3000:]
    step, path = _last_complete_checkpoint(run_dir)
    assert output.rstrip().splitlines()[-3:] == [
        first_line,
        f"The last checkpoint every process completed: {path} (step {step}).",
        "Rerun the same command on every host to resume from it.",
    ], output[-3000:]
    for leak in ("Traceback", "Check failure stack trace", JAX_FATAL, MARKER):
        assert leak not in output, output[-3000:]


@pytest.mark.slow
def test_a_killed_coordinator_ends_the_other_clearly_and_the_rerun_resumes_exactly(two_processes, corpus, accumulated,
                                                                                   tmp_path):  # fmt: skip
    run_dir = tmp_path / "run"
    # Process 0 hosts JAX's coordination service: the other ends at once.
    output, status = _kill_after_the_first_checkpoint(run_dir, corpus, 0, *accumulated, ends_within=300)
    # From JAX's coordination service or, if process 1 was inside a collective, from that collective.
    first = output.rstrip().splitlines()[-3]
    coordinator = ("Lost process 0 of 2, which runs JAX's coordination service (--coordinator-address): it stopped "
                   "answering, so process 1 ends too.")  # fmt: skip
    assert first == coordinator or re.fullmatch(_collective_failed(1), first), first
    _assert_one_clear_message(output, status, first, run_dir)
    assert not (run_dir / "checkpoints" / "ckpt-12").exists()

    outputs = _run(run_dir, corpus, *accumulated)
    assert "Resumed from" in outputs[0]
    for (name, resumed), (_, straight) in zip(_weights(run_dir, 12), _weights(two_processes[0], 12)):
        np.testing.assert_allclose(resumed, straight, rtol=1e-4, atol=1e-5, err_msg=name)

    # On another number of processes, the checkpoint is refused, both counts named.
    refused = subprocess.run(
        ["timeout", str(LIMIT_SECONDS), sys.executable, "-m", "training.train", "--run-dir", str(run_dir), "--dataset",
         str(corpus), "--source-lang", "en", "--target-lang", "de", *FLAGS, "--steps", "28"],
        cwd=ROOT, env=_environment(4), capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "processes: 2 in " in refused.stderr and "training.json, 1 now" in refused.stderr


@pytest.mark.slow
def test_a_killed_worker_process_ends_the_coordinator_clearly(tmp_path):
    # The built-in corpus, cut into a share a process. Process 0 learns that process 1 is gone
    # from a failed collective or, at the latest, from the missed heartbeats of JAX's
    # coordination service (here 10 s: the bound is several times that).
    run_dir, heartbeat = tmp_path / "run", 10
    output, status = _kill_after_the_first_checkpoint(run_dir, None, 1, "--heartbeat-seconds", str(heartbeat),
                                                      ends_within=10 * heartbeat + 100)  # fmt: skip
    first = output.rstrip().splitlines()[-3]
    heartbeats = "Lost process 1 of 2: it stopped sending heartbeats to JAX's coordination service, so process 0 ends too."
    assert first == heartbeats or re.fullmatch(_collective_failed(0), first), first
    _assert_one_clear_message(output, status, first, run_dir)
    # Process 0 spoke for both until then. Not "Saved checkpoint": the kill comes once state.json is
    # written, which may be before the save's last barrier and so before process 0 says it.
    assert "4/24" in output
