"""The run folder: everything a training run writes, in one place.

    DIR/config.json          the model's TransformerConfig
    DIR/training.json        the data and training settings that a resumed run must share
    DIR/tokenizer.model      the SentencePiece model
    DIR/checkpoints/         model, optimizer, step and data position (tf.train.Checkpoint)
    DIR/averaged/            the average of the last checkpoints (training.average_checkpoints)
    DIR/logs/                TensorBoard: train/ and dev/
    DIR/metrics.json         test BLEU, chrF, sacreBLEU signatures, steps, train_seconds
"""

import json
import os

import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig
from training import data
from training.tokenizer import Tokenizer

# Settings that must match when a run is resumed (the others, such as --steps, may change).
RESUME_SETTINGS = ("dataset", "source_lang", "target_lang", "dev_split", "test_split", "seed", "batch_tokens", "vocab_size")


class RunFolder:
    def __init__(self, path):
        self.path = path
        self.config_path = os.path.join(path, "config.json")
        self.settings_path = os.path.join(path, "training.json")
        self.tokenizer_path = os.path.join(path, "tokenizer.model")
        self.checkpoint_dir = os.path.join(path, "checkpoints")
        self.averaged_dir = os.path.join(path, "averaged")
        self.log_dir = os.path.join(path, "logs")
        self.metrics_path = os.path.join(path, "metrics.json")

    def _read_json(self, path):
        if not os.path.exists(path):
            raise ValueError(f"{path} does not exist: is {self.path} a run folder of training.train?")
        with open(path) as f:
            return json.load(f)

    def write_json(self, path, values):
        """Writes atomically: a crash leaves the old file or the new one, never half of one."""
        os.makedirs(self.path, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(values, f, indent=2, sort_keys=True)
        os.replace(path + ".tmp", path)

    def config(self):
        return TransformerConfig.from_dict(self._read_json(self.config_path))

    def settings(self):
        return self._read_json(self.settings_path)

    def check_or_write(self, config, settings):
        """Records the config and settings of a new run, or checks that a resumed run matches."""
        if not os.path.exists(self.config_path):
            self.write_json(self.config_path, config.to_dict())
            self.write_json(self.settings_path, settings)
            return
        differences = [
            f"{name}: {old!r} in {self.config_path}, {new!r} now"
            for name, old, new in _differences(self.config().to_dict(), config.to_dict())
        ] + [
            f"{name}: {old!r} in {self.settings_path}, {new!r} now"
            for name, old, new in _differences(self.settings(), settings, RESUME_SETTINGS)
        ]
        if differences:
            raise ValueError(
                f"The run folder {self.path} holds a different run ({'; '.join(differences)}). "
                "Use another --run-dir, or the same flags as the run that made it."
            )
        self.write_json(self.settings_path, settings)

    def load_tokenizer(self):
        if not os.path.exists(self.tokenizer_path):
            raise ValueError(f"{self.tokenizer_path} does not exist: is {self.path} a run folder of training.train?")
        return Tokenizer.load(self.tokenizer_path)

    def load_corpus(self):
        settings = self.settings()
        return data.load_corpus(
            settings["dataset"],
            settings["source_lang"],
            settings["target_lang"],
            dev_split=settings["dev_split"],
            test_split=settings["test_split"],
            data_dir=settings.get("data_dir"),
            seed=settings["seed"],
        )

    def latest_checkpoint(self):
        return tf.train.latest_checkpoint(self.averaged_dir) or tf.train.latest_checkpoint(self.checkpoint_dir)

    def load_model(self, checkpoint=None):
        """The model with the weights of `checkpoint` (default: averaged if there is one, else latest)."""
        model = Transformer(self.config())
        checkpoint = checkpoint or self.latest_checkpoint()
        if checkpoint is None:
            raise ValueError(f"{self.path} holds no checkpoint yet: train first (python -m training.train).")
        # A training checkpoint also holds the optimizer and data; every model weight must match.
        tf.train.Checkpoint(model=model).restore(checkpoint).expect_partial().assert_existing_objects_matched()
        return model, checkpoint

    def update_metrics(self, values):
        metrics = self._read_json(self.metrics_path) if os.path.exists(self.metrics_path) else {}
        self.write_json(self.metrics_path, {**metrics, **values})


def _differences(old, new, names=None):
    names = names if names is not None else sorted(set(old) | set(new))
    return [(name, old.get(name), new.get(name)) for name in names if old.get(name) != new.get(name)]
