"""training/supervisor.py: a lost process ends the others with one clear message. The child
processes here stand in for training (they write what JAX's runtime writes, then end as it does);
tests/test_multihost.py kills real training processes."""

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from conftest import ROOT
from training import supervisor
from training.supervisor import EXIT_LOST, LostProcess

# What jaxlib 0.10 writes to standard error when its coordination service ends a process: the
# fatal line (one log message over several lines), then a C++ stack trace.
HEARTBEATS = """\
F1125 21:01:46.518420   30742 client.h:80] Terminating process because the JAX distributed service detected fatal \
errors. This most likely indicates that another task died; see the other task logs for more details. absl::Status: \
UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):
1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to \
debug further.

RPC: /xla.coordination.CoordinationService/PollForError [type.googleapis.com/tensorflow.CoordinationServiceError='']
*** Check failure stack trace: ***
    @     0x7fb657510634  absl::lts_20260107::log_internal::LogMessage::SendToLog()
    @     0x7fb6aa4a71f5  (unknown)
"""
LEADER = """\
F1125 21:02:19.064148   31128 client.h:80] Terminating process because the JAX distributed service detected fatal \
errors. absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was \
preempted/died/restarted unexpectedly or this task is experiencing network issues.
Additional GRPC error information from remote target coordination_service while calling \
/xla.coordination.CoordinationService/PollForError:
:UNKNOWN:Error received from peer  {grpc_message:"Socket closed", grpc_status:14}
*** Check failure stack trace: ***
    @     0x7f10c7fe8634  absl::lts_20260107::log_internal::LogMessage::SendToLog()
"""


def _child(stderr_text, end="os.abort()"):
    """A command that prints a line, writes `stderr_text` to standard error and ends by `end`."""
    script = f"import os, sys; print('step 4', flush=True); sys.stderr.write({stderr_text!r}); sys.stderr.flush(); {end}"
    return [sys.executable, "-c", script]


@pytest.fixture
def run_dir(tmp_path):
    """A run folder with complete checkpoints at steps 4, 8 and 12 (the newest last by number,
    not by name) and an interrupted one at 16."""
    for step in (4, 8, 12, 16):
        (tmp_path / "checkpoints" / f"ckpt-{step}").mkdir(parents=True)
        if step < 16:
            (tmp_path / "checkpoints" / f"ckpt-{step}" / "state.json").write_text("{}")
    return str(tmp_path)


def _resume_lines(run_dir):
    path = os.path.join(run_dir, "checkpoints", "ckpt-12")
    return [f"The last checkpoint every process completed: {path} (step 12).",
            "Rerun the same command on every host to resume from it."]  # fmt: skip


def test_missed_heartbeats_end_in_three_lines_naming_the_lost_process(run_dir, capfd):
    earlier = "a warning the training printed\n"
    assert supervisor.supervise(_child(earlier + HEARTBEATS), run_dir, 0, 2) == EXIT_LOST
    out, err = capfd.readouterr()
    assert out == "step 4\n"
    assert err.startswith(earlier)  # what came before JAX's report passes through
    assert err.strip().splitlines()[-3:] == [
        "Lost process 1 of 2: it stopped sending heartbeats to JAX's coordination service, so process 0 ends too.",
        *_resume_lines(run_dir),
    ]
    assert "Check failure" not in err and "client.h" not in err


def test_a_lost_coordinator_is_named_as_process_0(run_dir, capfd):
    assert supervisor.supervise(_child(LEADER), run_dir, 1, 2) == EXIT_LOST
    assert capfd.readouterr().err.strip().splitlines() == [
        "Lost process 0 of 2, which runs JAX's coordination service (--coordinator-address): it stopped answering, "
        "so process 1 ends too.",
        *_resume_lines(run_dir),
    ]


def test_a_failed_collective_names_itself_and_a_run_without_checkpoints_starts_again(tmp_path, capfd):
    lost = LostProcess("the barrier 'save 8: done'", "Gloo AllGather failed: Connection closed by peer", 1, 2)
    traceback = "Traceback (most recent call last):\n  ...\n"  # a Python report after the line is held back too
    assert supervisor.supervise(_child(lost.report() + "\n" + traceback, end="os._exit(75)"), str(tmp_path), 1, 2) == EXIT_LOST
    assert capfd.readouterr().err.strip().splitlines() == [
        "The barrier 'save 8: done' failed in process 1 of 2 (Gloo AllGather failed: Connection closed by peer): "
        "another process stopped answering, so process 1 ends.",
        "No checkpoint was complete yet.",
        "Rerun the same command on every host to start again (the tokenizer and the tokenized data are kept).",
    ]


def test_processes_found_by_jax_are_named_in_words(run_dir, capfd):
    assert supervisor.supervise(_child(HEARTBEATS), run_dir, None, None) == EXIT_LOST
    first = capfd.readouterr().err.strip().splitlines()[0]
    assert first == "Lost process 1: it stopped sending heartbeats to JAX's coordination service, so this process ends too."


def test_other_failures_pass_through_with_their_status(run_dir, capfd):
    error = "Traceback (most recent call last):\nValueError: a bug\n"
    assert supervisor.supervise(_child(error, end="sys.exit(3)"), run_dir, 0, 2) == 3
    assert capfd.readouterr().err == error
    assert supervisor.supervise(_child("", end="os.kill(os.getpid(), 9)"), run_dir, 0, 2) == 128 + 9
    assert supervisor.supervise(_child(""), run_dir, 0, 2) == 128 + signal.SIGABRT  # an abort, no report


def test_sigterm_reaches_the_training_and_the_watcher_ends_with_it(tmp_path):
    marker = tmp_path / "started"
    child = [sys.executable, "-c", f"import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(60)"]
    watcher = subprocess.Popen([sys.executable, "-m", "training.supervisor", str(tmp_path), "0", "2", "--", *child],
                               cwd=ROOT, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline and watcher.poll() is None, watcher.stderr.read()
            time.sleep(0.05)
        watcher.terminate()
        assert watcher.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        watcher.kill()
    assert subprocess.run(["pgrep", "-f", str(marker)], capture_output=True).returncode == 1  # no training left


def test_a_collective_that_loses_a_peer_raises_lost_process_and_other_errors_stay():
    import jax

    from training.backends.jax import JaxBackend

    backend = SimpleNamespace(process_index=1, num_processes=2)
    with pytest.raises(LostProcess) as raised:
        with JaxBackend._collective(backend, "the barrier 'save 8: done'"):
            raise jax.errors.JaxRuntimeError("UNAVAILABLE: Gloo AllGather failed: Connection closed by peer\nmore")
    assert (raised.value.collective, raised.value.detail) == (
        "the barrier 'save 8: done'", "UNAVAILABLE: Gloo AllGather failed: Connection closed by peer")  # fmt: skip
    with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED"):  # not a lost process
        with JaxBackend._collective(backend, "the training steps' gradient all-reduce"):
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 4 GiB")
    one = SimpleNamespace(process_index=0, num_processes=1)
    with pytest.raises(jax.errors.JaxRuntimeError):  # a single process has no peer to lose
        with JaxBackend._collective(one, "the barrier 'restore'"):
            raise jax.errors.JaxRuntimeError("UNAVAILABLE: connection reset")
