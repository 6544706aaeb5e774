"""The run and the exports that the benchmarks' smoke modes measure, of training/recipes.py's
tiny recipe; the test suite shares its own (tests/artifacts.py) through the variables below.

    run(...)    the run folder $KERAS_TRANSFORMER_SMOKE_RUN names, else one trained now
    export(...) the SavedModel $KERAS_TRANSFORMER_SMOKE_EXPORT names (beam 4, the paper's
                decoding), or $KERAS_TRANSFORMER_SMOKE_GREEDY_EXPORT (beam 1), else the run
                exported now
"""

import os

from training.recipes import TINY

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

    return export_run(run(scratch), os.path.join(scratch, "exports"), DecodingSettings(beam_size=beam_size), version=beam_size)
