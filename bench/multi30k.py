"""Translation quality on real data: Multi30k English -> German, trained from scratch on this
machine within a time budget, scored on test2016.

    python -m bench.multi30k --data ../shared/data/multi30k --run-dir runs/multi30k
    python -m bench.multi30k --smoke    # seconds: a tiny model on a folder made from the synthetic corpus

`--data` is a folder with train.en/.de, val.en/.de and test2016.en/.de (one sentence a line,
raw cased text). The recipe (RECIPE below) is `training.train` with the `small` preset and
--max-minutes; then the last 5 checkpoints are averaged and test2016 is translated with beam
search (beam 4, alpha 0.6). Prints one JSON line: cased sacreBLEU on the raw text with its
signature, chrF, the BLEU of the last checkpoint alone, steps, training and wall time.
Rerunning with the same --run-dir resumes; the budget counts the training time of every run.
"""

import argparse
import os
import tempfile
import time

from training.quiet import quiet_tensorflow

quiet_tensorflow()

import tensorflow as tf  # noqa: E402

from bench.common import emit, peak_rss_mb  # noqa: E402
from keras_transformer.search import DecodingSettings  # noqa: E402
from training import evaluate, synthetic, train  # noqa: E402
from training.average_checkpoints import average_checkpoints  # noqa: E402
from training.run_folder import RunFolder  # noqa: E402

AVERAGE_LAST = 5
# The `small` preset (d_model 256, 3 + 3 layers, 8,000 shared BPE pieces, 3,072-token batches,
# warm-up 1,000) with more dropout than the paper's 0.1, as 29,000 pairs overfit it. No XLA: on
# a CPU it does not speed the step up (bench/README.md) and would compile every bucket's shape.
RECIPE = ["--config", "small", "--dropout", "0.2", "--no-xla", "--max-minutes", "100", "--checkpoint-every", "200",
          "--keep-checkpoints", str(AVERAGE_LAST), "--source-lang", "en", "--target-lang", "de",
          "--dev-split", "val", "--test-split", "test2016", "--no-evaluate"]  # fmt: skip
SMOKE = ["--config", "tiny", "--steps", "6", "--steps-per-call", "2", "--checkpoint-every", "2", "--batch-tokens", "256",
         "--max-length", "24", "--vocab-size", "200", "--strategy", "cpu"]  # fmt: skip
FILES = [f"{split}.{lang}" for split in ("train", "val", "test2016") for lang in ("en", "de")]


def write_smoke_data(directory):
    """A Multi30k-shaped folder of synthetic sentence pairs (the smoke mode's data)."""
    splits = synthetic.generate_splits(seed=0, train=300, dev=8, test=8)
    for split, prefix in (("train", "train"), ("dev", "val"), ("test", "test2016")):
        for side, lang in enumerate(("en", "de")):
            with open(os.path.join(directory, f"{prefix}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(pair[side] + "\n" for pair in splits[split])


def run(data_dir, run_dir, extra_flags=()):
    missing = [name for name in FILES if not os.path.exists(os.path.join(data_dir, name))]
    if missing:
        raise SystemExit(f"error: --data {data_dir} lacks {', '.join(missing)} (Multi30k's file names).")
    start = time.perf_counter()
    args = train.parse_args(["--run-dir", run_dir, "--dataset", data_dir, *RECIPE, *extra_flags])
    _, trained = train.train(args)
    _, averaged_paths = average_checkpoints(run_dir, AVERAGE_LAST)

    folder = RunFolder(run_dir)
    tokenizer, corpus = folder.load_tokenizer(), folder.load_corpus()
    settings = DecodingSettings(args.beam_size, args.alpha)
    last_model, _ = folder.load_model(tf.train.latest_checkpoint(folder.checkpoint_dir))
    last = evaluate.evaluate(last_model, tokenizer, corpus, "test", settings)
    averaged_model, checkpoint = folder.load_model()
    metrics = evaluate.evaluate(averaged_model, tokenizer, corpus, "test", settings,
                                output_path=os.path.join(run_dir, "translations.test.txt"))  # fmt: skip
    metrics.update(checkpoint=checkpoint, steps=trained["steps"], train_seconds=trained["train_seconds"])
    folder.update_metrics(metrics)
    emit(
        {
            "benchmark": "multi30k",
            "test_set": "multi30k test2016 en-de",
            **{name: metrics[name] for name in ("bleu", "signature", "chrf", "chrf_signature", "beam_size", "alpha")},
            "bleu_last_checkpoint": last["bleu"],
            "averaged_checkpoints": len(averaged_paths),
            "steps": trained["steps"],
            "train_seconds": trained["train_seconds"],
            "wall_seconds": round(time.perf_counter() - start, 1),
            "parameters": averaged_model.count_params(),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "recipe": " ".join(RECIPE + list(extra_flags)),
        }
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="the Multi30k folder (here: ../shared/data/multi30k)")
    parser.add_argument("--run-dir", default="runs/multi30k")
    parser.add_argument("--smoke", action="store_true", help="a tiny model on tiny synthetic data, in seconds")
    args, extra_flags = parser.parse_known_args()  # the rest goes to training.train (e.g. --max-minutes 30)
    if args.smoke:
        with tempfile.TemporaryDirectory() as scratch:
            write_smoke_data(scratch)
            run(scratch, os.path.join(scratch, "run"), SMOKE + extra_flags)
        return
    if not args.data:
        parser.error("--data is required (a folder with train.en, train.de, val.*, test2016.*), or --smoke")
    run(args.data, args.run_dir, extra_flags)


if __name__ == "__main__":
    main()
