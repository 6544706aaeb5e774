"""One model for three languages against three: Multi30k English -> German, French and Czech,
scored on test2016 with cased sacreBLEU.

    python -m bench.multilingual --data ../shared/data/multi30k --run-dir runs/multilingual --minutes 15

Three bilingual runs of the `multi30k` preset, T minutes each (--minutes), and one run of the same
preset into all three languages (`--target-lang de,fr,cs`, training/languages.py) for 3T minutes,
with a checkpoint at every T. Each model is scored on the test split of each of its pairs with
the paper's decoding (beam 4, alpha 0.6) from its last checkpoint, the multilingual one also from
its checkpoint at T minutes. Then the served speed: the multilingual export against the English
-> German one, batch 1 and 32, side by side in a fresh process (bench.compare_exports, on the
English -> German test sentences; the multilingual export writes its first language, German).
With --average N, each model is scored as the mean of its last N checkpoints instead, written a
minute apart (the paper averages its last 5, Section 6.1; the multilingual model at T minutes:
the last N up to T). One JSON line a model and pair, then compare_exports' lines for each batch
size. The same --run-dir resumes each run where it stopped (a finished one is not trained
again). Other flags go to training.train, after the recipe's.

    python -m bench.multilingual --data ../shared/data/multi30k --run-dir runs/temperature --minutes 10 \
        --temperatures 1,5 --cut cs=0.1

The pairs' sampling temperature instead (--pair-temperature, training/languages.py): with one
pair made small (--cut TARGET=FRACTION: its training split cut to its first FRACTION), one run
into all languages for 3T minutes at each temperature, each scored as above (one JSON line a
temperature and pair).
"""

import argparse
import json
import math
import os

from bench.common import emit, run_isolated
from bench.multi30k import test_split
from training import evaluate, languages, train
from training.average_checkpoints import averaged_model
from training.run_folder import RunFolder

TARGETS = ("de", "fr", "cs")
# The multi30k preset, no XLA (as bench/multi30k.py's recipe), scored below: checkpoints by training
# time only (--checkpoint-every-minutes), all kept.
RECIPE = ["--config", "multi30k", "--no-xla", "--source-lang", "en", "--dev-split", "val", "--no-evaluate",
          "--checkpoint-every", "1000000000"]  # fmt: skip


def trained(run_dir, data_dir, test, targets, minutes, checkpoint_minutes, extra_flags):
    """Trains (or resumes) a run of the recipe into `targets` for `minutes`, a checkpoint every
    `checkpoint_minutes`, its test split `test`; returns its training minutes."""
    flags = ["--run-dir", run_dir, "--dataset", data_dir, "--test-split", test, *RECIPE,
             "--target-lang", ",".join(targets), "--max-minutes", str(minutes),
             "--checkpoint-every-minutes", str(checkpoint_minutes),
             "--keep-checkpoints", str(math.ceil(minutes / checkpoint_minutes) + 1), *extra_flags]  # fmt: skip
    _, metrics = train.train(train.parse_args(flags))
    return round(metrics["train_seconds"] / 60, 1)


def checkpoint_at(run_dir, checkpoints, average):
    """The checkpoint to score after `checkpoints` of a run's checkpoints: the last of them, or with
    `average` > 1 the mean of the last `average` (written to RUN_DIR/bench-averaged/). Returns
    (its path, the names of those averaged)."""
    run = RunFolder(run_dir)
    paths = [path for _, path in run.checkpoints()][:checkpoints][-average:]
    if average <= 1:
        return paths[-1], []
    saved = os.path.join(run_dir, "bench-averaged", f"{os.path.basename(paths[-1])}-of-{len(paths)}.weights.h5")
    os.makedirs(os.path.dirname(saved), exist_ok=True)
    averaged_model(run.config(), paths).save_weights(saved)
    return saved, [os.path.basename(path) for path in paths]


def scores(run_dir, checkpoint, limit=None):
    """{pair name: test metrics} of a run's checkpoint (a path), each pair's sources asking for its
    language where the run writes several (beam 4, alpha 0.6; the first `limit` sentences)."""
    folder = RunFolder(run_dir)
    model, _ = folder.load_model(checkpoint)
    tokenizer, corpora = folder.load_tokenizer(), folder.load_corpora()
    metrics = evaluate.evaluate_pairs(model, tokenizer, corpora, "test", tagged=bool(languages.languages(tokenizer)),
                                      limit=limit, jit_compile=limit is None)  # fmt: skip
    return metrics.get("pairs") or {languages.pair_name(next(iter(corpora))): metrics}


def scored(metrics):
    """What a JSON line records of a pair's test metrics."""
    return {key: metrics[key] for key in ("bleu", "chrf", "sentences", "signature")}


def cut_folder(data_dir, folder, targets, test, cut):
    """Writes `folder`: each pair's files in a folder of its own, DIR/en-TARGET/ (training/data.py),
    as in `data_dir` but for the training split of the pair in `cut` ((target, fraction)): its
    first `fraction` of lines. Returns {target: its training pairs}."""
    sizes = {}
    for target in targets:
        pair_dir = os.path.join(folder, languages.pair_name(("en", target)))  # training/data.py's folder of a pair
        os.makedirs(pair_dir, exist_ok=True)
        for split in ("train", "val", test):
            for lang in ("en", target):
                with open(os.path.join(data_dir, f"{split}.{lang}"), encoding="utf-8") as f:
                    lines = f.readlines()
                if split == "train" and target == cut[0]:
                    lines = lines[: round(len(lines) * cut[1])]
                with open(os.path.join(pair_dir, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                    f.writelines(lines)
                if split == "train":
                    sizes[target] = len(lines)
    return sizes


def temperature_study(args, targets, test, temperatures, cut, every, extra_flags):
    """--temperatures: on the data of --cut, one run into all `targets` for 3T minutes at each
    temperature (a checkpoint `every` minutes), its last checkpoint (or --average) scored on each
    pair."""
    data = os.path.join(args.run_dir, "data")
    sizes = cut_folder(args.data, data, targets, test, cut)
    for temperature in temperatures:
        run_dir = os.path.join(args.run_dir, f"temperature-{temperature:g}")
        flags = [*extra_flags, "--pair-temperature", str(temperature)]
        trained_minutes = trained(run_dir, data, test, targets, len(targets) * args.minutes, every, flags)
        shares = dict(zip(targets, languages.pair_weights([sizes[target] for target in targets], temperature).tolist()))
        checkpoint, averaged = checkpoint_at(run_dir, None, args.average)
        for pair, metrics in scores(run_dir, checkpoint, args.limit).items():
            target = pair.split("-")[1]
            emit({"benchmark": "pair_temperature", "temperature": temperature, "pair": pair, "train_pairs": sizes[target],
                  "share_of_batches": round(shares[target], 4), "train_minutes": trained_minutes, **scored(metrics),
                  "checkpoint": checkpoint, "averaged": averaged})  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)  # fmt: skip  (other flags go to training.train whole)
    parser.add_argument("--data", required=True, help="the Multi30k folder (train, val, test2016 .en .de .fr .cs)")
    parser.add_argument("--run-dir", default="runs/multilingual", help="where the runs go")
    parser.add_argument("--minutes", type=float, default=15, help="T: each bilingual run's training minutes")
    parser.add_argument("--targets", default=",".join(TARGETS), help="the target languages (default: de,fr,cs)")
    parser.add_argument("--batch-sizes", default="1,32", help="of the served comparison (none: no comparison)")
    parser.add_argument("--rounds", type=int, default=3, help="of the served comparison")
    parser.add_argument("--limit", type=int, help="the first N test sentences of each pair (default: all)")
    parser.add_argument("--average", type=int, default=1, help="score the mean of each model's last N checkpoints, "
                        "written a minute apart (default: 1, the checkpoint itself)")  # fmt: skip
    parser.add_argument("--temperatures", help="instead, one run into all targets at each of these --pair-temperature "
                        "values (a comma list), on the data of --cut")  # fmt: skip
    parser.add_argument("--cut", help="with --temperatures: TARGET=FRACTION, that pair's training split cut to its first "
                        "FRACTION (e.g. cs=0.1)")  # fmt: skip
    args, extra_flags = parser.parse_known_args(argv)
    targets = args.targets.split(",")
    test = test_split(args.data)
    every = min(1.0, args.minutes) if args.average > 1 else args.minutes  # a checkpoint every `every` minutes
    if args.temperatures:
        try:
            temperatures = [float(value) for value in args.temperatures.split(",")]
            target, fraction = (args.cut or "").split("=")
            cut = (target, float(fraction))
        except ValueError:
            parser.error(f"--temperatures {args.temperatures} --cut {args.cut}: give numbers, and TARGET=FRACTION")
        if target not in targets or not 0 < cut[1] <= 1:
            parser.error(f"--cut {args.cut}: TARGET one of --targets {args.targets}, FRACTION in (0, 1]")
        return temperature_study(args, targets, test, temperatures, cut, every, extra_flags)

    minutes = {}
    runs = {target: os.path.join(args.run_dir, f"en-{target}") for target in targets}
    for target, run_dir in runs.items():
        minutes[run_dir] = trained(run_dir, args.data, test, [target], args.minutes, every, extra_flags)
    together = os.path.join(args.run_dir, "en-" + "-".join(targets))
    minutes[together] = trained(together, args.data, test, targets, len(targets) * args.minutes, every, extra_flags)

    # (run, model, budget, its checkpoints up to the budget, minutes): a checkpoint each `every`
    # minutes by training time, so the multilingual run's at T minutes is its T/every-th.
    rows = [(run_dir, "bilingual", "T", None, minutes[run_dir]) for run_dir in runs.values()]
    rows += [(together, "multilingual", "T", max(1, round(args.minutes / every)), args.minutes),
             (together, "multilingual", f"{len(targets)}T", None, minutes[together])]  # fmt: skip
    for run_dir, model, budget, checkpoints, trained_minutes in rows:
        checkpoint, averaged = checkpoint_at(run_dir, checkpoints, args.average)
        for pair, metrics in scores(run_dir, checkpoint, args.limit).items():
            emit({"benchmark": "multilingual", "model": model, "budget": budget, "pair": pair, "train_minutes": trained_minutes,
                  **scored(metrics), "checkpoint": checkpoint, "averaged": averaged})  # fmt: skip

    if args.batch_sizes == "none":
        return
    from export.saved_model import export

    first = runs[targets[0]]
    exported = [export(run_dir, os.path.join(run_dir, "export")) for run_dir in (first, together)]
    sentences = os.path.join(args.run_dir, "served.jsonl")  # the first pair's test sentences, with references
    with open(sentences, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(pair, ensure_ascii=False) + "\n" for pair in RunFolder(first).load_corpus().text_pairs("test"))
    for batch in args.batch_sizes.split(","):
        run_isolated("bench.compare_exports", [*exported, f"--sentences={sentences}", f"--batch={batch}",
                                               f"--rounds={args.rounds}"])  # fmt: skip


if __name__ == "__main__":
    main()
