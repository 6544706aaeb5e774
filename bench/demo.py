"""The README's main job as a user runs it, under several seeds and both backends: the first
command (`python -m training.train --run-dir DIR`), its export and the translation of the README's
two sentences, each a process of its own. What the README promises of it holds when every run
reaches test BLEU >= 95 and translates both sentences exactly.

    python -m bench.demo                                  # seeds 1, 2, 3 on TensorFlow, seed 0 on JAX
    python -m bench.demo --runs tf:0 --max-isa AVX2       # an AVX2 CPU's kernels on an AVX-512 one

`--max-isa AVX2` caps XLA's code generation and oneDNN at AVX2 (XLA_FLAGS=--xla_cpu_max_isa,
ONEDNN_MAX_CPU_ISA): the rounding of a CPU without AVX-512, whose different sums are what a
recipe that ends at a noisy point is sensitive to. Other flags go to training.train. A JSON line
a run: its BLEU, training seconds (metrics.json's `train_seconds`) and the first command's wall
time, and whether each sentence came out as the README says.
"""

import argparse
import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time

from bench import common

# The README's sentences (its third command) and the translations it shows.
SENTENCES = {
    "Yesterday the small dog saw the red car.": "Gestern sah der kleine Hund das rote Auto.",
    "I think that my friends help the old teacher in the park.": "Ich denke, dass meine Freunde dem alten Lehrer im Park helfen.",
}  # fmt: skip
PROMISED_BLEU = 95.0
DEFAULT_RUNS = "tf:1,tf:2,tf:3,jax:0"
BACKENDS = {"tf": "tensorflow", "jax": "jax"}
TIMEOUT_SECONDS = 1800  # each command's


def parse_runs(value):
    """"tf:1,jax:0" -> [("tensorflow", 1), ("jax", 0)]."""
    runs = []
    for item in value.split(","):
        backend, _, seed = item.strip().partition(":")
        if backend not in BACKENDS or not seed.isdigit():
            raise argparse.ArgumentTypeError(f"--runs: {item!r} is not BACKEND:SEED with BACKEND tf or jax")
        runs.append((BACKENDS[backend], int(seed)))
    return runs


def command(module, *args, env):
    """Runs `python -m module args` with `env`; returns its standard output, or ends naming it.
    Under `common.ONE_PROCESS` (the smoke modes), with this process' environment, calls its `main`
    here instead."""
    if common.ONE_PROCESS and env == os.environ:
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            importlib.import_module(module if module != "export" else "export.__main__").main(list(args))
        return output.getvalue()
    line = [sys.executable, "-m", module, *args]
    result = subprocess.run(line, capture_output=True, text=True, env=env, timeout=TIMEOUT_SECONDS)
    if result.returncode:
        raise SystemExit(f"{' '.join(line[1:])} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)  # fmt: skip
    parser.add_argument("--runs", type=parse_runs, default=parse_runs(DEFAULT_RUNS), help=f"BACKEND:SEED,... "
                        f"(default {DEFAULT_RUNS})")  # fmt: skip
    parser.add_argument("--max-isa", help="cap XLA's and oneDNN's CPU instructions (AVX2: a CPU without AVX-512)")
    parser.add_argument("--run-dir", help="a folder for the runs and exports (default: a temporary one)")
    args, train_flags = parser.parse_known_args(argv)
    env = dict(os.environ)
    if args.max_isa:
        env = common.with_xla_flags(env, f"--xla_cpu_max_isa={args.max_isa}")
        env["ONEDNN_MAX_CPU_ISA"] = args.max_isa
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.run_dir or scratch
        for backend, seed in args.runs:
            name = f"{backend}-seed{seed}" + (f"-{args.max_isa.lower()}" if args.max_isa else "")
            run_dir, export_dir = os.path.join(folder, name), os.path.join(folder, name + "-export")
            start = time.perf_counter()
            command("training.train", "--run-dir", run_dir, "--seed", str(seed), "--backend", backend, *train_flags, env=env)
            wall = time.perf_counter() - start
            with open(os.path.join(run_dir, "metrics.json"), encoding="utf-8") as f:
                metrics = json.load(f)
            command("export", "--run-dir", run_dir, "--out", export_dir, env=env)
            translations = command("export.translate", export_dir, *SENTENCES, env=env).splitlines()
            exact = [got == want for got, want in zip(translations, SENTENCES.values(), strict=True)]
            bleu = metrics.get("bleu")  # None with --no-evaluate (the smoke mode)
            common.emit({"benchmark": "demo", "backend": backend, "seed": seed, "max_isa": args.max_isa, "bleu": bleu,
                         "signature": metrics.get("signature"), "checkpoint": metrics.get("checkpoint"),
                         "train_seconds": metrics["train_seconds"], "first_command_wall_seconds": round(wall, 1),
                         "sentences_exact": sum(exact), "translations": translations,
                         "holds": bleu is not None and bleu >= PROMISED_BLEU and all(exact)})  # fmt: skip


if __name__ == "__main__":
    main()
