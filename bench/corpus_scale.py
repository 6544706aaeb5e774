"""WMT-size corpora: peak host memory and time to the first training step of `training.train`
(`--config base --vocab-size 37000`), on text files of millions of pairs made by repeating
Multi30k's training split (the paper's WMT14 EN-DE has 4.5M pairs, EN-FR 36M).

    python -m bench.corpus_scale --data ../shared/data/multi30k --pairs 4500000 18000000
    python -m bench.corpus_scale --smoke        # seconds: the synthetic corpus written to files

Each size trains one step in a fresh process and a new run folder (its peak RSS its own, from
`wait4`): reading and cutting the files, the tokenizer, compiling, the first shards, each timed
from the lines it prints. Then `python -m training.shortlist` learns the run's vocabulary
shortlist in a fresh process of its own (its time and peak RSS). `--gzip` compresses the
training files first, as WMT ships them.
"""

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from keras_transformer.quiet import quiet_tensorflow

quiet_tensorflow()

from bench.common import emit  # noqa: E402
from training.shards import TextFileShards  # noqa: E402

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


def time_to_first_step(command, env=None, limit_seconds=3600):
    """Runs `command`; returns (seconds to each phase's line, peak RSS in MiB up to the first
    step and in all, exit code)."""
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, **(env or {})})  # fmt: skip
    timer = threading.Timer(limit_seconds, process.kill)
    timer.start()
    phases, output, peak_before_steps = {}, "", None
    patterns = {"tokenizer_start": "Training a SentencePiece tokenizer", "tokenizer_done": "Trained the tokenizer",
                "steps_start": re.compile(r"(?<![0-9])0/1\b"), "first_step": "loss:"}  # fmt: skip
    # Read as it comes, not by lines: the progress bar ends its lines later.
    while chunk := os.read(process.stdout.fileno(), 1 << 16):
        output += chunk.decode("utf-8", "replace")
        for phase, text in patterns.items():
            if phase not in phases and (text.search(output) if isinstance(text, re.Pattern) else text in output):
                phases[phase] = round(time.monotonic() - start, 1)
                if phase == "steps_start":  # the progress bar, drawn before the first step: the peak so far
                    peak_before_steps = _peak_rss_mb(process.pid)
    _, status, usage = os.wait4(process.pid, 0)
    timer.cancel()
    if status:
        print(output[-5000:], file=sys.stderr)
    return phases, (peak_before_steps, usage.ru_maxrss / 1024), os.waitstatus_to_exitcode(status)


def learn_shortlist(run_dir, limit_seconds=3600):
    """Runs `python -m training.shortlist` on `run_dir`; returns (seconds, peak RSS in MiB)."""
    start = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "training.shortlist", "--run-dir", run_dir], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    timer = threading.Timer(limit_seconds, process.kill)
    timer.start()
    output = process.stdout.read().decode("utf-8", "replace")
    _, status, usage = os.wait4(process.pid, 0)  # this process' own peak, not its siblings'
    timer.cancel()
    if status:
        raise SystemExit(f"training.shortlist exited with {os.waitstatus_to_exitcode(status)}:\n{output[-5000:]}")
    return round(time.monotonic() - start, 1), usage.ru_maxrss / 1024


def _peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="a Multi30k folder (train, val and test2016 .en / .de)")
    parser.add_argument("--pairs", type=int, nargs="+", default=[4_500_000, 18_000_000])
    parser.add_argument("--config", default="base")
    parser.add_argument("--vocab-size", type=int, default=37_000)
    parser.add_argument("--batch-tokens", type=int, default=4096,
                        help="of the one step (the paper's 25,000 need about 30 GB for base on a CPU)")
    parser.add_argument("--gzip", action="store_true", help="gzip the training files")
    parser.add_argument("--scratch", help="where corpora and run folders go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the corpora and run folders")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        from training.synthetic import generate_splits

        args.pairs, args.config, args.vocab_size = [3000], "tiny", 500
    elif not args.data:
        parser.error("--data is required (a Multi30k folder), or --smoke")
    scratch = args.scratch or tempfile.mkdtemp(prefix="corpus-scale-")
    try:
        for pairs in args.pairs:
            corpus = os.path.join(scratch, f"corpus-{pairs}")
            if args.smoke:
                os.makedirs(corpus, exist_ok=True)
                splits = generate_splits(0, train=pairs, dev=10, test=10)
                for split, name in (("train", "train"), ("dev", "val"), ("test", "test2016")):
                    for side, lang in enumerate(("en", "de")):
                        with open(os.path.join(corpus, f"{name}.{lang}"), "w") as f:
                            f.writelines(pair[side] + "\n" for pair in splits[split])
            else:
                make_corpus(args.data, pairs, corpus, args.gzip)
            run_dir = os.path.join(scratch, f"run-{pairs}")
            shutil.rmtree(run_dir, ignore_errors=True)
            command = [sys.executable, "-m", "training.train", "--run-dir", run_dir, "--dataset", corpus,
                       "--source-lang", "en", "--target-lang", "de", "--dev-split", "val", "--test-split", "test2016",
                       "--config", args.config, "--vocab-size", str(args.vocab_size), "--batch-tokens", str(args.batch_tokens), "--steps", "1",
                       "--steps-per-call", "1", "--checkpoint-every", "1", "--no-evaluate"]  # fmt: skip
            phases, (peak_before_steps, peak_mb), code = time_to_first_step(command)
            if code:
                raise SystemExit(f"training.train exited with {code} on {pairs} pairs")
            shortlist_s, shortlist_peak_mb = learn_shortlist(run_dir)
            emit(
                {
                    "benchmark": "corpus_scale",
                    "pairs": pairs,
                    "gzip": args.gzip,
                    "config": args.config,
                    "vocab_size": args.vocab_size,
                    "read_and_cut_s": phases.get("tokenizer_start"),
                    "tokenizer_s": round(phases["tokenizer_done"] - phases["tokenizer_start"], 1),
                    "first_step_s": phases["first_step"],
                    "batch_tokens": args.batch_tokens,
                    "peak_rss_before_first_step_mb": round(peak_before_steps),
                    "peak_rss_mb": round(peak_mb),
                    "tokenized_shards_written": len(_tokenized_files(run_dir)),
                    "shards": len(TextFileShards(os.path.join(run_dir, "data", "text")).shard_sizes),
                    "shortlist_s": shortlist_s,
                    "shortlist_peak_rss_mb": round(shortlist_peak_mb),
                }
            )
            if not args.keep:
                shutil.rmtree(corpus, ignore_errors=True)
                shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        if not args.keep and not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def _tokenized_files(run_dir):
    data = os.path.join(run_dir, "data")
    return [name for folder in os.listdir(data) if folder.startswith("tokenized-")
            for name in os.listdir(os.path.join(data, folder)) if re.fullmatch(r"shard-\d+\.tfrecord", name)]  # fmt: skip


if __name__ == "__main__":
    main()
