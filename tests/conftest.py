"""Shared test setup: quiet TensorFlow, two logical CPU devices for distribution tests."""

import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# Must happen before TensorFlow initialises its devices: tests of MirroredStrategy need two.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()],
)


@pytest.fixture(autouse=True)
def _seed_and_policy():
    """Each test starts from a fixed seed and the float32 policy."""
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def synthetic_corpus():
    from training.data import load_corpus

    return load_corpus("synthetic")


@pytest.fixture(scope="session")
def three_shard_corpus(tmp_path_factory):
    """A folder of text files (train.en, train.de) of the synthetic corpus' sentences, three
    shards' worth: enough for two processes that each read a share."""
    from training import synthetic

    path = tmp_path_factory.mktemp("three-shards")
    splits = synthetic.generate_splits(0, train=45_000, dev=10, test=10)
    for side, lang in enumerate(("en", "de")):
        (path / f"train.{lang}").write_text("".join(pair[side] + "\n" for pair in splits["train"]))
    return path


@pytest.fixture(scope="session")
def synthetic_sentencepiece(synthetic_corpus):
    from training.tokenizer import train_sentencepiece

    texts = [text for pair in synthetic_corpus.text_pairs("train", 5000) for text in pair]
    return train_sentencepiece(texts, vocab_size=1000)


@pytest.fixture
def tokenize(tmp_path):
    """`tokenize(corpus, tokenizer, **kwargs)`: the `shards.TokenizedShards` of the corpus's
    training split, in this test's folder (`pairs_per_shard` goes to the cut, the rest to
    `TokenizedShards`). Their writers are stopped when the test ends."""
    from training import shards

    made = []

    def make(corpus, tokenizer, pairs_per_shard=shards.PAIRS_PER_SHARD, **kwargs):
        folder = tmp_path / f"shards-{len(made)}"
        text = corpus.training_split(str(folder / "text"), pairs_per_shard=pairs_per_shard)
        made.append(shards.TokenizedShards(text, tokenizer, str(folder / "tokenized"), **kwargs))
        return made[-1]

    yield make
    for tokenized in made:
        tokenized.close()


@pytest.fixture
def synthetic_tokenizer(synthetic_sentencepiece):
    # Per test: tf.random.set_seed (run before each test) clears the kernel that owns the
    # SentencePiece resource.
    from training.tokenizer import Tokenizer

    return Tokenizer(synthetic_sentencepiece)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "backend_worker.py")


def run_under(backend, *args, devices=1):
    """Runs `python *args` with Keras on `backend`, over `devices` host CPU devices under JAX,
    for at most 15 minutes; returns its standard output."""
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": ROOT}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    result = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout
# A small, fast command-line run: no dropout, so that two runs over the same data give the same
# weights. Tests add the flags they need (--backend, --steps, evaluation).
FAST_TRAINING = ["--steps", "40", "--checkpoint-every", "8", "--steps-per-call", "4", "--dropout", "0",
                 "--batch-tokens", "512", "--max-length", "24", "--vocab-size", "500", "--strategy", "cpu"]  # fmt: skip


def train_command(run_dir, *extra):
    import sys

    return [sys.executable, "-m", "training.train", "--run-dir", str(run_dir), *FAST_TRAINING, *extra]


@pytest.fixture(scope="session")
def cli_run(tmp_path_factory):
    """One TensorFlow run of `python -m training.train` with FAST_TRAINING, dev BLEU every 16
    steps on 20 sentences and test BLEU at the end, shared by the tests that read a trained run
    folder (the resume reference, the command-line tests, export). Tests that change a run folder
    copy it first."""
    import subprocess

    path = tmp_path_factory.mktemp("cli_run") / "run"
    subprocess.run(train_command(path, "--eval-every", "16", "--eval-sentences", "20"), check=True, cwd=ROOT,
                   capture_output=True)  # fmt: skip
    return path


@pytest.fixture(scope="session")
def reversal_model(tmp_path_factory):
    """A tiny Transformer trained for some seconds to reverse 2 to 8 tokens (a model whose outputs
    end at different lengths, for decoding tests), its weights file, and 48 test sources."""
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
        loss = train_step(*pairs(64))
    weights = str(tmp_path_factory.mktemp("reversal") / "model.weights.h5")
    model.save_weights(weights)
    with open(weights.replace(".weights.h5", ".json"), "w") as f:  # as tests/backend_worker.py reads it
        json.dump(config.to_dict(), f)
    return model, weights, pairs(48)[0], float(loss)


REVERSAL_STEPS = 400
