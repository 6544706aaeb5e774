"""A lost host ends in one clear message. Processes that train as one under JAX share their fate:
when one stops answering, JAX's runtime ends every other, from C++, with a fatal log line and a
stack trace (nothing in Python can catch it), or a collective fails in Python with a traceback.
Neither says what to do next.

So `python -m training.train --processes N` (N > 1) runs its training in a child process and
watches it: the child's output passes through unchanged until JAX reports a lost process (its
fatal line, or `LostProcess` from a collective in `training/backends/jax.py`). Then the rest of
the report is held back, and this process ends with exit status `EXIT_LOST` and the lines:

    Lost process 1 of 2: it stopped sending heartbeats to JAX's coordination service, so process 0 ends too.
    The last checkpoint every process completed: runs/x/checkpoints/ckpt-4 (step 4).
    Rerun the same command on every host to resume from it.

This module imports nothing heavy until that message needs the run folder: the watching
process stays small while the child trains.
"""

import json
import os
import re
import signal
import subprocess
import sys

# sysexits' EX_TEMPFAIL: a temporary failure, which the same command retries.
EXIT_LOST = 75
# What JAX's runtime logs before it ends a process whose peer is gone (client.h, jaxlib 0.4-0.10).
JAX_FATAL = "Terminating process because the JAX distributed service detected fatal errors"
# A line the training child writes for a `LostProcess`, followed by its JSON.
MARKER = "keras-transformer lost a process: "
# Set in the child, so that it trains instead of watching.
CHILD_ENVIRONMENT = "KERAS_TRANSFORMER_SUPERVISED"


class LostProcess(RuntimeError):
    """A collective of several processes failed because one of them stopped answering.

    Args:
        collective: what this process was doing with the others ("the barrier 'save 8: done'").
        detail: the first line of the runtime's error.
        process_index, num_processes: this process, of how many.
    """

    def __init__(self, collective, detail, process_index, num_processes):
        self.collective, self.detail = collective, detail
        self.process_index, self.num_processes = process_index, num_processes
        super().__init__(f"{collective} failed in process {process_index} of {num_processes}: {detail}")

    def report(self):
        """The line the child writes for the watching process."""
        return MARKER + json.dumps({"collective": self.collective, "detail": self.detail,
                                    "process_index": self.process_index, "num_processes": self.num_processes})  # fmt: skip


def is_supervised():
    return bool(os.environ.get(CHILD_ENVIRONMENT))


def supervise(command, run_dir, process_index, num_processes):
    """Runs `command` (the training, as a list of arguments) in a child process and returns the
    exit status to end with: the child's own, or `EXIT_LOST` after the message above when JAX
    reported a lost process. SIGTERM and SIGHUP are passed on to the child; SIGINT from a terminal
    reaches it directly (one process group), so this process ignores it."""
    child = subprocess.Popen(command, stderr=subprocess.PIPE, env={**os.environ, CHILD_ENVIRONMENT: "1"},
                             preexec_fn=_end_with_parent)  # fmt: skip
    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    signal.signal(signal.SIGTERM, lambda number, frame: child.send_signal(number))
    signal.signal(signal.SIGHUP, lambda number, frame: child.send_signal(number))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        held = _pass_on(child.stderr)
        status = child.wait()
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    if held is None:
        return status if status >= 0 else 128 - status  # a signal's number, as a shell reports it
    sys.stdout.flush()
    print("\n" + lost_message(held, run_dir, process_index, num_processes), file=sys.stderr, flush=True)
    return EXIT_LOST


def _pass_on(stream):
    """Copies the child's standard error to ours, line by line, until JAX reports a lost process;
    returns the rest (that report), or None if there was none."""
    held = None
    for line in stream:
        text = line.decode(errors="replace")
        if held is None and (JAX_FATAL in text or text.startswith(MARKER)):
            held = []
        if held is None:
            sys.stderr.buffer.write(line)
            sys.stderr.flush()
        else:
            held.append(text)
    return None if held is None else "".join(held)


def lost_message(report, run_dir, process_index=None, num_processes=None):
    """The three lines above, from what the child reported (JAX's fatal log and what followed it,
    or a `LostProcess` line). Without `process_index` and `num_processes` (`--processes auto`,
    where JAX finds them) the words say "this process"."""
    if report.startswith(MARKER):
        lost = json.loads(report[len(MARKER) :].splitlines()[0])
        this = f"process {lost['process_index']}"
        collective = lost["collective"][0].upper() + lost["collective"][1:]
        first = (f"{collective} failed in {this} of {lost['num_processes']} ({lost['detail']}): another process "
                 f"stopped answering, so {this} ends.")  # fmt: skip
    else:
        this = "this process" if process_index is None else f"process {process_index}"
        first = f"{_who_stopped(report, num_processes)}, so {this} ends too."
    return "\n".join([first, *_resume_lines(run_dir)])


def _who_stopped(report, num_processes):
    """Which process JAX's report names, in words."""
    of = "" if num_processes is None else f" of {num_processes}"
    unhealthy = re.search(r"stopped sending heartbeats\):\s*(.*?)\n\s*The tasks", report, re.DOTALL)
    if unhealthy:
        lost = sorted({int(n) for n in re.findall(r"(?:task:)?(\d+)", unhealthy.group(1))})
        names = ", ".join(str(n) for n in lost)
        return f"Lost process {names}{of}: it stopped sending heartbeats to JAX's coordination service"
    if "coordination service" in report and ("leader task" in report or "Failed to send RPC" in report):
        return (f"Lost process 0{of}, which runs JAX's coordination service (--coordinator-address): "
                "it stopped answering")  # fmt: skip
    status = report.split("absl::Status:", 1)[-1].strip().splitlines()
    return f"A process stopped answering (JAX's coordination service: {status[0] if status else 'no detail'})"


def _resume_lines(run_dir):
    """Where a rerun resumes: the newest complete checkpoint in the run folder (any file system)."""
    from keras_transformer.quiet import quiet_tensorflow

    quiet_tensorflow()
    from training.run_folder import RunFolder

    checkpoints = RunFolder(run_dir).checkpoints()
    if not checkpoints:
        return ["No checkpoint was complete yet.",
                "Rerun the same command on every host to start again (the tokenizer and the tokenized data are kept)."]  # fmt: skip
    step, path = checkpoints[-1]
    return [f"The last checkpoint every process completed: {path} (step {step}).",
            "Rerun the same command on every host to resume from it."]  # fmt: skip


def _end_with_parent():
    """In the child: ends it if the watching process dies first (Linux; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def main(argv):
    """`python -m training.supervisor RUN_DIR PROCESS_ID NUM_PROCESSES -- COMMAND...`, the ids
    `auto` where JAX finds them."""
    run_dir, process_index, num_processes, separator, *command = argv
    if separator != "--":
        raise SystemExit(f"usage: {main.__doc__.strip()}")
    number = lambda text: None if text == "auto" else int(text)  # noqa: E731
    sys.exit(supervise(command, run_dir, number(process_index), number(num_processes)))


if __name__ == "__main__":
    main(sys.argv[1:])
