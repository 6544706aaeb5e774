"""`python -m export.translate EXPORT_DIR "a sentence" ...`: translate with an exported model alone.

EXPORT_DIR is a version folder, or a base path whose highest version is used. Sentences come
from the arguments, from --input-file (one per line), or from standard input.
"""

import argparse
import os
import re
import sys

from training.quiet import quiet_tensorflow

quiet_tensorflow()

import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402,F401  (registers the SentencePiece ops the SavedModel uses)

from export.serving import use_serving_threads  # noqa: E402


def resolve(export_dir):
    """A version folder as is; for a base path, its highest numbered version."""
    if os.path.exists(os.path.join(export_dir, "saved_model.pb")):
        return export_dir
    versions = [int(n) for n in os.listdir(export_dir) if re.fullmatch(r"\d+", n)] if os.path.isdir(export_dir) else []
    if not versions:
        raise ValueError(f"{export_dir} is neither a SavedModel nor a base path with numbered versions.")
    return os.path.join(export_dir, str(max(versions)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export_dir")
    parser.add_argument("sentences", nargs="*")
    parser.add_argument("--input-file", help="one sentence per line")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--scores", action="store_true", help="print each score before its translation")
    args = parser.parse_args(argv)
    use_serving_threads()
    try:
        translator = tf.saved_model.load(resolve(args.export_dir))
    except ValueError as error:
        sys.exit(f"error: {error}")
    if args.input_file:
        with open(args.input_file, encoding="utf-8", errors="replace") as f:
            sentences = f.read().splitlines()
    else:
        sentences = args.sentences or sys.stdin.read().splitlines()
    for start in range(0, len(sentences), args.batch_size):
        result = translator.translate(tf.constant(sentences[start : start + args.batch_size]))
        for translation, score in zip(result["translation"].numpy(), result["score"].numpy()):
            line = translation.decode("utf-8")
            print(f"{score:.4f}\t{line}" if args.scores else line, flush=True)


if __name__ == "__main__":
    main()
