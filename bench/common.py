"""What every benchmark shares: timing, peak memory, one JSON line per measurement."""

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time


def peak_rss_mb():
    """This process's peak resident memory in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_call(fn, repeats):
    """Calls `fn` once to compile and warm up, then `repeats` times; returns the median seconds."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def emit(record):
    """Prints one measurement as a JSON line, with the machine it ran on."""
    record = {**record, "cpus": os.cpu_count(), "machine": platform.machine()}
    print(json.dumps(record, sort_keys=True), flush=True)


def run_isolated(module, args, env=None):
    """Runs `python -m module args` in a fresh process (so peak memory is its own), with `env`
    added to the environment, and passes its JSON lines through."""
    command = [sys.executable, "-m", module, *args]
    environment = {**os.environ, **(env or {})}
    output = subprocess.run(command, check=True, capture_output=True, text=True, env=environment).stdout
    for line in output.splitlines():
        if line.startswith("{"):
            print(line, flush=True)
