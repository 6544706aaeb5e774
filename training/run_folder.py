"""The run folder: everything a training run writes, in one place. A local folder, or one on a
filesystem of TensorFlow's (`gs://` for a bucket): every file goes through `tf.io.gfile`, and
what only writes local files (Keras' HDF5 weights, NumPy's .npz) is written locally and copied.

    DIR/config.json          the model's TransformerConfig
    DIR/training.json        the settings of each segment of the run (each time training.train
                             ran on the folder): when it started, at which step, with which
                             flags and Keras backend (training/flags.py)
    DIR/tokenizer.model      the SentencePiece model (of the source, where each side has its own)
    DIR/target_tokenizer.model   the target's SentencePiece model, where each side has its own
    DIR/pieces.json          of an imported model (training/marian.py): {"source": [the piece of
                             each of the model's ids], "target": [...]} (training/tokenizer.py)
    DIR/data/text/           a folder's training files cut into shards, and the tokenizer's
                             sample (training/cut.py; TFDS and synthetic corpora need none);
                             for a run of several pairs, in data/text/SRC-TGT/, one for each
    DIR/data/tokenized-HASH/ the training split tokenized by the tokenizer of that hash, one
                             TFRecord file per shard, written while the first epoch trains
    DIR/checkpoints/         model, optimizer, step and data position: tf.train.Checkpoint files
                             `ckpt-STEP.*` (TensorFlow) or folders `ckpt-STEP/` (JAX; see
                             training/backends/jax.py), the last few kept; worker-w/, the
                             checkpoints of TensorFlow's worker w > 0
    DIR/averaged/            ckpt-STEP.weights.h5, the average of the last checkpoints, and
                             averaged.json, the steps it averages (training.average_checkpoints)
    DIR/best/                best.json, the best dev BLEU during training, its step and the
                             evaluations since (training/selection.py), and with --keep-best
                             its weights, ckpt-STEP.weights.h5
    DIR/shortlist.txt        the vocabulary shortlist's lexical table, and shortlist.json, how it
                             was learned (training/shortlist.py)
    DIR/logs/                TensorBoard: train/ and dev/
    DIR/metrics.json         what each command measured, each update kept beside the earlier
                             ones: test BLEU, chrF, sacreBLEU signatures, steps, train_seconds
                             (training.train), dev_* (training.evaluate --split dev), the
                             checkpoints averaged (training.average_checkpoints); for a run
                             of several pairs, each pair's in `pairs` and the mean beside them
    DIR/translations.SPLIT.txt   the last translations of SPLIT (test or dev), one a line
                             (training.train's test evaluation, training.evaluate); of each
                             pair of several in translations.SPLIT.SRC-TGT.txt
    DIR/learning_curve.png   loss and dev BLEU against training minutes (training.learning_curve)

A checkpoint's file or folder is named `checkpoint_name(step)`; `step_of` reads the step back.
"""

import contextlib
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile

import keras
import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig
from training import files, flags, languages
from training.tokenizer import Tokenizer, Vocabulary


class RunFolder:
    def __init__(self, path):
        self.path = path
        self.config_path = os.path.join(path, "config.json")
        self.settings_path = os.path.join(path, "training.json")
        self.tokenizer_path = os.path.join(path, "tokenizer.model")  # written last of the tokenizer's files
        self.target_tokenizer_path = os.path.join(path, "target_tokenizer.model")
        self.pieces_path = os.path.join(path, "pieces.json")
        self.checkpoint_dir = os.path.join(path, "checkpoints")
        self.text_dir = os.path.join(path, "data", "text")
        self.averaged_dir = os.path.join(path, "averaged")
        self.log_dir = os.path.join(path, "logs")
        self.metrics_path = os.path.join(path, "metrics.json")
        self.averaged_record_path = os.path.join(self.averaged_dir, "averaged.json")
        self.best_dir = os.path.join(path, "best")
        self.best_record_path = os.path.join(self.best_dir, "best.json")
        self.learning_curve_path = os.path.join(path, "learning_curve.png")
        self.shortlist_path = os.path.join(path, "shortlist.txt")
        self.shortlist_record_path = os.path.join(path, "shortlist.json")

    def translations_path(self, split, pair=None):
        """The translations of `split` (of `pair`, in a run of several)."""
        several = pair is not None and len(self.pairs()) > 1
        return os.path.join(self.path, f"translations.{split}{'.' + languages.pair_name(pair) if several else ''}.txt")

    def _read_json(self, path):
        if not tf.io.gfile.exists(path):
            raise ValueError(f"{path} does not exist: is {self.path} a run folder of training.train?")
        with tf.io.gfile.GFile(path) as f:
            return json.load(f)

    def write_json(self, path, values):
        """Writes aside and renames: a crash leaves the old file or the new one, never half of one."""
        self.write_text(path, json.dumps(values, indent=2, sort_keys=True))

    def write_text(self, path, text):
        """As `write_json`, for text."""
        tf.io.gfile.makedirs(os.path.dirname(path))
        with tf.io.gfile.GFile(files.aside(path), "w") as f:
            f.write(text)
        tf.io.gfile.rename(files.aside(path), path, overwrite=True)

    def config(self):
        return TransformerConfig.from_dict(self._read_json(self.config_path))

    def segments(self):
        """training.json's record, oldest first: `{"started", "step", "settings"}` for each time
        training.train ran on the folder (one with `started` None for a folder of older code,
        which kept only the last settings)."""
        record = self._read_json(self.settings_path)
        return record["segments"] if "segments" in record else [{"started": None, "step": 0, "settings": record}]

    def settings(self):
        """The last segment's settings, with `flags.resumed()`'s values for those it did not record."""
        defaults = {name: default for name, (_, default) in flags.resumed().items() if default is not None}
        settings = {**defaults, **self.segments()[-1]["settings"]}
        settings.setdefault("pairs", f"{settings['source_lang']}-{settings['target_lang']}")  # recorded since it exists
        return settings

    def check_resume(self, config, settings):
        """For a run about to train here with `config` and `settings`: nothing for a new run
        folder; else refuses (ValueError) a change that `flags.resumed()` refuses, and returns
        the reported changes as `[(name, old, new)]`."""
        if not tf.io.gfile.exists(self.settings_path):
            return []
        old_settings = self.settings()
        if old_settings.get("imported_from"):
            raise ValueError(f"{self.path} holds a model imported from {old_settings['imported_from']} "
                             "(training.import_marian), with no training state to resume: fine-tune it into a new "
                             f"--run-dir with --init-from {self.path}.")  # fmt: skip
        trained_by = old_settings["backend"]
        if trained_by != settings["backend"]:
            raise ValueError(
                f"The run in {self.path} was trained under {trained_by} ({self.settings_path}), and its "
                f"checkpoints hold that backend's optimizer state: resume it with KERAS_BACKEND={trained_by}. "
                f"Its model weights can be evaluated and exported under either backend."
            )
        old_config, new_config = self.config().to_dict(), config.to_dict()
        rules = flags.resumed()
        treatment = lambda name: rules.get(name, (flags.REFUSED,))[0]  # noqa: E731  (a model field: refused)
        # Dropout is compared in config.json, which holds its value; its flags may be None.
        compared = [name for name in rules if name not in new_config or treatment(name) == flags.REFUSED]
        found = {flags.REFUSED: [], flags.REPORTED: []}
        for old, new, path, names in ((old_config, new_config, self.config_path, list(new_config)),
                                      (old_settings, settings, self.settings_path, compared)):  # fmt: skip
            for name, a, b in _differences(old, new, names):
                found[treatment(name)].append((name, a, b, path))
        if found[flags.REFUSED]:
            raise ValueError(
                f"The run folder {self.path} holds a different run "
                f"({'; '.join(f'{name}: {a!r} in {path}, {b!r} now' for name, a, b, path in found[flags.REFUSED])}). "
                "Use another --run-dir, or the same flags (and number of processes) as the run that made it."
            )
        return [(name, a, b) for name, a, b, _ in found[flags.REPORTED]]

    def record_segment(self, config, settings, step, now=None):
        """Adds a segment to training.json (the run's first, for a new folder): `settings` from
        `step`, started `now` (default: the time, UTC); and writes `config` (whose dropout a
        resume may change)."""
        segments = self.segments() if tf.io.gfile.exists(self.settings_path) else []
        started = now or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.write_json(self.config_path, config.to_dict())
        self.write_json(self.settings_path, {"segments": [*segments, {"started": started, "step": step, "settings": settings}]})

    def load_tokenizer(self):
        """The run's `Tokenizer`: one SentencePiece model, or one a side (with their pieces, if any)."""
        if not tf.io.gfile.exists(self.tokenizer_path):
            raise ValueError(f"{self.tokenizer_path} does not exist: is {self.path} a run folder of training.train?")
        pieces = self._read_json(self.pieces_path) if tf.io.gfile.exists(self.pieces_path) else {}
        source = Vocabulary.load(self.tokenizer_path, pieces.get("source"), tags=True)
        if not tf.io.gfile.exists(self.target_tokenizer_path):
            return Tokenizer(source)
        return Tokenizer(source, Vocabulary.load(self.target_tokenizer_path, pieces.get("target")))

    def save_tokenizer(self, tokenizer):
        """Writes `tokenizer`'s files (`load_tokenizer`), each aside and renamed into place,
        `tokenizer_path` last: where it exists, so do the others."""
        tf.io.gfile.makedirs(self.path)
        sides = [tokenizer.source] if tokenizer.shared else [tokenizer.source, tokenizer.target]
        if any(side.mapped_pieces is not None for side in sides):
            self.write_json(self.pieces_path, {name: side.mapped_pieces for name, side in zip(("source", "target"), sides)})
        for side, path in reversed(list(zip(sides, (self.tokenizer_path, self.target_tokenizer_path)))):
            side.save(files.aside(path))
            tf.io.gfile.rename(files.aside(path), path, overwrite=True)

    def pairs(self):
        """The run's directions, ((source, target), ...): its first, the default, and the others."""
        return languages.parse_pairs(self.settings()["pairs"])

    def targets(self):
        """{target language: the text in front of a source that asks for it} of the run's pairs, in
        their order: its tag and a space where the vocabulary has tags (training/languages.py),
        else "" (a run of one pair)."""
        tagged = bool(languages.languages(self.load_tokenizer()))
        return {target: languages.tagged("", target) if tagged else "" for _, target in self.pairs()}

    def load_corpora(self):
        """{(source, target): data.Corpus} of the run's pairs."""
        settings = self.settings()
        return languages.load_corpora(settings["dataset"], pairs=self.pairs(), **flags.corpus_options(settings))

    def load_corpus(self):
        """The corpus of the run's first pair (of its only one, for most runs): its sources are
        untagged, as `languages.tagged` leaves them."""
        return next(iter(self.load_corpora().values()))

    def checkpoints(self):
        """The training checkpoints as [(step, path)], oldest first, in either backend's format."""
        found = []
        state = tf.train.get_checkpoint_state(self.checkpoint_dir)
        if state:  # TensorFlow: the CheckpointManager's list of file prefixes
            found += [(step_of(path), path) for path in state.all_model_checkpoint_paths]
        names = tf.io.gfile.listdir(self.checkpoint_dir) if tf.io.gfile.isdir(self.checkpoint_dir) else []
        for name in names:  # JAX: folders, complete once their state.json is written
            name = name.rstrip("/")
            path = os.path.join(self.checkpoint_dir, name)
            if re.fullmatch(r"ckpt-\d+", name) and tf.io.gfile.exists(os.path.join(path, "state.json")):
                found.append((step_of(name), path))
        return sorted(found)

    def worker_checkpoint_dir(self, worker):
        """Where TensorFlow's worker `worker` keeps its checkpoints (worker 0: `checkpoint_dir`)."""
        return self.checkpoint_dir if worker == 0 else os.path.join(self.checkpoint_dir, f"worker-{worker}")

    def tokenized_dir(self, tokenizer):
        """Where the training split tokenized by `tokenizer` is kept (`tokenized.TokenizedShards`)."""
        return os.path.join(self.path, "data", f"tokenized-{tokenizer.digest()[:16]}")

    def averaged(self):
        """(path, the steps it averages) of the averaged checkpoint, or None."""
        if not tf.io.gfile.exists(self.averaged_record_path):
            return None
        record = self._read_json(self.averaged_record_path)
        return os.path.join(self.averaged_dir, record["file"]), record["steps"]

    def latest_checkpoint(self):
        """The averaged checkpoint while it is the newest; else the latest training checkpoint
        (saying why, when an older average is passed over)."""
        trained = self.checkpoints()
        averaged = self.averaged()
        if averaged and (not trained or max(averaged[1]) >= trained[-1][0]):
            return averaged[0]
        if averaged:
            print(f"Using {trained[-1][1]} (step {trained[-1][0]}): the average in {self.averaged_dir} is of steps "
                  f"{averaged[1]}, older. Run training.average_checkpoints again to average the latest.",
                  file=sys.stderr)  # fmt: skip
        return trained[-1][1] if trained else None

    def best(self):
        """best/best.json: {"step", "bleu", "since"} and, with --keep-best, "file"; {} before any."""
        return self._read_json(self.best_record_path) if tf.io.gfile.exists(self.best_record_path) else {}

    def record_best(self, record, model=None):
        """Writes best/best.json with `record`; with `model`, its weights first, as the best
        checkpoint of `record`'s step (the one they replace removed)."""
        old = self.best().get("file")
        if model is not None:
            record = {**record, "file": checkpoint_name(record["step"]) + ".weights.h5"}
            tf.io.gfile.makedirs(self.best_dir)
            with written_locally(os.path.join(self.best_dir, record["file"])) as local:
                model.save_weights(local)
        elif old:
            record = {**record, "file": old}
        self.write_json(self.best_record_path, record)
        if old and old != record.get("file"):
            tf.io.gfile.remove(os.path.join(self.best_dir, old))

    def checkpoint(self, name):
        """The path of checkpoint `name`: "latest" (the last training checkpoint), a step's
        number, "averaged", "best" (--keep-best), or a path (as is); ValueError saying what the
        run holds otherwise."""
        if name == "best":
            best = self.best().get("file")
            if not best:
                raise ValueError(f"{self.path} has no best checkpoint: train with --keep-best and dev evaluations "
                                 "(--eval-every or --eval-every-minutes).")  # fmt: skip
            return os.path.join(self.best_dir, best)
        if name not in ("latest", "averaged") and not str(name).isdigit():
            return name
        if name == "averaged":
            if self.averaged() is None:
                raise ValueError(f"{self.path} has no averaged checkpoint: make it with training.average_checkpoints.")
            return self.averaged()[0]
        trained = dict(self.checkpoints())
        if not trained:
            raise ValueError(f"{self.path} holds no checkpoint yet: train first (python -m training.train).")
        if name == "latest":
            return trained[max(trained)]
        if int(name) not in trained:
            raise ValueError(f"{self.path} has no checkpoint of step {name}; it has steps {', '.join(map(str, trained))}.")
        return trained[int(name)]

    def load_model(self, checkpoint=None):
        """The model with the weights of `checkpoint` (a name of `checkpoint(name)`; default:
        `latest_checkpoint()`)."""
        model = Transformer(self.config())
        checkpoint = self.checkpoint(checkpoint) if checkpoint else self.latest_checkpoint()
        if checkpoint is None:
            raise ValueError(f"{self.path} holds no checkpoint yet: train first (python -m training.train).")
        load_weights(model, checkpoint)
        return model, checkpoint

    def metrics(self):
        """metrics.json: what training and evaluation reported (empty before either has)."""
        return self._read_json(self.metrics_path) if tf.io.gfile.exists(self.metrics_path) else {}

    def update_metrics(self, values):
        """metrics.json with `values` added, the values there kept (those of the same name replaced)."""
        self.write_json(self.metrics_path, {**self.metrics(), **values})


def _differences(old, new, names=None):
    names = names if names is not None else sorted(set(old) | set(new))
    return [(name, old.get(name), new.get(name)) for name in names if old.get(name) != new.get(name)]


def checkpoint_name(step):
    """A checkpoint's name in `checkpoints/` (TensorFlow: a file prefix; JAX: a folder) or, with
    `.weights.h5`, in `averaged/`."""
    return f"ckpt-{step}"


def step_of(path):
    """The step of a checkpoint's path (any of `checkpoint_name`'s forms)."""
    return int(re.search(r"ckpt-(\d+)", os.path.basename(path)).group(1))


def load_weights(model, checkpoint):
    """Loads a checkpoint of either backend into `model`: a JAX checkpoint folder or a
    `.weights.h5` file (Keras' format, any backend), or a tf.train.Checkpoint prefix (a training
    checkpoint also holds the optimizer and data, but every model weight must match; under
    another Keras backend a TensorFlow process converts it to a .weights.h5 file first)."""
    if tf.io.gfile.exists(os.path.join(checkpoint, "model.weights.h5")):  # a JAX checkpoint folder
        checkpoint = os.path.join(checkpoint, "model.weights.h5")
    if checkpoint.endswith(".weights.h5"):
        if not tf.io.gfile.exists(checkpoint):
            raise ValueError(f"{checkpoint} does not exist.")
        with local_copy(checkpoint) as path:
            model.load_weights(path)
        return
    if not tf.io.gfile.exists(checkpoint + ".index"):
        raise ValueError(f"{checkpoint} is not a checkpoint (no {checkpoint}.index).")
    if keras.config.backend() != "tensorflow":
        with tempfile.TemporaryDirectory() as scratch:
            converted = os.path.join(scratch, "model.weights.h5")
            _convert_in_tensorflow(model.config, checkpoint, converted)
            model.load_weights(converted)
        return
    tf.train.Checkpoint(model=model).restore(checkpoint).expect_partial().assert_existing_objects_matched()


def _convert_in_tensorflow(config, checkpoint, out):
    """Writes the model weights of the tf.train.Checkpoint `checkpoint` to `out` (.weights.h5)
    from a process whose Keras runs on TensorFlow."""
    code = ("import sys; from keras_transformer import Transformer, TransformerConfig; from training.run_folder import "
            "load_weights; model = Transformer(TransformerConfig.from_json(sys.argv[1])); load_weights(model, sys.argv[2]); "
            "model.save_weights(sys.argv[3])")  # fmt: skip
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
    done = subprocess.run([sys.executable, "-c", code, config.to_json(), checkpoint, out], capture_output=True, text=True,
                          env={**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": path})  # fmt: skip
    if done.returncode:
        raise ValueError(f"{checkpoint}: converting it in a TensorFlow process failed:\n{done.stderr[-3000:]}")


def _is_local(path):
    return "://" not in path


@contextlib.contextmanager
def local_copy(path):
    """`path`, or a local copy of it if it is on another filesystem (for readers of local files)."""
    if _is_local(path):
        yield path
        return
    with tempfile.TemporaryDirectory() as scratch:
        local = os.path.join(scratch, os.path.basename(path))
        tf.io.gfile.copy(path, local)
        yield local


@contextlib.contextmanager
def written_locally(path):
    """A local path to write `path`'s content to; copied to `path` when the block ends (for
    writers of local files only). A local `path` is written aside and renamed into place."""
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path) if _is_local(path) else None) as scratch:
        local = os.path.join(scratch, os.path.basename(path))
        yield local
        if _is_local(path):
            os.replace(local, path)
        else:
            tf.io.gfile.copy(local, path, overwrite=True)


def remove_tree(path):
    """Deletes a folder and what it holds, on any filesystem; no error if it is not there."""
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)
