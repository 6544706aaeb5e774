"""Shared test setup: quiet TensorFlow without its graph rewrites, two logical CPU devices for
distribution tests, the environment of every process (artifacts.suite_environment), the slow
tests first; the tolerance of scores computed two ways; what the TensorFlow and the JAX checks
of one feature share; one load of each shared export a process."""

import functools
import json
import os
import resource
import subprocess
import sys
import threading
import time

import artifacts as shared

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.update(shared.suite_environment(os.environ))  # inherited by every process a test starts

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench.common import with_xla_flags  # noqa: E402
from export.layout import WARMUP_REQUESTS  # noqa: E402
from training.recipes import MECHANICS  # noqa: E402

# TensorFlow's graph rewrites (grappler's folding, fusing, layout and arithmetic passes) take
# seconds on each of the suite's many graphs, and a test's graph runs a few times. Off in the
# suite's own process; function inlining stays, so that an error names a signature's input as a
# server's does. The processes that tests start (the commands, the C++ loader) keep them.
tf.config.optimizer.set_experimental_options({name: False for name in (
    "layout_optimizer", "constant_folding", "shape_optimization", "remapping", "arithmetic_optimization",
    "dependency_optimization", "loop_optimization", "debug_stripper", "scoped_allocator_optimization",
    "pin_to_host_optimization", "implementation_selector")})  # fmt: skip

# Must happen before TensorFlow initialises its devices: tests of MirroredStrategy need two.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()],
)


# Scores computed two ways (graphs, batches, XLA) round up to ~2e-6 apart, by CPU; a wrong term or penalty, far more.
SCORE_TOLERANCE = dict(rtol=1e-5, atol=1e-5)


CENSUS_VARIABLE = "KERAS_TRANSFORMER_CENSUS"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    """With $KERAS_TRANSFORMER_CENSUS set to a file, appends a JSON line a test: when it started
    (seconds since the epoch, to lay the workers' tests on one time line), its wall seconds,
    the CPU seconds of this process and of the processes it started (and waited for), and how
    many it started (the shared artifacts' processes, started and waited for by a thread, count
    toward the tests that run meanwhile). The census of where the suite's time goes."""
    path = os.environ.get(CENSUS_VARIABLE)
    if not path:
        yield
        return
    started, execute = [0], subprocess.Popen._execute_child

    def counted(self, *args, **kwargs):
        started[0] += 1
        return execute(self, *args, **kwargs)

    subprocess.Popen._execute_child = counted
    started_at, wall, own = time.time(), time.monotonic(), time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        yield
    finally:
        subprocess.Popen._execute_child = execute
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        line = {"test": item.nodeid, "started": started_at, "wall": time.monotonic() - wall,
                "cpu": time.process_time() - own,
                "children_cpu": after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime,
                "processes": started[0], "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}  # fmt: skip
        with open(path, "a") as f:
            f.write(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in line.items()}) + "\n")


# The groups of tests (pytest-xdist's) that start before the shared artifacts exist: the benchmarks'
# smoke modes that need none of them run first (tests/test_bench.py).
EARLY_GROUPS = ("bench",)


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(config, items):
    """The slow tests first, so that two workers do not end on one long test; of each kind, those
    that run without the shared artifacts (tests/artifacts.py) before those that wait for them,
    and the groups (the longest) before single tests. A process that collects a test that needs
    the artifacts starts making them now, in the background: the first tests run while they are
    made, rather than a worker waiting for them."""

    def unit(item):  # what one worker runs in turn: a group's tests wait if one of them waits
        marker = item.get_closest_marker("xdist_group")
        return marker.args[0] if marker else item.nodeid

    needs = [item for item in items if "artifacts" in item.fixturenames]
    waiting = {unit(item) for item in needs} - set(EARLY_GROUPS)
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, unit(item) in waiting,
                                 item.get_closest_marker("xdist_group") is None))  # fmt: skip
    if needs and not config.option.collectonly:
        threading.Thread(target=shared.ensure, name="artifacts", daemon=True).start()  # the fixture waits on its lock


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
    """`tokenize(corpus, tokenizer, **kwargs)`: the `tokenized.TokenizedShards` of the corpus's
    training split, in this test's folder (`pairs_per_shard` goes to the cut, the rest to
    `TokenizedShards`). Their writers are stopped when the test ends."""
    from training import shards
    from training.tokenized import TokenizedShards

    made = []

    def make(corpus, tokenizer, pairs_per_shard=shards.PAIRS_PER_SHARD, **kwargs):
        folder = tmp_path / f"shards-{len(made)}"
        text = corpus.training_split(str(folder / "text"), pairs_per_shard=pairs_per_shard)
        made.append(TokenizedShards(text, tokenizer, str(folder / "tokenized"), **kwargs))
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
    env = with_xla_flags({**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": ROOT},
                         f"--xla_force_host_platform_device_count={devices}")
    result = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


# For the TensorFlow and the JAX check of training time (backend_worker.py's clocked): calls of
# 2 steps, each a minute long on a fake clock: the step rule saves at 8, the clock's rule after 3
# and 5 calls (2.5 and 5 minutes passed), and --max-minutes stops the 40 steps after 6 calls (12)
# with a checkpoint.
CLOCKED = ["60", *MECHANICS, "--steps-per-call", "2", "--checkpoint-every", "8", "--checkpoint-every-minutes", "2.5",
           "--max-minutes", "6", "--keep-checkpoints", "10", "--no-evaluate"]  # fmt: skip
CLOCKED_CHECKPOINTS = [6, 8, 10, 12]
CLOCKED_STOP = "Stopped at step 12 of 40: --max-minutes 6.0 reached."


ACCUMULATION_CONFIG = dict(vocab_size=60, num_layers=1, d_model=32, num_heads=2, d_ff=64, dropout=0.0, max_length=16)


def accumulation_batches(folder):
    """Two batches of different lengths and target token counts (4 rows of 6 with 8 tokens, 6 rows
    of 10 with 50) and their union (the first padded to 10, rows stacked), for gradient
    accumulation checks, as npz files for backend_worker's `step`: ({"a", "b", "a+b" (the two in
    turn), "union"} -> path, (tokens of a, tokens of b))."""
    rng = np.random.default_rng(1)

    def batch(target_lengths, length):
        rows = len(target_lengths)
        target = np.zeros((rows, length), np.int32)
        for row, count in enumerate(target_lengths):
            target[row, :count] = rng.integers(4, 60, size=count)
        return {"source": rng.integers(4, 60, size=(rows, length)).astype(np.int32),
                "target_input": np.concatenate([np.full((rows, 1), 2, np.int32), target[:, :-1]], axis=1),
                "target_output": target, "dropped_pairs": np.zeros([rows], np.int64)}  # fmt: skip

    a, b = batch([2, 3, 2, 1], 6), batch([9, 10, 8, 7, 10, 6], 10)
    pad = lambda value: np.pad(value, [(0, 0), (0, 10 - value.shape[1])]) if value.ndim == 2 else value  # noqa: E731
    union = {name: np.concatenate([pad(a[name]), b[name]]) for name in a}
    paths = {name: os.path.join(folder, f"{name}.npz") for name in ("a", "b", "a+b", "union")}
    for name, fields in (("a", a), ("b", b), ("union", union)):
        np.savez(paths[name], **fields)
    np.savez(paths["a+b"], **{f"{i}/{name}": value for i, part in enumerate((a, b)) for name, value in part.items()})
    return paths, (int(np.sum(a["target_output"] != 0)), int(np.sum(b["target_output"] != 0)))


def assert_accumulation_is_exact(updated, start, tokens, atol):
    """`updated`, weights [name -> array] after runs of backend_worker's `step` (SGD) from
    `start`: one update of a+b accumulated equals one of their union and their token-weighted
    mean of a's and b's alone (not the plain mean of the two means, which must differ)."""
    delta = {name: updated[name] - start for name in ("a", "b", "a+b", "union")}
    (a_tokens, b_tokens), total = tokens, sum(tokens)
    weighted = (a_tokens * delta["a"] + b_tokens * delta["b"]) / total
    np.testing.assert_allclose(delta["a+b"], delta["union"], rtol=0, atol=atol)
    np.testing.assert_allclose(delta["a+b"], weighted, rtol=0, atol=atol)
    assert np.max(np.abs(delta["a+b"] - (delta["a"] + delta["b"]) / 2)) > 100 * atol


@pytest.fixture(scope="session")
def artifacts():
    """The suite's shared runs and exports (tests/artifacts.py), made once for this code. Read
    only: a test that changes a run folder copies it first. Subprocesses (the benchmarks' smoke
    modes) find the run and the beam-4 and greedy exports through bench/smoke.py's variables."""
    from bench import smoke

    made = shared.ensure()
    os.environ[smoke.RUN_VARIABLE], os.environ[smoke.EXPORT_VARIABLE] = made.tf_run, made.exports[4]
    os.environ[smoke.GREEDY_EXPORT_VARIABLE] = made.exports[1]
    return made


@pytest.fixture(scope="session")
def reversal_model(artifacts):
    """The shared reversal model (tests/artifacts.py: a model whose outputs end at different
    lengths, for decoding tests): (model, its weights file, 48 test sources)."""
    from keras_transformer import Transformer, TransformerConfig

    with open(os.path.join(artifacts.reversal, "model.json")) as f:
        model = Transformer(TransformerConfig.from_dict(json.load(f)))
    weights = os.path.join(artifacts.reversal, "model.weights.h5")
    model.load_weights(weights)
    return model, weights, np.load(os.path.join(artifacts.reversal, "sources.npy"))


_LOAD = tf.saved_model.load  # loaded_export's, also while a test has put loaded_export in its place


@functools.cache
def loaded_export(path):
    """`tf.saved_model.load(path)`, once a test process: tests that call an export of the shared
    artifacts share it (a load takes seconds, and so does each of its functions' first call).
    A test may put it in place of `tf.saved_model.load` for the commands it calls in-process."""
    return _LOAD(path)


# saved_model_cli (TensorFlow's console script, run by this interpreter rather than found on PATH)
# with tensorflow-text's ops registered, as TF Serving's binary has them.
SAVED_MODEL_CLI = [sys.executable, "-c", "import sys, tensorflow_text; from tensorflow.python.tools import saved_model_cli; "
                   "sys.exit(saved_model_cli.main())"]  # fmt: skip


def warmup_requests(export_dir):
    """The requests of the export's warm-up file, as TF Serving replays them: [(signature name,
    {input name: tensor})]."""
    from tensorflow_serving.apis import prediction_log_pb2

    requests = []
    for record in tf.data.TFRecordDataset(os.path.join(export_dir, WARMUP_REQUESTS)):
        request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
        inputs = {key: tf.constant(tf.make_ndarray(proto)) for key, proto in request.inputs.items()}
        requests.append((request.model_spec.signature_name, inputs))
    return requests


def assert_stock_cpu_graph(export_dir, xla=False):
    """Asserts that every node of the SavedModel in `export_dir` has a CPU kernel of stock
    TensorFlow or tf-text for its dtypes, and that no function or op is XLA's (with `xla`: every
    node outside the functions XLA compiles, but for XLA's own ops); returns the nodes."""
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow.python.framework import op_def_registry

    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    graph = saved_model.meta_graphs[0].graph_def
    nodes = list(graph.node)
    for function in graph.library.function:
        if function.attr["_XlaMustCompile"].b:
            assert xla, function.signature.name
            continue
        nodes += function.node_def
    if xla:  # the loops inside a compiled function are functions of their own, with XLA's ops
        nodes = [node for node in nodes if not node.op.startswith("Xla")]
    defined = {function.signature.name for function in graph.library.function}
    ops = {node.op for node in nodes}
    assert not {op for op in ops - defined if op_def_registry.get(op) is None}
    assert "SentencepieceOp" in ops and not {op for op in ops if op.startswith("Xla")}
    # Op names are blind to dtypes: a bfloat16 BatchMatMul needs its own kernel.
    missing = {(node.op, str(sorted(tf.as_dtype(t).name for a in node.attr.values() for t in _types_of(a))))
               for node in nodes if node.op not in defined and not _cpu_kernel_for(node)}  # fmt: skip
    assert not missing
    return nodes


def _cpu_kernel_for(node):
    """Whether TensorFlow (or tf-text, imported by the project) registers a CPU kernel (or one
    for every device) for the node's op whose type constraints its dtype attributes meet."""
    types = {name: frozenset(_types_of(value)) for name, value in node.attr.items()}
    return _has_cpu_kernel(node.op, frozenset(types.items()))


@functools.cache
def _has_cpu_kernel(op, types):
    from tensorflow.python.framework import kernels

    types = dict(types)
    for kernel in kernels.get_registered_kernels_for_op(op).kernel:
        if kernel.device_type not in ("CPU", "DEFAULT"):
            continue
        if all(types[c.name] <= set(c.allowed_values.list.type) for c in kernel.constraint if c.name in types):
            return True
    return False


def _types_of(attr):
    return {attr.type} if attr.HasField("type") else set(attr.list.type)
