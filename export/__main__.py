"""`python -m export --run-dir DIR --out BASE`: write a SavedModel to BASE/<version>/.

The layout TF Serving watches: one numbered folder per version under a base path. The export is
written to a hidden folder beside it and renamed into place, so a server never sees half a model
and an interrupted export leaves no version behind. Decoding settings are fixed here
(`--beam-size 1` is greedy search).

The SavedModel's assets hold the SentencePiece model, the model config and `metadata.json`
(languages, vocabulary, decoding settings, source checkpoint, BLEU if the run has it).
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if __name__ == "__main__":  # the served graph is TensorFlow's, whichever backend trained the run
    os.environ["KERAS_BACKEND"] = "tensorflow"

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from export.serving import Translator  # noqa: E402
from training.run_folder import RunFolder  # noqa: E402


def next_version(base):
    versions = [int(name) for name in os.listdir(base) if re.fullmatch(r"\d+", name)] if os.path.isdir(base) else []
    return max(versions, default=0) + 1


def export(run_dir, base, *, beam_size=4, alpha=0.6, max_extra_length=50, version=None, checkpoint=None):
    """Exports the run's model (averaged checkpoint if there is one, else the latest); returns
    the version folder."""
    if keras.config.backend() != "tensorflow":
        raise ValueError(
            f"The export builds a TensorFlow graph, but Keras runs on {keras.config.backend()}: run "
            "`python -m export` (it uses the TensorFlow backend), or set KERAS_BACKEND=tensorflow."
        )
    if beam_size < 1 or max_extra_length < 0:
        raise ValueError(f"--beam-size must be >= 1 and --max-extra-length >= 0, got {beam_size} and {max_extra_length}.")
    run = RunFolder(run_dir)
    model, checkpoint = run.load_model(checkpoint)
    tokenizer = run.load_tokenizer()
    settings, metrics = run.settings(), {}
    if os.path.exists(run.metrics_path):
        with open(run.metrics_path) as f:
            metrics = json.load(f)

    version = version or next_version(base)
    target = os.path.join(base, str(version))
    if os.path.exists(target):
        raise ValueError(f"{target} exists already: choose another --version.")
    os.makedirs(base, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".export-{version}-", dir=base)  # hidden: TF Serving skips it
    try:
        metadata = {
            "source_lang": settings["source_lang"],
            "target_lang": settings["target_lang"],
            "dataset": settings["dataset"],
            "vocab_size": model.config.vocab_size,
            "beam_size": beam_size,
            "alpha": alpha,
            "max_extra_length": max_extra_length,
            "max_source_length": model.config.max_length,
            "checkpoint": checkpoint,
            **{key: metrics[key] for key in ("bleu", "chrf", "signature", "steps") if key in metrics},
        }
        assets = os.path.join(staging, "_assets")
        os.makedirs(assets)
        with open(os.path.join(assets, "metadata.json"), "w") as f:
            json.dump(metadata, f, indent=2, sort_keys=True)
        shutil.copy(run.config_path, os.path.join(assets, "config.json"))
        shutil.copy(run.tokenizer_path, os.path.join(assets, "sentencepiece.model"))
        translator = Translator(
            model,
            tokenizer,
            beam_size=beam_size,
            alpha=alpha,
            max_extra_length=max_extra_length,
            assets=[os.path.join(assets, name) for name in ("metadata.json", "config.json", "sentencepiece.model")],
        )
        saved = os.path.join(staging, "model")
        tf.saved_model.save(translator, saved, signatures={"serving_default": translator.translate})
        os.rename(saved, target)  # atomic on one filesystem
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="a run folder of training.train")
    parser.add_argument("--out", required=True, help="the model base path; the export goes to OUT/<version>/")
    parser.add_argument("--beam-size", type=int, default=4, help="1 for greedy search")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty")
    parser.add_argument("--max-extra-length", type=int, default=50, help="output tokens beyond the source length")
    parser.add_argument("--version", type=int, help="the version number (default: the highest there + 1)")
    parser.add_argument("--checkpoint", help="a checkpoint path (default: averaged, else latest)")
    args = parser.parse_args(argv)
    try:
        target = export(args.run_dir, args.out, beam_size=args.beam_size, alpha=args.alpha,
                        max_extra_length=args.max_extra_length, version=args.version, checkpoint=args.checkpoint)  # fmt: skip
    except ValueError as error:
        sys.exit(f"error: {error}")
    print(f"Exported to {target}")


if __name__ == "__main__":
    main()
