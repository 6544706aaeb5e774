"""Runs under either Keras backend, in its own process (tests choose KERAS_BACKEND and XLA_FLAGS):

    step IN_WEIGHTS BATCH STEPS OUT [POLICY [DEVICES [ACCUMULATE [OPTIMIZER]]]]
                                           train STEPS updates of the product's backend step on
                                           the batch (npz: fields), or the batches (npz: "i/field")
                                           in turn, from weights in IN_WEIGHTS (.weights.h5), under
                                           a Keras dtype POLICY (default float32), over the first
                                           DEVICES host devices (JAX; default all), ACCUMULATE
                                           batches an update (default 1), with Adam or SGD
                                           (OPTIMIZER; either on the schedule of warm-up 10);
                                           write OUT.weights.h5 and OUT.json (losses, replicas,
                                           the optimizer's iterations)
    translate RUN_DIR SOURCES_JSON         greedy and beam search of the run's model, compiled for
                                           the backend, on sentences; prints JSON
    decode WEIGHTS SOURCES_NPY             greedy and beam 4 search of the model in WEIGHTS
                                           (.weights.h5 beside its config .json), compiled for the
                                           backend, on source ids, and both with a target prefix
                                           (`PREFIX`), and sampling (`SAMPLING`), and each with
                                           per-sentence options (`processed_options`), and the
                                           scores of the sources as targets (`scored`); prints
                                           JSON tokens and scores
    crash-mid-save RUN_DIR ...FLAGS        train with FLAGS but fail while writing the second
                                           checkpoint; prints the checkpoints left
    train ...FLAGS, evaluate ...FLAGS      training.train's and training.evaluate's main
    clocked RUN_DIR SECONDS ...FLAGS       training.train on a fake clock, each call of training
                                           steps SECONDS long; prints its checkpoints' steps
    remote RUN_DIR OUT ...FLAGS            train 4 steps, then on to 8 (resuming), and average, in a
                                           run folder on a non-POSIX filesystem (ram://); prints JSON
                                           and writes the model at step 8 to OUT (.weights.h5)
    two-shares RUN_DIR ...FLAGS            train with FLAGS in this one process on global batches
                                           made as two processes make them: rows of share 0 of
                                           2, then rows of share 1, of one scheduled bucket
    session COMMANDS_JSON                  the commands [[name, ...args], ...] one after another in
                                           this one process, each but `step` on its first host
                                           device; prints a JSON list of what each printed
"""

import contextlib
import io
import itertools
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

from keras_transformer import TransformerConfig
from keras_transformer.search import DecodingSettings, sample_search, score
from keras_transformer.search import decode as decode_with
from training import backends, data, evaluate
from training.run_folder import RunFolder
from training.schedule import TransformerSchedule, paper_optimizer
from training.tokenized import TokenizedShards
from training.train import parse_args, train


def step(weights_path, batch_path, steps, out, policy="float32", devices=None, accumulate_steps=1, optimizer="adam"):
    with open(weights_path.replace(".weights.h5", ".json")) as f:
        config = TransformerConfig.from_dict(json.load(f))
    keras.mixed_precision.set_global_policy(policy)  # mixed_float16 gets loss scaling (TensorFlow)
    with first_devices(devices):
        backend = backends.create("cpu")
    schedule = TransformerSchedule(config.d_model, warmup_steps=10)
    make = {"adam": lambda: paper_optimizer(schedule), "sgd": lambda: keras.optimizers.SGD(schedule)}[optimizer]
    backend.build(config, make)
    backend.model.load_weights(weights_path)
    backend.compile(label_smoothing=0.1, accumulate_steps=int(accumulate_steps))
    iterator = iter(batches_in_turn(batch_path))
    losses = [backend.train_steps(iterator, 1)[0] for _ in range(int(steps))]
    backend.sync_model()
    backend.model.save_weights(out + ".weights.h5")
    with open(out + ".json", "w") as f:
        json.dump({"losses": losses, "replicas": backend.num_replicas, "backend": backend.name,
                   "optimizer": type(backend.optimizer).__name__, "iterations": backend.step}, f)  # fmt: skip
    keras.mixed_precision.set_global_policy("float32")


def batches_in_turn(path):
    """A dataset of the batch in `path` (npz of its fields) repeated, or of its batches ("i/field")
    in turn, round after round."""
    with np.load(path) as saved:
        fields = {name: saved[name] for name in saved.files}
    if "0/source" not in fields:
        return tf.data.Dataset.from_tensors(fields).repeat()
    count = len({name.split("/")[0] for name in fields})
    batches = [{name.split("/")[1]: value for name, value in fields.items() if name.startswith(f"{i}/")} for i in range(count)]
    signature = {name: tf.TensorSpec([None] * value.ndim, value.dtype) for name, value in batches[0].items()}
    return tf.data.Dataset.from_generator(lambda: itertools.cycle(batches), output_signature=signature)


@contextlib.contextmanager
def first_devices(count):
    """While open, JAX trains on the first `count` of this process' host devices (all if None)."""
    if count is None:
        yield
        return
    from training.backends import jax as jax_backend

    every = jax_backend.training_devices
    jax_backend.training_devices = lambda name: every(name)[: int(count)]
    try:
        yield
    finally:
        jax_backend.training_devices = every


def decode(weights_path, sources_path):
    from keras_transformer import Transformer

    with open(weights_path.replace(".weights.h5", ".json")) as f:
        model = Transformer(TransformerConfig.from_dict(json.load(f)))
    model.load_weights(weights_path)
    sources = np.load(sources_path)
    prefix = np.stack([PREFIX[row % len(PREFIX)] for row in range(len(sources))])

    def searches():  # name -> (compiled search, its inputs)
        for beam_size in (1, 4):
            settings = DecodingSettings(beam_size=beam_size, max_length_b=4)

            def prefixed(ids, prefix, execution, settings=settings):
                return decode_with(model, ids, settings, execution, target_prefix=prefix)

            yield str(beam_size), evaluate.compile_search(model, settings), (sources,)
            yield f"{beam_size} prefix", evaluate.compile_for_backend(model, prefixed), (sources, prefix)

        def sampled(ids, execution):
            return sample_search(model, ids, np.arange(len(sources)), execution=execution, **SAMPLING)

        yield "sample", evaluate.compile_for_backend(model, sampled), (sources,)
        for width in (1, 4):
            options = processed_options(len(sources), width)

            def processed(ids, execution, options=options):
                return decode_with(model, ids, DecodingSettings(max_length_b=4, **options), execution)

            yield f"{width} options", evaluate.compile_for_backend(model, processed), (sources,)

        def sampled_with_options(ids, execution):
            options = {name: value for name, value in processed_options(len(sources), 1).items() if name != "beam_size"}
            return sample_search(model, ids, np.arange(len(sources)), execution=execution, **SAMPLING, **options)

        yield "sample options", evaluate.compile_for_backend(model, sampled_with_options), (sources,)
        yield "score", evaluate.compile_for_backend(model, lambda *arrays: scored(model, *arrays)), (sources, sources)

    result = {}
    for name, search, inputs in searches():
        tokens, scores = search(*inputs)
        result[name] = [keras.ops.convert_to_numpy(tokens).tolist(), keras.ops.convert_to_numpy(scores).tolist()]
    print(json.dumps(result))


# The target prefixes and sampling options `decode` searches with, under each backend.
PREFIX = np.array([[5, 6], [7, 0], [0, 0]], "int32")
SAMPLING = dict(num_samples=2, temperature=1.5, top_k=6, top_p=0.9, max_length_b=4)


def processed_options(batch, width):
    """Per-sentence decoding options for `decode`'s "options" searches: every processor on for
    some sentences; beam sizes 1 to `width`."""
    return dict(
        beam_size=np.resize(np.arange(1, width + 1, dtype="int32"), batch),
        alpha=np.resize(np.array([0.6, 1.0], "float32"), batch),
        min_length=np.resize(np.array([0, 3, 5], "int32"), batch),
        no_repeat_ngram_size=np.resize(np.array([1, 0, 2], "int32"), batch),
        repetition_penalty=np.resize(np.array([1.0, 1.5], "float32"), batch),
        disable_unk=np.resize(np.array([True, False]), batch),
        suppress_sequences=np.resize(np.array([[[5, 0], [6, 7]], [[0, 0], [0, 0]]], "int32"), (batch, 2, 2)),
    )


def scored(model, source_ids, target_ids, execution):
    """`decode`'s "score": (lengths, per-token log-probabilities) of `target_ids`, their logits
    made 5 rows at a time (several blocks, the last part padding)."""
    result = score(model, source_ids, target_ids, rows_at_once=5)
    return result.length, result.token_log_probs


def translate(run_dir, sources_json):
    run = RunFolder(run_dir)
    model, _ = run.load_model()
    tokenizer = run.load_tokenizer()
    sources = json.loads(sources_json)
    batch = tokenizer.encode_source(tf.constant(sources)).to_tensor().numpy()
    result = {}
    for name, beam_size in (("greedy", 1), ("beam", 4)):
        settings = DecodingSettings(beam_size=beam_size, max_length_b=10)
        tokens, scores = evaluate.compile_search(model, settings)(batch)
        texts = tokenizer.target.detokenize(keras.ops.convert_to_numpy(tokens)).numpy()
        result[name] = [[t.decode() for t in texts], keras.ops.convert_to_numpy(scores).tolist()]
    print(json.dumps(result))


def crash_mid_save(run_dir, *flags):
    """training.train that fails while it writes its second checkpoint's state.json, the file that
    marks a checkpoint complete: half of the first text written, then an error."""
    files, original = [], tf.io.gfile.GFile.write

    def failing_write(self, data):
        if "state.json" in os.path.basename(self.name):  # the file, or where it is written aside
            if self.name not in files:
                files.append(self.name)
            if len(files) == 2:
                original(self, data[: len(data) // 2])
                raise OSError("disk full (simulated)")
        return original(self, data)

    tf.io.gfile.GFile.write = failing_write
    try:
        train(parse_args(["--run-dir", run_dir, *flags]))
    except OSError as error:
        print(f"crashed: {error}")
    finally:  # the session's next commands (the resume) write as usual
        tf.io.gfile.GFile.write = original
    print(json.dumps(sorted(os.listdir(os.path.join(run_dir, "checkpoints")))))


def clocked(run_dir, seconds_per_call, *flags):
    """training.train's main with a fake clock on which each call of training steps takes
    `seconds_per_call` (keep every checkpoint: --keep-checkpoints); prints the steps of the
    checkpoints in the run folder."""
    from training import train as training

    ticks = itertools.count()  # read before and after each call
    real, training.clock = training.clock, lambda: next(ticks) * float(seconds_per_call)
    try:
        training.main(["--run-dir", run_dir, *flags])
    finally:
        training.clock = real
    print(json.dumps([step for step, _ in RunFolder(run_dir).checkpoints()]))


def remote(run_dir, out, *flags):
    from training.average_checkpoints import average_checkpoints

    train(parse_args(["--run-dir", run_dir, *flags, "--steps", "4"]))
    _, metrics = train(parse_args(["--run-dir", run_dir, *flags, "--steps", "8"]))
    run = RunFolder(run_dir)
    run.load_model(run.checkpoints()[-1][1])[0].save_weights(out)  # ram:// is this process' memory
    averaged, _ = average_checkpoints(run_dir, last=2)
    _, loaded = run.load_model()
    print(json.dumps({"steps": metrics["steps"], "checkpoints": [step for step, _ in run.checkpoints()],
                      "averaged": averaged, "loaded": loaded}))  # fmt: skip


@contextlib.contextmanager
def batches_of_two_shares():
    """While open, `training.train` trains in this one process on global batches made as two
    processes make them: rows of share 0 of 2, then rows of share 1, of one scheduled bucket."""
    batches_of_a_share = data.training_batches

    def global_batches(tokenized, *, batch_tokens, max_length, batch_multiple, schedule):
        assert tokenized.share == list(range(tokenized.text.num_shards)) and schedule is None  # one process
        text, tokenizer, seed = tokenized.text, tokenized.tokenizer, tokenized.seed
        schedule = data.bucket_schedule(text, tokenizer, batch_tokens=batch_tokens // 2, max_length=max_length, num_shares=2)
        halves = [
            batches_of_a_share(TokenizedShards(text, tokenizer, tokenized.directory, seed, process, 2),
                                  batch_tokens=batch_tokens // 2, max_length=max_length,
                                  batch_multiple=max(1, batch_multiple // 2), schedule=schedule)
            for process in range(2)
        ]  # fmt: skip
        return tf.data.Dataset.zip(*halves).map(lambda first, second: {k: tf.concat([first[k], second[k]], 0) for k in first})

    data.training_batches = global_batches
    try:
        yield
    finally:
        data.training_batches = batches_of_a_share


def two_shares(run_dir, *flags):
    with batches_of_two_shares():
        train(parse_args(["--run-dir", run_dir, *flags]))


def session(commands):
    outputs = []
    for name, *args in json.loads(commands):
        printed = io.StringIO()
        # One device, as a process of its own would have, but for the steps that say how many.
        with contextlib.redirect_stdout(printed), first_devices(None if name == "step" else 1):
            COMMANDS[name](*args)
        outputs.append(printed.getvalue())
    print(json.dumps(outputs))


COMMANDS = {"step": step, "decode": decode, "translate": translate, "crash-mid-save": crash_mid_save, "remote": remote,
            "clocked": clocked,
            "two-shares": two_shares, "session": session, "train": lambda *argv: train(parse_args(list(argv))),
            "evaluate": lambda *argv: evaluate.main(list(argv))}  # fmt: skip

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
