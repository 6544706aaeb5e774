"""The one tiny recipe: the run and the export that the benchmarks' smoke modes measure and that
the test suite shares (tests/artifacts.py builds them once, under both backends).

    TRAINING    `training.train` flags: the tiny config (its batch and warm-up) on the built-in
                corpus, 160 steps, no dropout (two runs over the same data end with the same
                weights). About a minute on 2 cores; it translates (test BLEU about 87), so that
                a search that ignores its input shows. Callers add the flags they need
                (evaluation, --backend).
    MECHANICS   the recipe cut to 40 steps on batches of 512 tokens, for the checks of training's
                mechanics (resuming, several processes, other file systems), which count steps
                and need no learning; with 3 encoder layers and 1 decoder layer, so that those
                checks hold for stacks of different depths (in 160 steps, this shallow decoder
                would not learn the corpus' word order)
    run(...)    the run folder $KERAS_TRANSFORMER_SMOKE_RUN names, else one trained now
    export(...) the SavedModel $KERAS_TRANSFORMER_SMOKE_EXPORT names (beam 4, the paper's
                decoding), or $KERAS_TRANSFORMER_SMOKE_GREEDY_EXPORT (beam 1), else the run
                exported now
"""

import os

TRAINING = ["--steps", "160", "--checkpoint-every", "20", "--steps-per-call", "20", "--dropout", "0",
            "--max-length", "24", "--vocab-size", "500", "--strategy", "cpu"]  # fmt: skip
MECHANICS = [*TRAINING, "--steps", "40", "--batch-tokens", "512", "--checkpoint-every", "8", "--steps-per-call", "4",
             "--encoder-layers", "3", "--decoder-layers", "1"]

RUN_VARIABLE = "KERAS_TRANSFORMER_SMOKE_RUN"
EXPORT_VARIABLE = "KERAS_TRANSFORMER_SMOKE_EXPORT"
GREEDY_EXPORT_VARIABLE = "KERAS_TRANSFORMER_SMOKE_GREEDY_EXPORT"


def run(scratch):
    """The smoke run's folder: the one $KERAS_TRANSFORMER_SMOKE_RUN names (read only), else one
    trained (with no evaluation) in `scratch`."""
    if os.environ.get(RUN_VARIABLE):
        return os.environ[RUN_VARIABLE]
    from training import train

    run_dir = os.path.join(scratch, "run")
    if os.path.exists(os.path.join(run_dir, "metrics.json")):  # trained already, by an earlier call
        return run_dir
    train.train(train.parse_args(["--run-dir", run_dir, *TRAINING, "--no-evaluate"]))
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

    return export_run(run(scratch), os.path.join(scratch, "exports"), DecodingSettings(beam_size=beam_size), version=beam_size)
