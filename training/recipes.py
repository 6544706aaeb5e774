"""The tiny recipes: `training.train` flags that the test suite's shared runs (tests/artifacts.py)
and the benchmarks' smoke modes (bench/smoke.py) both train with. Callers add the flags they need
(evaluation, --backend, --run-dir).

    TINY        the tiny config on the built-in corpus, 160 steps, no dropout (two runs over the
                same data end with the same weights), no averaging (the last checkpoint is the
                model), at twice the preset's learning rate: its 160 steps are all warm-up. About
                a minute on 2 cores; it translates (test BLEU about 87), so that a search that
                ignores its input shows.
    MECHANICS   TINY cut to 40 steps on batches of 512 tokens, for the checks of training's
                mechanics (resuming, several processes, other file systems), which count steps and
                need no learning; with 3 encoder layers and 1 decoder layer, so that those checks
                hold for stacks of different depths (in 160 steps, this shallow decoder would not
                learn the corpus' word order).
"""

TINY = ["--steps", "160", "--checkpoint-every", "20", "--steps-per-call", "20", "--dropout", "0",
        "--max-length", "24", "--vocab-size", "500", "--learning-rate-scale", "2", "--average-last", "0",
        "--strategy", "cpu"]  # fmt: skip
MECHANICS = [*TINY, "--steps", "40", "--batch-tokens", "512", "--checkpoint-every", "8", "--steps-per-call", "4",
             "--encoder-layers", "3", "--decoder-layers", "1"]
