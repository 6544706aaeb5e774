"""Translation quality on real data: Multi30k English -> German, trained from scratch on this
machine within a time budget, scored on test2016.

    python -m bench.multi30k --data ../shared/data/multi30k --run-dir runs/multi30k

`training.train` with the `multi30k` preset (RECIPE) and --max-minutes; the last 5 checkpoints
averaged; val chooses the checkpoint, beam and alpha (DECODING_GRID); test2016 is translated once
(with --probe, not at all). One JSON line: cased sacreBLEU, chrF and lowercased BLEU on val and
test2016, steps, times, and the learning curve's PNG. The same --run-dir resumes. Other flags go to
training.train, after the recipe's.
"""

import argparse
import os
import time

import tensorflow as tf

from bench.common import emit, peak_rss_mb
from keras_transformer.search import DecodingSettings
from training import evaluate, learning_curve, train
from training.average_checkpoints import average_checkpoints
from training.run_folder import RunFolder

AVERAGE_LAST = 5
# The `multi30k` preset (4 + 4 layers of width 128, dropout 0.3, 8,000 shared BPE pieces,
# 3,072-token batches, warm-up 1,000) for 108 minutes, leaving the rest of 2 hours to the dev
# curve's evaluations, the averaging and the beam searches. No XLA: on a CPU it does not speed
# the step up (bench/README.md) and would compile every bucket's shape.
RECIPE = ["--config", "multi30k", "--no-xla", "--max-minutes", "108", "--checkpoint-every", "200",
          "--keep-checkpoints", str(AVERAGE_LAST), "--source-lang", "en", "--target-lang", "de",
          "--dev-split", "val", "--eval-every-minutes", "10", "--eval-sentences", "250", "--no-evaluate"]  # fmt: skip
# Beam sizes and alphas tried on val after the paper's (--beam-size, --alpha); test2016 is
# translated once, with the best of them on val.
DECODING_GRID = ((4, 1.0), (8, 0.6), (8, 1.0))
# The test split's file names: ours, then the Multi30k repository's.
TEST_SPLITS = ("test2016", "test_2016_flickr")


def test_split(data_dir):
    """The test split's file prefix in `data_dir`; exits naming the missing files."""
    def missing(splits):
        return [f"{split}.{lang}" for split in splits for lang in ("en", "de")
                if not os.path.exists(os.path.join(data_dir, f"{split}.{lang}"))]  # fmt: skip

    test = next((split for split in TEST_SPLITS if not missing([split])), TEST_SPLITS[0])
    if missing(["train", "val", test]):
        raise SystemExit(f"error: --data {data_dir} lacks {', '.join(missing(['train', 'val', test]))} (Multi30k's "
                         f"file names; the test split may be {' or '.join(TEST_SPLITS)}).")  # fmt: skip
    return test


def run(data_dir, run_dir, extra_flags=(), probe=False):
    """Trains, averages and scores the recipe (with `extra_flags` after it); a `probe` scores
    val only and leaves test2016 unread (for choosing a recipe)."""
    start = time.perf_counter()
    flags = ["--run-dir", run_dir, "--dataset", data_dir, "--test-split", test_split(data_dir), *RECIPE, *extra_flags]
    args = train.parse_args(flags)
    _, trained = train.train(args)
    _, averaged_paths = average_checkpoints(run_dir, AVERAGE_LAST)

    folder = RunFolder(run_dir)
    tokenizer, corpus = folder.load_tokenizer(), folder.load_corpus()
    last_path = tf.train.latest_checkpoint(folder.checkpoint_dir)
    (averaged_model, averaged_path), (last_model, _) = folder.load_model(), folder.load_model(last_path)
    models = {"averaged": averaged_model, "last": last_model}
    grid = () if probe else DECODING_GRID  # probes compare recipes at the paper's decoding
    dev, tried = choose_on_val(models, tokenizer, corpus, DecodingSettings(beam_size=args.beam_size, alpha=args.alpha), grid, run_dir)
    model, settings = models[dev["checkpoint"]], DecodingSettings(beam_size=dev["beam_size"], alpha=dev["alpha"])
    metrics = {
        **evaluate.prefixed(dev, "dev"),
        "dev_tried": [{key: row[key] for key in ("checkpoint", "beam_size", "alpha", "bleu")} for row in tried],
        "checkpoint": averaged_path if dev["checkpoint"] == "averaged" else last_path,
        "steps": trained["steps"],
        "train_seconds": trained["train_seconds"],
    }
    scores = ("bleu", "signature", "chrf", "chrf_signature", "bleu_lowercase", "bleu_lowercase_signature")
    record = {"benchmark": "multi30k_probe" if probe else "multi30k"}
    if not probe:
        test = evaluate.evaluate(model, tokenizer, corpus, "test", settings,
                                 output_path=os.path.join(run_dir, "translations.test.txt"))  # fmt: skip
        metrics.update(test)
        record.update({"test_set": "multi30k test2016 en-de", **{name: test[name] for name in scores}})
    folder.update_metrics(metrics)
    emit({**record, **{f"dev_{name}": dev[name] for name in ("bleu", "chrf", "bleu_lowercase")},
          "dev_bleu_last_checkpoint": tried[1]["bleu"],  # the last checkpoint with the paper's decoding
          "checkpoint": dev["checkpoint"], "beam_size": settings.beam_size, "alpha": settings.alpha,
          "averaged_checkpoints": len(averaged_paths), "steps": trained["steps"],
          "train_seconds": trained["train_seconds"], "wall_seconds": round(time.perf_counter() - start, 1),
          "parameters": model.count_params(), "peak_rss_mb": round(peak_rss_mb(), 1),
          "learning_curve": learning_curve.plot(run_dir), "recipe": " ".join(RECIPE + list(extra_flags))})  # fmt: skip


def choose_on_val(models, tokenizer, corpus, default, grid, run_dir):
    """What test2016 is translated with, chosen on val only: of `models` (name -> model, the
    first winning ties), the one that translates val best with the `default` settings; then,
    for it, the best of `default` and the `grid`'s (beam size, alpha) pairs. Returns the val
    metrics of the choice (with its "checkpoint" name) and of every try, in order; the choice's
    translations are left in translations.dev.txt."""
    tried = []

    def translate_val(name, settings):
        path = os.path.join(run_dir, f"translations.dev.{len(tried)}.txt")
        tried.append({"checkpoint": name, "path": path,
                      **evaluate.evaluate(models[name], tokenizer, corpus, "dev", settings, output_path=path)})  # fmt: skip

    for name in models:
        translate_val(name, default)
    chosen = max(tried, key=lambda row: row["bleu"])["checkpoint"]
    for beam_size, alpha in grid:
        if (beam_size, alpha) != (default.beam_size, default.alpha):
            translate_val(chosen, DecodingSettings(beam_size=beam_size, alpha=alpha))
    best = max(tried, key=lambda row: row["bleu"])
    os.replace(best["path"], os.path.join(run_dir, "translations.dev.txt"))
    for row in tried:
        if row is not best:
            os.remove(row["path"])
        del row["path"]
    return best, tried


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)  # fmt: skip
    parser.add_argument("--data", required=True, help="the Multi30k folder (here: ../shared/data/multi30k)")
    parser.add_argument("--run-dir", default="runs/multi30k", help="the run folder (default: runs/multi30k)")
    parser.add_argument("--probe", action="store_true", help="score val only (beam 4, alpha 0.6), leaving test2016 unread: for "
                        "short runs that compare settings (e.g. --probe --max-minutes 20 --dropout 0.3)")
    args, extra_flags = parser.parse_known_args(argv)  # the rest goes to training.train (e.g. --max-minutes 30)
    run(args.data, args.run_dir, extra_flags, args.probe)


if __name__ == "__main__":
    main()
