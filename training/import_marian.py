"""`python -m training.import_marian SOURCE --run-dir DIR [--source-lang en --target-lang de]`: an
OPUS-MT model, in Marian's release form or Hugging Face's (training/marian.py), as a run folder
that the commands read as one of training.train's: `python -m export`, `python -m
export.ctranslate2` and `training.evaluate` (on the corpus that `--dataset` and its flags name
here, as training.train records them).

    DIR/config.json, training.json    the model's options; the languages, the corpus and SOURCE
                                      (`imported_from`)
    DIR/tokenizer.model               SOURCE's source.spm, and target_tokenizer.model its
                                      target.spm; pieces.json, each side's vocabulary in this
                                      project's ids (training/tokenizer.py maps them in the graph)
    DIR/checkpoints/ckpt-0/           model.weights.h5, the weights, and state.json: step 0

The source language defaults to that of SOURCE's name where it ends in SRC-TGT (opus-mt-en-de);
the target languages to the model's own (`>>fra<<` pieces) where it writes several (opus-mt-en-
ROMANCE: one run of several pairs, whose export's `target_language` chooses), else the name's.
"""

import argparse
import json
import os
import re
import sys

from keras_transformer.quiet import quiet_tensorflow

quiet_tensorflow()

import tensorflow as tf  # noqa: E402

from training import languages  # noqa: E402
from training.flags import FLAGS  # noqa: E402
from training.marian import load_marian  # noqa: E402
from training.run_folder import RunFolder, checkpoint_name, written_locally  # noqa: E402
from training.tokenizer import Tokenizer, Vocabulary  # noqa: E402

SENTENCEPIECE_FILES = {"source": "source.spm", "target": "target.spm"}  # in both of OPUS-MT's forms
# training.train's flags that an import records: the languages and the corpus that evaluate reads.
CORPUS_FLAGS = [flag for flag in FLAGS if flag.corpus or flag.name in ("dataset", "source_lang", "target_lang")]


def import_marian(source, run_dir, settings):
    """Writes the OPUS-MT model in folder `source` as the run folder `run_dir` (a new one), with
    `settings` (the languages, None where not given, and corpus flags, by name) in its
    training.json; returns its `RunFolder`. Its config.json is written last: a folder without it
    is an interrupted import, which another overwrites."""
    run = RunFolder(run_dir)
    if tf.io.gfile.exists(run.config_path):
        raise ValueError(f"--run-dir {run_dir} holds a run already: give a new folder.")
    model, source_pieces, target_pieces = load_marian(source)
    paths = {side: os.path.join(source, name) for side, name in SENTENCEPIECE_FILES.items()}
    for path in paths.values():
        if not os.path.exists(path):
            raise ValueError(f"{path} does not exist: an OPUS-MT model has source.spm and target.spm beside its weights.")
    tokenizer = Tokenizer(Vocabulary.load(paths["source"], source_pieces, tags=True),
                          Vocabulary.load(paths["target"], target_pieces))  # fmt: skip
    named_source, named_target = default_languages(source)
    tagged = languages.languages(tokenizer)  # the targets of a multi-target model
    source_lang = settings["source_lang"] or named_source
    targets = settings["target_lang"].split(",") if settings["target_lang"] else list(tagged) or [named_target]
    if not source_lang or None in targets:
        raise ValueError(f"{source} does not name its languages (...-SRC-TGT): give --source-lang and --target-lang.")
    if tagged:
        languages.check_vocabulary(tokenizer, targets, source)
    pairs = [(source_lang, target) for target in targets]
    settings = {**settings, "source_lang": source_lang, "target_lang": targets[0],
                "pairs": ",".join(map(languages.pair_name, pairs)), "imported_from": os.path.abspath(source)}  # fmt: skip
    run.save_tokenizer(tokenizer)
    folder = os.path.join(run.checkpoint_dir, checkpoint_name(0))
    tf.io.gfile.makedirs(folder)
    with written_locally(os.path.join(folder, "model.weights.h5")) as local:
        model.save_weights(local)
    with tf.io.gfile.GFile(os.path.join(folder, "state.json"), "w") as f:  # last: it marks the checkpoint complete
        json.dump({"step": 0, "train_seconds": 0.0, "imported_from": os.path.abspath(source)}, f)
    run.record_segment(model.config, settings, 0)
    return run


def default_languages(source):
    """(source, target) languages of a folder named ...-SRC-TGT (opus-mt-en-de), else (None, None)."""
    found = re.search(rf"-({languages.LANGUAGE.pattern})-({languages.LANGUAGE.pattern})$", os.path.basename(source.rstrip("/")))
    return (found.group(1), found.group(3)) if found else (None, None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="the OPUS-MT model's folder (Marian's model.npz and *.vocab.yml, or Hugging "
                        "Face's config.json, model.safetensors and vocab.json; both with source.spm and target.spm)")
    parser.add_argument("--run-dir", required=True, help="the new run folder")
    for flag in CORPUS_FLAGS:
        flag.add_to(parser)
    args = parser.parse_args(argv)
    try:
        run = import_marian(args.source, args.run_dir, {flag.name: getattr(args, flag.name) for flag in CORPUS_FLAGS})
    except ValueError as error:
        sys.exit(f"error: {error}")
    config = run.config()
    print(f"Imported {args.source} ({run.settings()['pairs']}: {config.encoder_layers} encoder and "
          f"{config.decoder_layers} decoder layers, d_model {config.d_model}, {config.vocab_size:,} target pieces) into "
          f"{run.path}. Export it with: python -m export --run-dir {run.path} --out EXPORT_BASE")  # fmt: skip


if __name__ == "__main__":
    main()
