"""WMT-size corpora: peak host memory and time to the first training step of `training.train`
(`--config base --vocab-size 37000`), on text files of millions of pairs made by repeating
Multi30k's training split (the paper's WMT14 EN-DE has 4.5M pairs, EN-FR 36M).

    python -m bench.corpus_scale --data ../shared/data/multi30k --pairs 4500000 18000000

Each size trains one step in a fresh process and a new run folder (its peak RSS its own, from
`wait4`): reading and cutting the files, the tokenizer, compiling, the first shards, each timed
from the lines it prints. Then `python -m training.shortlist` learns the run's vocabulary
shortlist in a fresh process of its own (its time and peak RSS). `--gzip` compresses the
training files first, as WMT ships them.
"""

import argparse
import glob
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from bench.common import emit
from training.shards import TextFileShards

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_corpus(source_dir, pairs, directory, compress=False):
    """DIR/train.en, train.de (.gz with `compress`) of `pairs` pairs, Multi30k's repeated; its
    val and test2016 splits beside them."""
    os.makedirs(directory, exist_ok=True)
    for lang in ("en", "de"):
        with open(os.path.join(source_dir, f"train.{lang}"), "rb") as f:
            lines = f.read().splitlines(keepends=True)
        repeats, rest = divmod(pairs, len(lines))
        block = b"".join(lines)
        name = os.path.join(directory, f"train.{lang}" + (".gz" if compress else ""))
        with gzip.open(name, "wb", compresslevel=1) if compress else open(name, "wb") as out:
            for _ in range(repeats):
                out.write(block)
            out.write(b"".join(lines[:rest]))
        for split in ("val", "test2016"):
            shutil.copy(os.path.join(source_dir, f"{split}.{lang}"), directory)


# The lines of training.train's output that start its phases (bench/README.md, "WMT-size corpora").
PHASES = {"tokenizer_start": "Training a SentencePiece tokenizer", "tokenizer_done": "Trained the tokenizer",
          "steps_start": re.compile(r"(?<![0-9])0/1\b"), "first_step": "loss:"}  # fmt: skip


def watched(module, flags, phases=(), limit_seconds=3600):
    """Runs `python -m module flags` (killed after `limit_seconds`); returns the seconds to each of
    `phases`' texts in its output, its peak RSS in MiB when the progress bar first shows (before
    the first step) and in all (this process's own, from `wait4`), and its seconds in all."""
    start = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", module, *flags], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)  # fmt: skip
    timer = threading.Timer(limit_seconds, process.kill)
    timer.start()
    seen, output, peak_before_steps, phases = {}, "", None, dict(phases)
    # Read as it comes, not by lines: the progress bar ends its lines later.
    while chunk := os.read(process.stdout.fileno(), 1 << 16):
        output += chunk.decode("utf-8", "replace")
        for phase, text in phases.items():
            if phase not in seen and (text.search(output) if isinstance(text, re.Pattern) else text in output):
                seen[phase] = round(time.monotonic() - start, 1)
                if phase == "steps_start":  # the progress bar, drawn before the first step: the peak so far
                    peak_before_steps = _peak_rss_mb(process.pid)
    _, status, usage = os.wait4(process.pid, 0)
    timer.cancel()
    if status:
        raise SystemExit(f"{module} exited with {os.waitstatus_to_exitcode(status)}:\n{output[-5000:]}")
    return seen, peak_before_steps, usage.ru_maxrss / 1024, round(time.monotonic() - start, 1)


def _peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a Multi30k folder (train, val and test2016 .en / .de)")
    parser.add_argument("--pairs", type=int, nargs="+", default=[4_500_000, 18_000_000])
    parser.add_argument("--config", default="base")
    parser.add_argument("--vocab-size", type=int, default=37_000)
    parser.add_argument("--batch-tokens", type=int, default=4096,
                        help="of the one step (the paper's 25,000 need about 30 GB for base on a CPU)")
    parser.add_argument("--gzip", action="store_true", help="gzip the training files")
    parser.add_argument("--scratch", help="where corpora and run folders go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the corpora and run folders")
    args = parser.parse_args(argv)
    scratch = args.scratch or tempfile.mkdtemp(prefix="corpus-scale-")
    try:
        for pairs in args.pairs:
            corpus = os.path.join(scratch, f"corpus-{pairs}")
            make_corpus(args.data, pairs, corpus, args.gzip)
            run_dir = os.path.join(scratch, f"run-{pairs}")
            shutil.rmtree(run_dir, ignore_errors=True)
            flags = ["--run-dir", run_dir, "--dataset", corpus, "--source-lang", "en", "--target-lang", "de", "--dev-split",
                     "val", "--test-split", "test2016", "--config", args.config, "--vocab-size", str(args.vocab_size),
                     "--batch-tokens", str(args.batch_tokens), "--steps", "1", "--steps-per-call", "1", "--checkpoint-every",
                     "1", "--no-evaluate"]  # fmt: skip
            phases, peak_before_steps, peak_mb, _ = watched("training.train", flags, PHASES)
            _, _, shortlist_peak_mb, shortlist_s = watched("training.shortlist", ["--run-dir", run_dir])
            emit({"benchmark": "corpus_scale", "pairs": pairs, "gzip": args.gzip, "config": args.config,
                  "vocab_size": args.vocab_size, "read_and_cut_s": phases.get("tokenizer_start"),
                  "tokenizer_s": round(phases["tokenizer_done"] - phases["tokenizer_start"], 1),
                  "first_step_s": phases["first_step"], "batch_tokens": args.batch_tokens,
                  "peak_rss_before_first_step_mb": round(peak_before_steps), "peak_rss_mb": round(peak_mb),
                  "tokenized_shards_written": len(glob.glob(os.path.join(run_dir, "data", "tokenized-*", "shard-*.tfrecord"))),
                  "shards": len(TextFileShards(os.path.join(run_dir, "data", "text")).shard_sizes),
                  "shortlist_s": shortlist_s, "shortlist_peak_rss_mb": round(shortlist_peak_mb)})  # fmt: skip
            if not args.keep:
                shutil.rmtree(corpus, ignore_errors=True)
                shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        if not args.keep and not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
