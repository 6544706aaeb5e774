"""Writes a run's model as a SavedModel for serving: `export(run_dir, base)`, or from the command
line `python -m export --run-dir DIR --out BASE` (export/__main__.py).

The layout TF Serving watches: one numbered folder per version under a base path. The export is
written to a hidden folder beside it and renamed into place, so a server never sees half a model
and an interrupted export leaves no version behind. Decoding settings are fixed at export.

The SavedModel's assets hold the SentencePiece model, the model config and `metadata.json`
(languages and pairs, vocabulary, decoding settings, source checkpoint, BLEU if the run has it), and
`assets.extra/tf_serving_warmup_requests` the requests TF Serving warms a new version up with.
"""

import dataclasses
import json
import os
import re
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf

from export.layout import METADATA, TARGET_LANGUAGES, WARMUP_REQUESTS
from export.serving import PARALLEL_SEARCHES, Translator
from export.signatures import SIGNATURES
from keras_transformer import Transformer
from keras_transformer.search import DecodingSettings
from keras_transformer.search.alignment import check_layer
from training.run_folder import RunFolder, local_copy

WARMUP_BATCH_SIZES = (1, 32)  # the batch sizes of the warm-up requests (export/layout.py)


def write_warmup_requests(path, tokenizer, max_source_length, settings, choices, seed=0, compiled_shapes=None):
    """Writes `path`: for each signature of `SIGNATURES`, one `PredictionLog` record per batch size
    of `WARMUP_BATCH_SIZES`, a request of made-up sentences (random pieces of the vocabulary, of
    lengths up to the model's `max_source_length`) and the signature's warm-up values for an
    export of `settings` and `choices` (its metadata.json, or the keys of it that inputs pick
    from: export/signatures.py `Input.choices`). With `compiled_shapes` (an XLA export),
    `serving_default` also gets a request of each compiled shape, so that the server compiles
    them all before it serves."""
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    rng = np.random.default_rng(seed)
    requests = [(signature, batch, (1, max_source_length)) for signature in SIGNATURES for batch in WARMUP_BATCH_SIZES]
    if compiled_shapes is not None:
        lengths = compiled_shapes.source_lengths
        requests += [(SIGNATURES[0], batch, (lengths[i - 1] + 1 if i else 1, length))
                     for batch in compiled_shapes.batch_sizes for i, length in enumerate(lengths)]  # fmt: skip
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for signature, batch, longest in requests:
            text = _made_up_text(tokenizer, rng, batch, *longest)
            request = predict_pb2.PredictRequest()
            request.model_spec.signature_name = signature.name
            for name, values in signature.warmup(text, settings, choices).items():
                request.inputs[name].CopyFrom(tf.make_tensor_proto(values, dtype=tf.string if values.dtype == object else None))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())


def _made_up_text(tokenizer, rng, batch, low, high):
    """`batch` sentences of random pieces whose longest source (`encode_source`: its pieces and
    the end of sentence) has `low` to `high` pieces. Text of n pieces may read back as a few more
    or fewer, so each draw is checked."""
    def source_lengths(text):
        return tokenizer.encode_source(tf.constant(text)).row_lengths().numpy()

    source = tokenizer.source
    for _ in range(1000):
        lengths = rng.integers(1, high, size=batch)  # pieces, before the end of sentence
        lengths[rng.integers(batch)] = rng.integers(max(low - 1, 1), high)
        ids = tf.ragged.constant([rng.integers(4, source.vocab_size, size=n).tolist() for n in lengths])
        text = source.detokenize(ids).numpy()
        if low <= source_lengths(text).max() <= high:
            return text
    raise RuntimeError(f"No made-up text of {low} to {high} pieces in 1000 draws.")


# The dtypes an export's weights and matmuls may have: float32, bfloat16 for CPUs with bfloat16
# instructions (AVX-512 BF16, AMX) and TPUs, float16 for GPUs.
PRECISIONS = ("float32", "bfloat16", "float16")


def in_precision(model, precision):
    """`model`, or for a `precision` other than float32 a copy whose weights are rounded to it
    and whose layers compute in it (Keras' `precision` dtype policy), with what the model keeps
    in float32 under any policy: the attention's softmax, layer normalization's statistics, the
    logits and so the search's scores (keras_transformer/attention.py, model.py)."""
    if precision not in PRECISIONS:
        raise ValueError(f"--precision is one of {', '.join(PRECISIONS)}; got {precision!r}.")
    if precision == "float32":
        return model
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        reduced = Transformer(model.config)
    finally:
        keras.config.set_dtype_policy(previous)
    for target, source in zip(reduced.weights, model.weights, strict=True):
        assert target.shape == source.shape, (target.path, source.path)  # both built from the config, in one order
        target.assign(keras.ops.cast(source.value, target.dtype))
    return reduced


def next_version(base):
    """One more than the highest numbered version under `base` (1 for a new base path)."""
    versions = [int(name) for name in os.listdir(base) if re.fullmatch(r"\d+", name)] if os.path.isdir(base) else []
    return max(versions, default=0) + 1


def export(run_dir, base, settings=DecodingSettings(), *, version=None, checkpoint=None, searches=PARALLEL_SEARCHES,
           precision="float32", compiled_shapes=None, shortlist=None):  # fmt: skip
    """Exports the run's model (averaged checkpoint if it is the newest, else the latest, unless
    `checkpoint` names one) with `settings` to `base/<version>/`, its requests decoded by
    `searches` parallel searches (export/serving.py), its weights and matmuls in `precision`
    (`in_precision`), requests of `compiled_shapes` (an `export.xla.CompiledShapes`) compiled by
    XLA (None: no XLA), over a vocabulary `shortlist`: "run" for the run's (learned first if it
    has none: training/shortlist.py), or a path to a table of that format (None: no shortlist);
    returns that folder."""
    if searches < 1:
        raise ValueError(f"--searches must be at least 1; got {searches}.")
    if keras.config.backend() != "tensorflow":
        raise ValueError(
            f"The export builds a TensorFlow graph, but Keras runs on {keras.config.backend()}: run "
            "`python -m export` (it uses the TensorFlow backend), or set KERAS_BACKEND=tensorflow."
        )
    version = version or next_version(base)
    target = os.path.join(base, str(version))
    if os.path.exists(target):  # before the model is loaded: a clash fails at once
        raise ValueError(f"{target} exists already: choose another --version.")
    run = RunFolder(run_dir)
    model, checkpoint = run.load_model(checkpoint)
    model = in_precision(model, precision)
    check_layer(model, settings.alignment_layer)  # before the SavedModel's functions are traced
    if compiled_shapes is not None:
        compiled_shapes = compiled_shapes.within(model.config.max_length)
    tokenizer = run.load_tokenizer()
    served = run.targets()
    table, shortlist_record = _shortlist(run, shortlist) if shortlist else (None, None)
    run_settings, metrics = run.settings(), {}
    if tf.io.gfile.exists(run.metrics_path):
        with tf.io.gfile.GFile(run.metrics_path) as f:
            metrics = json.load(f)
    os.makedirs(base, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".export-{version}-", dir=base)  # hidden: TF Serving skips it
    try:
        metadata = {
            "source_lang": run_settings["source_lang"],
            "target_lang": run_settings["target_lang"],
            "pairs": run_settings["pairs"].split(","),
            TARGET_LANGUAGES: list(served),
            "dataset": run_settings["dataset"],
            "vocab_size": model.config.vocab_size,
            **dataclasses.asdict(settings),
            "searches": searches,
            "precision": precision,
            "max_source_length": model.config.max_length,
            "xla": None if compiled_shapes is None else dataclasses.asdict(compiled_shapes),
            "checkpoint": checkpoint,
            "shortlist": shortlist_record,
            **{key: metrics[key] for key in ("bleu", "chrf", "signature", "steps") if key in metrics},
        }
        assets = os.path.join(staging, "_assets")
        os.makedirs(assets)
        with open(os.path.join(assets, os.path.basename(METADATA)), "w") as f:
            json.dump(metadata, f, indent=2, sort_keys=True)
        asset_paths = [os.path.join(assets, os.path.basename(METADATA))]
        for path, name in _RUN_ASSETS.items():
            if tf.io.gfile.exists(getattr(run, path)):
                asset_paths.append(os.path.join(assets, name))
                tf.io.gfile.copy(getattr(run, path), asset_paths[-1])
        translator = Translator(model, tokenizer, settings, languages=served, assets=asset_paths, searches=searches,
                                compiled_shapes=compiled_shapes, shortlist=table)  # fmt: skip
        saved = os.path.join(staging, "model")
        signatures = {signature.name: getattr(translator, signature.method) for signature in SIGNATURES}
        tf.saved_model.save(translator, saved, signatures=signatures)
        write_warmup_requests(os.path.join(saved, WARMUP_REQUESTS), tokenizer, model.config.max_length,
                              settings, metadata, compiled_shapes=compiled_shapes)  # fmt: skip
        os.rename(saved, target)  # atomic on one filesystem
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


# The run's files an export carries in its assets: {RunFolder attribute: the asset's name}. The
# tokenizer's (training/tokenizer.py) are in the graph too; these are for a reader of the export.
_RUN_ASSETS = {"config_path": "config.json", "tokenizer_path": "sentencepiece.model",
               "target_tokenizer_path": "target_sentencepiece.model", "pieces_path": "pieces.json"}


def _shortlist(run, shortlist):
    """The table of `shortlist` ("run", or a file's path) for the run's vocabulary, and what
    metadata.json records of it."""
    import sentencepiece

    from training import shortlist as lexical

    lexical.check_tokenizer(run)
    path = run.shortlist_path if shortlist == "run" else shortlist
    if shortlist == "run" and not tf.io.gfile.exists(path):
        print(f"{run.path} has no shortlist yet: learning one from its training split (training/shortlist.py).", flush=True)
        lexical.learn(run.path)
    if not tf.io.gfile.exists(path):
        raise ValueError(f"--shortlist {path}: no such file.")
    with local_copy(run.tokenizer_path) as tokenizer_path:
        try:
            table, always = lexical.read(path, sentencepiece.SentencePieceProcessor(model_file=tokenizer_path))
        except ValueError as error:
            raise ValueError(f"--shortlist {error}") from None
    record = {"file": path, "candidates_per_piece": table.shape[1], "always": len(always)}
    if path == run.shortlist_path and tf.io.gfile.exists(run.shortlist_record_path):
        with tf.io.gfile.GFile(run.shortlist_record_path) as f:
            record["learned"] = json.load(f)
    return (table, always), record
