"""The test suite's shared artifacts: made once from training/recipes.py's tiny recipes, by the
commands a user runs, and read by every test that needs a trained run or an export (and, through
the environment, by the subprocesses and the benchmarks' smoke modes that tests start).

    tensorflow/           `python -m training.train` with the recipe, dev BLEU every 80 steps
                          on 20 sentences and test BLEU at the end, every checkpoint kept
                          (tensorflow.out: its output)
    jax/                  the recipe's MECHANICS (40 short steps) under JAX (`--backend jax`) into
                          two target languages (TWO_TARGETS), with Marian's model options (MARIAN),
                          no evaluation: JAX_RUN
    exports/float32/1, 4  the TensorFlow run exported with beam 1 (greedy) and beam 4
    exports/bfloat16/1, exports/float16/1
                          the same, beam 4, weights and matmuls in bfloat16 and float16
    exports/jax/1         the JAX run exported by `python -m export` in a shell where
                          KERAS_BACKEND=jax (jax-export.out: its output)
    multilingual/         the recipe into two target languages, the built-in corpus' German and
                          its second language (TWO_TARGETS): 60 steps (multilingual-start.out),
                          resumed to 120 (multilingual.out); greedy dev BLEU every 40 steps on 10
                          sentences with --keep-best, no test evaluation
    exports/multilingual/1   that run exported (beam 4)
    reversal/             a 2-layer model trained for some seconds to reverse 2 to 8 tokens (a
                          model whose outputs end at different lengths), with 48 test sources
    jax-decode.out        its searches compiled under JAX (tests/backend_worker.py decode), for
                          the comparison with TensorFlow's in tests/test_search.py

They are made in `.test-artifacts/KEY/` (or under $KERAS_TRANSFORMER_TEST_ARTIFACTS), KEY a hash
of the code that makes them and of the packages' versions: the next pytest session on the same
code reuses them, a change of code makes them anew. A lock lets one pytest worker make them
while the others wait. They are read only: a test that changes a run folder copies it first.
Beside them, `jax-cache/` is JAX's persistent compilation cache for every JAX process that the
suite starts: a run resumed, or the same step in another process, is not compiled twice. It goes
with the artifacts of older code.

    python tests/artifacts.py          makes them (if needed) and prints their folder
"""

import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.common import with_xla_flags  # noqa: E402
from training.recipes import MECHANICS, TINY  # noqa: E402

VARIABLE = "KERAS_TRANSFORMER_TEST_ARTIFACTS"
# What the artifacts are made of: a change to any of these makes them anew.
SOURCES = ("keras_transformer", "training", "export", "tests/artifacts.py", "tests/backend_worker.py")
PACKAGES = ("tensorflow", "keras", "jax", "jaxlib", "tensorflow-text", "sentencepiece", "numpy", "sacrebleu")
TIMEOUT_SECONDS = 900  # each process that makes an artifact ends by itself within this
# The TensorFlow run's evaluation during training (the recipe's test BLEU comes at the end), and
# all its checkpoints kept: a test resumes a killed run of the recipe and compares with one.
EVALUATION = ["--eval-every", "80", "--eval-sentences", "20", "--keep-checkpoints", "8"]
REVERSAL_STEPS = 400
TWO_TARGETS = ["--source-lang", "en", "--target-lang", "de,qaa"]  # the built-in corpus' German and its capitals
# Marian's (OPUS-MT's) model options, each other than the paper's. The JAX run has them, so that
# the tests that resume it, start from it (TensorFlow workers, JAX processes), average, export it
# and convert it to CTranslate2 check that each follows them.
MARIAN = ["--activation", "swish", "--positional-encoding", "sinusoidal_halves", "--layer-norm-epsilon", "1e-5",
          "--logits-bias"]  # fmt: skip
JAX_RUN = [*MECHANICS, *TWO_TARGETS, *MARIAN]  # the JAX run's flags
# 120 steps: enough to write each language (the second in capitals), not yet to translate well.
# Stopped at MULTILINGUAL_STOP and resumed, so that its dev evaluations fall on both sides of a resume.
MULTILINGUAL = [*TWO_TARGETS, "--steps", "120", "--eval-every", "40", "--eval-sentences", "10", "--beam-size", "1",
                "--keep-best", "--no-evaluate"]  # fmt: skip
MULTILINGUAL_STOP = 60
# The parts that train for the tiny recipe's steps, which run with XLA's kernels optimized
# (suite_environment); what compares its training with the TensorFlow run's does too.
LONG_RUNS = ("tensorflow", "multilingual-start", "multilingual")


class Artifacts:
    """The paths of the artifacts in `folder`."""

    def __init__(self, folder):
        self.folder = folder
        self.tf_run = os.path.join(folder, "tensorflow")
        self.jax_run = os.path.join(folder, "jax")
        self.multilingual_run = os.path.join(folder, "multilingual")
        self.export_base = os.path.join(folder, "exports", "float32")
        self.exports = {
            1: os.path.join(self.export_base, "1"),
            4: os.path.join(self.export_base, "4"),
            "bfloat16": os.path.join(folder, "exports", "bfloat16", "1"),
            "float16": os.path.join(folder, "exports", "float16", "1"),
            "jax": os.path.join(folder, "exports", "jax", "1"),
            "multilingual": os.path.join(folder, "exports", "multilingual", "1"),
        }
        self.reversal = os.path.join(folder, "reversal")

    def output(self, name):
        """What the command that made artifact `name` printed."""
        with open(os.path.join(self.folder, f"{name}.out"), encoding="utf-8") as f:
            return f.read()


def key():
    digest = hashlib.sha256()
    for source in SOURCES:
        path = os.path.join(ROOT, source)
        files = [path] if os.path.isfile(path) else sorted(
            os.path.join(folder, name) for folder, _, names in os.walk(path) for name in names if name.endswith(".py"))
        for name in files:
            digest.update(os.path.relpath(name, ROOT).encode())
            with open(name, "rb") as f:
                digest.update(f.read())
    for package in PACKAGES:
        digest.update(f"{package}=={importlib.metadata.version(package)}".encode())
    return digest.hexdigest()[:16]


def base():
    """The folder of the artifacts, the lock and the JAX cache."""
    return os.environ.get(VARIABLE) or os.path.join(ROOT, ".test-artifacts")


def suite_environment(env, optimized=False):
    """`env` with what every process of the suite, and every process it starts, runs with: JAX's
    compilation cache; one thread an operation, as two workers share two cores (more threads only
    spin); XLA's quick compilation (its kernels unoptimized), as most of the suite's programs
    compile more than they run, unless `optimized`: for those that run the tiny recipe's 160
    steps (measured: those run 1.6 times as long unoptimized, a search's compilations take 1.7
    times as long optimized)."""
    env = {**env, "JAX_COMPILATION_CACHE_DIR": os.path.join(base(), "jax-cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "TF_NUM_INTRAOP_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return with_xla_flags(env, f"--xla_backend_optimization_level={2 if optimized else 0}", "--xla_cpu_multi_thread_eigen=false")


def ensure():
    """The artifacts of this code, made now unless they exist."""
    folder = os.path.join(base(), key())
    if not os.path.exists(os.path.join(folder, "complete")):
        os.makedirs(base(), exist_ok=True)
        with open(os.path.join(base(), "lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be making them: wait for it
            if not os.path.exists(os.path.join(folder, "complete")):
                for name in os.listdir(base()):  # those of other code, and what a killed session left
                    if name != "lock":
                        shutil.rmtree(os.path.join(base(), name))
                _make(folder)
    return Artifacts(folder)


def _make(folder):
    start = time.monotonic()
    artifacts = Artifacts(folder)
    os.makedirs(folder)
    train = [sys.executable, "-m", "training.train"]
    this = [sys.executable, os.path.abspath(__file__)]
    multilingual = [*TINY, "--run-dir", artifacts.multilingual_run, *MULTILINGUAL]
    running = [
        _start(folder, "tensorflow", [*train, *TINY, "--run-dir", artifacts.tf_run, *EVALUATION]),
        _start(folder, "multilingual-start", [*train, *multilingual, "--steps", str(MULTILINGUAL_STOP)]),
        _start(folder, "jax", [*train, *JAX_RUN, "--run-dir", artifacts.jax_run, "--backend", "jax", "--no-evaluate"]),
        _start(folder, "reversal", [*this, "reversal", artifacts.reversal]),
    ]
    # Each next part starts once what it reads is made (the part of that name has ended): the JAX
    # run and the reversal model first (about half the TensorFlow runs' time), the exports last.
    worker = os.path.join(ROOT, "tests", "backend_worker.py")
    then = {
        "jax": [("jax-export", [sys.executable, "-m", "export", "--run-dir", artifacts.jax_run, "--out",
                                os.path.dirname(artifacts.exports["jax"])], "jax")],
        "reversal": [("jax-decode", [sys.executable, worker, "decode", os.path.join(artifacts.reversal, "model.weights.h5"),
                                     os.path.join(artifacts.reversal, "sources.npy")], "jax")],
        "tensorflow": [("float32-exports", [*this, "exports", folder, "float32"], "tensorflow"),
                       ("reduced-exports", [*this, "exports", folder, "bfloat16", "float16"], "tensorflow")],
        "multilingual-start": [("multilingual", [*train, *multilingual], "tensorflow")],
        "multilingual": [("multilingual-export", [sys.executable, "-m", "export", "--run-dir", artifacts.multilingual_run,
                                                  "--out", os.path.dirname(artifacts.exports["multilingual"])], "tensorflow")],
    }  # fmt: skip
    while then:
        for process in [process for process in running if process.name in then and process.poll() is not None]:
            _wait(process, running)  # raises with its output if it failed
            running += [_start(folder, *part) for part in then.pop(process.name)]
        time.sleep(0.1)
    for process in running:
        _wait(process, running)
    with open(os.path.join(folder, "complete"), "w") as f:  # how long each part ran, for whoever makes them faster
        json.dump({"seconds": round(time.monotonic() - start, 1),
                   "parts": {p.name: [round(p.started - start, 1), round(p.ended - start, 1)] for p in running}}, f)


def _start(folder, name, command, backend="tensorflow"):
    env = {**suite_environment(os.environ, optimized=name in LONG_RUNS), "KERAS_BACKEND": backend, "PYTHONPATH": ROOT}
    with open(os.path.join(folder, f"{name}.out"), "w") as out:
        process = subprocess.Popen(["timeout", str(TIMEOUT_SECONDS), *command], cwd=ROOT, env=env, stdout=out,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    process.name, process.log, process.started = name, os.path.join(folder, f"{name}.out"), time.monotonic()
    return process


def _wait(process, running):
    """Waits for `process`, noting when each of `running` ends; raises with its output if it failed."""
    while process.poll() is None:
        for other in running:
            if other.poll() is not None and not hasattr(other, "ended"):
                other.ended = time.monotonic()
        time.sleep(0.1)
    if not hasattr(process, "ended"):
        process.ended = time.monotonic()
    if process.returncode != 0:
        with open(process.log, encoding="utf-8") as f:
            raise RuntimeError(f"Making the test artifact {process.name} failed ({process.returncode}):\n{f.read()[-4000:]}")


def _exports(folder, *precisions):
    """The TensorFlow run's exports in `precisions`: float32 with beam 1 and 4, the others beam 4."""
    from export.saved_model import export
    from keras_transformer.search import DecodingSettings

    artifacts = Artifacts(folder)
    for precision in precisions:
        for beam_size in (1, 4) if precision == "float32" else (4,):
            base = os.path.join(folder, "exports", precision)
            version = beam_size if precision == "float32" else 1
            export(artifacts.tf_run, base, DecodingSettings(beam_size=beam_size), version=version, precision=precision)


def _reversal(folder):
    """Trains the reversal model: `model.weights.h5`, its config `model.json` and `sources.npy`
    (48 test sources)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_transformer import BOS_ID, EOS_ID, Transformer, TransformerConfig
    from training.loss import smoothed_cross_entropy

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    config = TransformerConfig.tiny(24, num_layers=2, d_model=64, num_heads=4, d_ff=128, dropout=0.0)
    model = Transformer(config)
    optimizer = keras.optimizers.Adam(3e-3)

    def pairs(n):
        source, target_input, target_output = (np.zeros((n, 10), "int32") for _ in range(3))
        for row, length in enumerate(rng.integers(2, 9, size=n)):
            tokens = rng.integers(4, config.vocab_size, size=length)
            source[row, : length + 1] = [*tokens, EOS_ID]
            target_input[row, : length + 1] = [BOS_ID, *tokens[::-1]]
            target_output[row, : length + 1] = [*tokens[::-1], EOS_ID]
        return source, target_input, target_output

    @tf.function
    def train_step(source, target_input, target_output):
        with tf.GradientTape() as tape:
            loss_sum, tokens = smoothed_cross_entropy(target_output, model((source, target_input), training=True), 0.0)
            loss = loss_sum / tokens
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    for _ in range(REVERSAL_STEPS):
        train_step(*pairs(64))
    os.makedirs(folder)
    model.save_weights(os.path.join(folder, "model.weights.h5"))
    with open(os.path.join(folder, "model.json"), "w") as f:  # as tests/backend_worker.py reads it
        json.dump(config.to_dict(), f)
    np.save(os.path.join(folder, "sources.npy"), pairs(48)[0])


if __name__ == "__main__":
    if len(sys.argv) == 1:
        print(ensure().folder)
    else:
        {"exports": _exports, "reversal": _reversal}[sys.argv[1]](*sys.argv[2:])
