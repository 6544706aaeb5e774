"""Adapting a model to a new domain, the classic table: a `small` model trained on Multi30k (image
captions) translates news (newstest2014) (a) as it is, (b) fine-tuned on 2,000 news pairs
(`--init-from`), and (c) against a model of the same size trained on those 2,000 pairs alone.

    python -m bench.finetune --multi30k ../shared/data/multi30k --news ../shared/data/newstest2014 --run-dir runs/finetune

newstest2014's 3,003 lines, in file order (--news-split): the first 2,000 train (b) and (c); of the
other 1,003, the first 500 are dev (each run keeps the checkpoint of its best dev BLEU,
`--keep-best`, which is what (b) and (c) are scored with) and the last 503 test. Each row is
scored on news test with cased sacreBLEU (beam 4, alpha 0.6), the general model before and after
fine-tuning also on Multi30k's test2016 (how much it forgets), with the minutes each run
trained. `--general RUN` reuses a trained Multi30k run (`python -m bench.multi30k`'s, of any
config) instead of training one. Other flags go to training.train, after the recipe's. One JSON
line a row; the run folders stay in --run-dir.
"""

import argparse
import os

from bench.common import emit
from bench.multi30k import test_split
from keras_transformer.search.flags import flag_of
from training import data, evaluate, train
from training.run_folder import RunFolder

# No XLA, as bench/multi30k.py's recipe: on a CPU it does not speed the step up and compiles each bucket's shape.
GENERAL = ["--config", "small", "--source-lang", "en", "--target-lang", "de", "--dev-split", "val", "--no-xla", "--no-evaluate"]
# (b) and (c): the same schedule and model selection on news dev.
ADAPTED = ["--source-lang", "en", "--target-lang", "de", "--keep-best", "--no-xla",
           "--no-evaluate"]  # scored below, on the best checkpoint: no test evaluation of the last


def write_news(news_dir, folder, train_pairs, dev_pairs):
    """`folder` with train, dev and test files (.en, .de) cut from newstest2014 in file order."""
    os.makedirs(folder, exist_ok=True)
    for lang in ("en", "de"):
        with open(os.path.join(news_dir, f"newstest2014.{lang}"), encoding="utf-8") as f:
            lines = f.read().splitlines(keepends=True)
        cuts = {"train": (0, train_pairs), "dev": (train_pairs, train_pairs + dev_pairs), "test": (train_pairs + dev_pairs, None)}
        for split, (begin, end) in cuts.items():
            with open(os.path.join(folder, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(lines[begin:end])
    return folder


def score(run_dir, checkpoint, corpus, limit=None):
    """Cased sacreBLEU of a run's checkpoint on `corpus`'s test split (beam 4, alpha 0.6; the
    first `limit` sentences)."""
    folder = RunFolder(run_dir)
    model, _ = folder.load_model(checkpoint)
    return evaluate.evaluate(model, folder.load_tokenizer(), corpus, "test", limit=limit, jit_compile=limit is None)


def trained(run_dir, flags):
    """Trains (or resumes) a run; returns its training minutes."""
    _, metrics = train.train(train.parse_args(["--run-dir", run_dir, *flags]))
    return round(metrics["train_seconds"] / 60, 1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)  # fmt: skip  (other flags go to training.train whole)
    parser.add_argument("--multi30k", help="the Multi30k folder (train, val, test2016 .en / .de)")
    parser.add_argument("--news", help="the folder of newstest2014.en / .de")
    parser.add_argument("--run-dir", help="where the runs go (default: runs/finetune)")
    parser.add_argument("--general", help="a trained Multi30k run to adapt, instead of training one")
    parser.add_argument("--general-minutes", type=float, default=40)
    parser.add_argument("--adapt-minutes", type=float, default=10, help="for (b) and for (c) each")
    parser.add_argument("--evaluations", type=int, default=5, help="dev evaluations a run, evenly spaced in its minutes")
    parser.add_argument("--news-split", default="2000,500", help="newstest2014's first TRAIN,DEV lines (the rest: test)")
    parser.add_argument("--limit", type=int, help="the first N test sentences scored (default: all)")
    args, extra_flags = parser.parse_known_args(argv)
    if not (args.news and (args.multi30k or args.general)):
        parser.error("give --news and --multi30k (or --general RUN)")
    train_pairs, dev_pairs = map(int, args.news_split.split(","))
    base = args.run_dir or "runs/finetune"
    news_dir = write_news(args.news, os.path.join(base, "news"), train_pairs, dev_pairs)
    news = data.text_file_corpus(news_dir, "en", "de")

    def budget(minutes):
        return ["--max-minutes", str(minutes), "--eval-every-minutes", str(minutes / args.evaluations),
                "--checkpoint-every", "1000", *extra_flags]  # fmt: skip

    general, minutes = args.general, None
    if general is None:
        general = os.path.join(base, "general")
        flags = ["--dataset", args.multi30k, "--test-split", test_split(args.multi30k), *GENERAL]
        minutes = trained(general, [*flags, *budget(args.general_minutes), "--keep-best"])
    source = RunFolder(general)
    own = source.load_corpus()  # the general model's own test split: Multi30k's test2016
    config = source.config()  # its preset, and any model flag it changed
    model_flags = [f"--config={source.settings()['config']}", *(f"{flag_of(name)}={getattr(config, name)}"
                   for name in ("encoder_layers", "decoder_layers", "d_model", "num_heads", "d_ff", "max_length"))]  # fmt: skip
    checkpoint = "best" if source.best().get("file") else "latest"
    rows = {"a_general_as_is": (general, checkpoint, minutes)}
    tuned, scratch_run = os.path.join(base, "finetuned"), os.path.join(base, "scratch")
    news_flags = ["--dataset", news_dir, *ADAPTED, "--eval-sentences", str(dev_pairs), *budget(args.adapt_minutes), *model_flags]
    rows["b_finetuned"] = (tuned, "best", trained(tuned, [*news_flags, "--init-from", f"{general}:{checkpoint}"]))
    scratch_flags = [*news_flags, "--vocab-size", str(source.load_tokenizer().target.vocab_size)]
    rows["c_from_scratch"] = (scratch_run, "best", trained(scratch_run, scratch_flags))
    for row, (run_dir, name, minutes) in rows.items():
        metrics = score(run_dir, name, news, args.limit)
        record = {"benchmark": "finetune", "row": row, "news_test_bleu": metrics["bleu"], "signature": metrics["signature"],
                  "news_test_sentences": metrics["sentences"], "train_minutes": minutes, "run": run_dir}  # fmt: skip
        if row != "c_from_scratch":
            record["multi30k_test_bleu"] = score(run_dir, name, own, args.limit)["bleu"]
        emit(record)


if __name__ == "__main__":
    main()
