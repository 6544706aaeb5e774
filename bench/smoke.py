"""Every benchmark, in one registry (`BENCHMARKS`): for each, the flags that run it in seconds on
tiny sizes (its smoke mode: `python -m bench --smoke` runs them) and the keys of its JSON records
(the tests check them); and the data, run and exports the smoke modes measure. The run is
training/recipes.py's tiny recipe; the test suite shares its own (tests/artifacts.py) through the
variables below.

    run(...)    the run folder $KERAS_TRANSFORMER_SMOKE_RUN names, else one trained now
    export(...) the SavedModel $KERAS_TRANSFORMER_SMOKE_EXPORT names (beam 4, the paper's
                decoding), or $KERAS_TRANSFORMER_SMOKE_GREEDY_EXPORT (beam 1), else the run
                exported now
"""

import dataclasses
import os

from training.recipes import MECHANICS, TINY

RUN_VARIABLE = "KERAS_TRANSFORMER_SMOKE_RUN"
EXPORT_VARIABLE = "KERAS_TRANSFORMER_SMOKE_EXPORT"
GREEDY_EXPORT_VARIABLE = "KERAS_TRANSFORMER_SMOKE_GREEDY_EXPORT"
SENTENCES = ["a small test", "another sentence here", "and a third", "the dog sees the red car ."]


def run(scratch):
    """The smoke run's folder: the one $KERAS_TRANSFORMER_SMOKE_RUN names (read only), else one
    trained (with no evaluation) in `scratch`."""
    if os.environ.get(RUN_VARIABLE):
        return os.environ[RUN_VARIABLE]
    from training import train

    run_dir = os.path.join(scratch, "run")
    if not os.path.exists(os.path.join(run_dir, "metrics.json")):  # else trained already, by an earlier call
        train.train(train.parse_args(["--run-dir", run_dir, *TINY, "--no-evaluate"]))
    return run_dir


def export(scratch, beam_size=4):
    """The smoke run's SavedModel version folder of `beam_size` (4 or 1): the one that
    $KERAS_TRANSFORMER_SMOKE_EXPORT (or $KERAS_TRANSFORMER_SMOKE_GREEDY_EXPORT) names, else
    `run(scratch)` exported into `scratch` (version `beam_size`)."""
    variable = {4: EXPORT_VARIABLE, 1: GREEDY_EXPORT_VARIABLE}[beam_size]
    if os.environ.get(variable):
        return os.environ[variable]
    from export.saved_model import export as export_run
    from keras_transformer.search import DecodingSettings

    base = os.path.join(scratch, "exports")
    if os.path.exists(os.path.join(base, str(beam_size))):  # exported by an earlier call
        return os.path.join(base, str(beam_size))
    return export_run(run(scratch), base, DecodingSettings(beam_size=beam_size), version=beam_size)


def corpus(scratch, names=("train", "val", "test2016"), seed=0, sizes=(300, 8, 8), targets=("de",)):
    """A folder of synthetic pairs (training/synthetic.py), English and each of `targets`, in text
    files named NAME.en, NAME.de, ..., for the train, dev and test splits in that order:
    Multi30k's names by default. Returns the folder."""
    from training.synthetic import generate_splits

    folder = os.path.join(scratch, f"corpus-{'-'.join(names)}-{seed}-{'-'.join(targets)}")
    os.makedirs(folder, exist_ok=True)
    for target in targets:
        splits = generate_splits(seed, *sizes, target=target)
        for name, split in zip(names, ("train", "dev", "test")):
            for side, lang in enumerate(("en", target)):
                with open(os.path.join(folder, f"{name}.{lang}"), "w", encoding="utf-8") as f:
                    f.writelines(pair[side] + "\n" for pair in splits[split])
    return folder


def sentences(scratch):
    """A file of SENTENCES, one a line."""
    path = os.path.join(scratch, "sentences.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(sentence + "\n" for sentence in SENTENCES)
    return path


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A row of `BENCHMARKS`.

    Args:
        keys: the keys that each of its own JSON records (those whose "benchmark" is its name)
            has; tests/test_bench.py checks them in its smoke mode's output.
        flags: function(scratch) -> its smoke mode's command lines (each `main(flags)`).
        run_folder: whether it makes run folders (its --run-dir; `python -m bench --runs` keeps them).
        shared: whether its smoke mode measures the smoke run or its exports (`run`, `export`),
            which the test suite makes once for all (tests/test_bench.py runs the others first).
    """

    keys: set
    flags: object
    run_folder: bool = False
    shared: bool = False


# Every benchmark, bench.NAME by NAME. Those that train use training/recipes.py MECHANICS, shortened.
BENCHMARKS = {
    "compare_exports": Benchmark(
        {"round", "batch", "sentences", "sentences_per_s_each"},
        lambda s: [[export(s), export(s, beam_size=1), f"--sentences={sentences(s)}", "--batch=2", "--rounds=2"],
                   ["--options", export(s), f"--sentences={sentences(s)}", "--batch=2", "--rounds=2"]],
        shared=True),
    "corpus_scale": Benchmark(
        {"pairs", "read_and_cut_s", "tokenizer_s", "first_step_s", "peak_rss_before_first_step_mb", "shards", "shortlist_s",
         "shortlist_peak_rss_mb"},
        lambda s: [[f"--data={corpus(s)}", "--pairs=3000", "--config=tiny", "--vocab-size=500"]]),
    "decode": Benchmark(
        {"mode", "beam_size", "xla", "gen_tokens_per_s", "peak_rss_mb"},
        lambda s: [["--batch=2", "--length=4", "--d-model=16", "--layers=1", "--d-ff=32", "--vocab-size=50", "--repeats=1",
                    "--rounds=1", "--shortlist=20", "--ctranslate2-types=float32,int8"],
                   [f"--marian={os.path.join(s, 'opus-mt')}", "--batch=2", "--length=4", "--d-model=16", "--layers=1",
                    "--d-ff=32", "--vocab-size=50", "--repeats=1", "--rounds=1", "--modes=served,ctranslate2"]]),
    "decode_profile": Benchmark(
        {"batch", "wall_ms_per_call", "loop_steps_per_call", "ops_per_step", "op_us_per_step", "op_types"},
        lambda s: [[f"--export-dir={export(s)}", f"--sentences={sentences(s)}", "--calls=1"]],
        shared=True),
    "demo": Benchmark(
        {"backend", "seed", "bleu", "train_seconds", "first_command_wall_seconds", "sentences_exact", "holds"},
        lambda s: [["--runs=tf:0", *MECHANICS, "--steps=2", "--no-evaluate", "--no-xla"]],
        run_folder=True),
    "finetune": Benchmark(
        {"row", "news_test_bleu", "signature", "news_test_sentences", "train_minutes", "run"},
        lambda s: [[f"--general={run(s)}", f"--news={corpus(s, ('newstest2014', 'none', 'none'), 7, (52, 0, 0))}",
                    "--news-split=40,6", "--limit=8", *MECHANICS, "--steps=4", "--steps-per-call=2", "--checkpoint-every=2",
                    "--eval-every=2"]],
        run_folder=True, shared=True),
    "multi30k": Benchmark(
        {"bleu", "signature", "chrf", "bleu_lowercase", "bleu_lowercase_signature", "dev_bleu", "dev_chrf",
         "dev_bleu_lowercase", "dev_bleu_last_checkpoint", "steps", "wall_seconds", "peak_rss_mb"},
        lambda s: [[f"--data={corpus(s, ('train', 'val', 'test_2016_flickr'))}", "--config=tiny", *MECHANICS, "--steps=6",
                    "--steps-per-call=2", "--checkpoint-every=2", "--eval-every-minutes=0.001"]],
        run_folder=True),
    "multilingual": Benchmark(
        {"model", "budget", "pair", "train_minutes", "bleu", "chrf", "sentences", "signature", "checkpoint"},
        lambda s: [[f"--data={corpus(s, targets=('de', 'qaa'))}", "--targets=de,qaa", "--minutes=1", "--limit=2",
                    "--batch-sizes=none", "--average=2", "--config=tiny", *MECHANICS, "--steps=2", "--steps-per-call=2",
                    "--checkpoint-every=1"],
                   [f"--data={corpus(s, targets=('de', 'qaa'))}", "--targets=de,qaa", "--temperatures=5", "--cut=qaa=0.5",
                    "--minutes=1", "--limit=2", "--config=tiny", *MECHANICS, "--steps=2", "--steps-per-call=2"]],
        run_folder=True),
    "multihost": Benchmark(
        {"one_process_4_devices_tgt_tokens_per_s_per_device", "two_processes_2_devices_tgt_tokens_per_s_per_device", "ratio"},
        lambda s: [["--config=smoke", "--vocab-size=100", "--batch=8", "--length=8", "--steps=2", "--rounds=1"]]),
    "pipeline": Benchmark(
        {"tgt_tokens_per_s", "tgt_tokens_per_s_per_core", "v5e_chip_tgt_tokens_per_s_estimate", "cores_per_chip"},
        lambda s: [[f"--data={corpus(s)}", "--vocab-size=300", "--batch-tokens=2000", "--batches=5", "--warmup=2"]]),
    "real_serving": Benchmark(
        {"system", "round", "batch", "sentences_per_s", "p50_ms", "p95_ms", "bleu", "peak_rss_mb"},
        lambda s: [[f"--run-dir={run(s)}", f"--export={export(s)}", "--limit=8", "--rounds=1", "--batch-sizes=4",
                    "--ctranslate2=int8"]],
        shared=True),
    "train_throughput": Benchmark(
        {"config", "backend", "xla", "tgt_tokens_per_s", "peak_rss_mb", "fraction_of_matmul"},
        lambda s: [["--configs=smoke", "--batch=4", "--length=8", "--vocab-size=50", "--steps=2", "--repeats=1",
                    "--matmul-size=256"]]),
    "wmt14_recipe": Benchmark(
        {"updates", "accumulate_steps", "seconds_per_update", "checkpoints", "averaged", "bleu", "signature", "bleu_paper",
         "bleu_paper_signature", "peak_rss_mb"},
        lambda s: [[f"--data={corpus(s, ('train', 'dev', 'test'))}", "--config=tiny", *MECHANICS, "--steps=4",
                    "--batch-tokens=1024", "--checkpoint-every=2", "--average-last=2"]],
        run_folder=True),
}  # fmt: skip
