"""What every benchmark shares: timing, peak memory, one JSON line per measurement."""

import contextlib
import importlib
import io
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time


def with_xla_flags(env, *flags):
    """`env`, a mapping of environment variables, with `flags` added to its XLA_FLAGS (read by
    TensorFlow's and JAX's XLA alike)."""
    names = {flag.split("=")[0] for flag in flags}
    kept = [flag for flag in env.get("XLA_FLAGS", "").split() if flag.split("=")[0] not in names]
    return {**env, "XLA_FLAGS": " ".join([*kept, *flags])}


def peak_rss_mb():
    """This process's peak resident memory in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextlib.contextmanager
def held_port():
    """A free port on 127.0.0.1, kept bound by this process (SO_REUSEPORT, never listening) while
    open, so that no other process takes it between this choice and the server's bind. For
    gRPC servers that bind with SO_REUSEPORT, as JAX's coordination service does (TensorFlow's
    servers do not: their tests retry)."""
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def time_call(fn, repeats):
    """Calls `fn` once to compile and warm up, then `repeats` times; returns the median seconds."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def in_turn(names, round_):
    """The order in which round `round_` measures the systems `names`: as given, reversed every
    other round, so that no system is always measured first (a cold cache) or last."""
    return list(names)[:: -1 if round_ % 2 else 1]


def timed_rounds(calls, requests, rounds):
    """Sentences per second of each of `calls` (name -> function of a request) over all of
    `requests` (vectors of sentences), once a round in `in_turn` order: {name: [a round's]}."""
    sentences = sum(len(request) for request in requests)
    speeds = {name: [] for name in calls}
    for round_ in range(rounds):
        for name in in_turn(calls, round_):
            start = time.perf_counter()
            for request in requests:
                calls[name](request)
            speeds[name].append(sentences / (time.perf_counter() - start))
    return speeds


def ratio_summary(ratios, digits=3):
    """Same-round ratios' median and range: what a benchmark reports of a comparison."""
    return {"median_ratio": round(statistics.median(ratios), digits),
            "ratio_range": [round(min(ratios), digits), round(max(ratios), digits)]}  # fmt: skip


def emit(record):
    """Prints one measurement as a JSON line, with the machine it ran on."""
    record = {**record, "cpus": os.cpu_count(), "machine": platform.machine()}
    print(json.dumps(record, sort_keys=True), flush=True)


# Set by `python -m bench` (bench/__main__.py), which runs the smoke modes in one process: a
# measurement that needs no environment of its own then runs in this process too.
ONE_PROCESS = False


def run_isolated(module, args, env=None):
    """Runs `python -m module args` in a fresh process (so peak memory is its own), with `env`
    added to the environment, passes its JSON lines through, and returns them as dicts. Under
    ONE_PROCESS, with no `env` that differs from this process's, calls `module.main(args)` here."""
    if ONE_PROCESS and all(os.environ.get(name) == value for name, value in (env or {}).items()):
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            importlib.import_module(module).main(args)
        stdout = output.getvalue()
    else:
        command = [sys.executable, "-m", module, *args]
        result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
        if result.returncode:
            raise SystemExit(f"{' '.join(command[1:])} failed:\n{result.stderr[-3000:]}")
        stdout = result.stdout
        for line in result.stderr.splitlines():  # a skipped reference row says why
            if "not installed" in line:
                print(line, file=sys.stderr, flush=True)
    records = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            print(line, flush=True)
            records.append(json.loads(line))
    return records
