"""The paper's WMT14 English -> German recipe end to end, as README.md gives it: 25,000-token
updates (accumulated on fewer than 8 devices), a checkpoint every 10 minutes, the last 5 averaged
(20 for big: the preset's `average_last`), newstest2014 with beam 4 and alpha 0.6, cased sacreBLEU
and the paper's `bleu_paper`.

    python -m bench.wmt14_recipe --data DIR --max-minutes 20                  # WMT-shaped text files
    python -m bench.wmt14_recipe --data ../shared/data/newstest2014 --max-minutes 20

`--data` holds train / dev / test .en and .de files, or only newstest2014.en / .de for every
split. On a CPU the budget buys a few updates, not a model; what the run changes for a CPU is
printed with the commands. Other flags go to training.train, after the recipe's. One JSON line:
seconds an update, checkpoints, steps averaged, BLEUs.
"""

import argparse
import contextlib
import os
import sys
import tempfile
import time

from bench.common import emit, peak_rss_mb
from keras_transformer.config import PRESETS, paper_accumulate_steps
from training import evaluate, train
from training.run_folder import RunFolder

DATASET = "tfds:wmt14_translate/de-en"  # test: newstest2014, 3,003 lines; dev: newstest2013
RECIPES = ("base", "big")


def train_flags(config="base", devices=8, dataset=DATASET, checkpoint_minutes=10):
    """`training.train`'s flags for the paper's run of `config` on `devices` GPUs or TPU chips
    (add --run-dir, and --backend jax --strategy tpu on TPUs): the step rule only at the run's
    last update, so that the clock's rule writes the checkpoints that training averages at its end."""
    return ["--config", config, "--dataset", dataset, "--source-lang", "en", "--target-lang", "de",
            "--accumulate-steps", str(paper_accumulate_steps(devices)), "--mixed-precision",
            "--checkpoint-every", str(PRESETS[config]["training"]["steps"]),
            "--checkpoint-every-minutes", str(checkpoint_minutes), "--no-evaluate"]  # fmt: skip


# On this machine's CPUs (the module docstring).
CPU_CHANGES = ["--no-xla", "--steps-per-call", "1"]


def stand_in_folder(data, scratch):
    """`data` if it holds a training split; else a folder whose every split is its newstest2014."""
    if os.path.exists(os.path.join(data, "train.en")):
        return data
    folder = os.path.join(scratch, "newstest2014-as-corpus")
    os.makedirs(folder, exist_ok=True)
    for split in ("train", "dev", "test"):
        for lang in ("en", "de"):
            link = os.path.join(folder, f"{split}.{lang}")
            if not os.path.exists(link):
                os.symlink(os.path.abspath(os.path.join(data, f"newstest2014.{lang}")), link)
    return folder


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)  # fmt: skip
    parser.add_argument("--data", required=True, help="a folder of train/dev/test.{en,de}, or of newstest2014.{en,de}")
    parser.add_argument("--run-dir", help="where the run goes (default: a temporary folder)")
    parser.add_argument("--recipe", default="base", choices=RECIPES, help="the paper's base or big run")
    parser.add_argument("--devices", type=int, default=1, help="the devices the recipe is for (its accumulation)")
    parser.add_argument("--max-minutes", type=float, default=20.0, help="the training budget")
    parser.add_argument("--limit", type=int, default=100, help="test sentences translated")
    args, extra_flags = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = args.run_dir or os.path.join(scratch, "run")
        data = stand_in_folder(args.data, scratch)
        flags = [*train_flags(args.recipe, args.devices, data, checkpoint_minutes=round(args.max_minutes / 6, 3)),
                 *CPU_CHANGES, "--max-minutes", str(args.max_minutes), *extra_flags]  # fmt: skip
        print("python -m training.train --run-dir", run_dir, " ".join(flags), flush=True)
        start = time.perf_counter()
        train.main(["--run-dir", run_dir, *flags])
        train_wall = time.perf_counter() - start
        run = RunFolder(run_dir)
        metrics = run.metrics()
        checkpoints = [step for step, _ in run.checkpoints()]
        evaluation = ["--run-dir", run_dir, "--limit", str(args.limit), "--no-xla"]
        print("python -m training.evaluate", " ".join(evaluation), flush=True)
        start = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):  # its JSON goes to metrics.json; stdout is this one's line
            evaluate.main(evaluation)
        evaluate_wall = time.perf_counter() - start
        scores = RunFolder(run_dir).metrics()
        emit({"benchmark": "wmt14_recipe", "recipe": " ".join(flags), "data": args.data,
              "accumulate_steps": paper_accumulate_steps(args.devices), "updates": metrics["steps"],
              "seconds_per_update": round(metrics["train_seconds"] / max(1, metrics["steps"]), 2),
              "train_wall_seconds": round(train_wall, 1), "checkpoints": checkpoints,
              "averaged": metrics["averaged_checkpoints"], "test_sentences": scores["sentences"],
              "bleu": scores["bleu"], "signature": scores["signature"], "bleu_paper": scores.get("bleu_paper"),
              "bleu_paper_signature": scores.get("bleu_paper_signature"),
              "evaluate_wall_seconds": round(evaluate_wall, 1), "peak_rss_mb": round(peak_rss_mb())})  # fmt: skip


if __name__ == "__main__":
    main()
