"""`python -m export.translate EXPORT_DIR "a sentence" ...`: translate with an exported model alone.

EXPORT_DIR is a version folder, or a base path whose highest version is used. Sentences come
from the arguments, from --input-file (one per line), or from standard input. Each translation
is printed on a line of its own (`serving_default`). The flags of the other signatures ask for
them (export/signatures.py: how each prints): --n-best N, each sentence's N best translations, a
line each: the sentence's number (from 1), the rank, the score and the translation,
tab-separated; --alignments, each translation then a tab and its alignment as "i-j" pairs for
each target piece j and the source piece i it attended to most; --prefix TEXT, translations that
start with TEXT; --sample N, N translations of each sentence drawn at random (--temperature,
--top-k, --top-p, --seed), printed as --n-best's lists; a decoding option's flag
(--no-repeat-ngram-size 3, --min-length 2, ...: the `options` signature, the export's values for
the others), reporting each sentence whose source was cut on standard error; --score FILE, the
score, the log-probability and each piece's log-probability of the translations in FILE (a line
per sentence) instead. `--to LANG` asks an export of several target languages for LANG (default:
its first).
"""

import argparse
import os
import re
import sys

from keras_transformer.quiet import quiet_tensorflow

os.environ["KERAS_BACKEND"] = "tensorflow"  # a SavedModel runs on TensorFlow (as in export/__main__.py)
quiet_tensorflow()

import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402,F401  (registers the SentencePiece ops the SavedModel uses)

from export.layout import read_metadata, target_languages  # noqa: E402
from export.serving import use_serving_threads  # noqa: E402
from export.signatures import SIGNATURES  # noqa: E402


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
    parser.add_argument("--to", metavar="LANG", help="the language to write, of the export's (metadata.json's "
                        "target_languages; default: its first)")  # fmt: skip
    other = parser.add_mutually_exclusive_group()
    for signature in SIGNATURES:
        signature.add_flags(parser, other)
    args = parser.parse_args(argv)
    asked = [signature for signature in SIGNATURES if signature.asked(args)] or [SIGNATURES[0]]
    try:
        if len(asked) > 1:  # the decoding options and another signature's flag
            other = next(signature.flag for signature in asked if signature.flag)
            raise ValueError(f"decoding options apply to plain translations (the options signature), not with {other}.")
        (signature,) = asked
        export_dir = resolve(args.export_dir)
        if args.input_file:
            with open(args.input_file, encoding="utf-8", errors="replace") as f:
                sentences = f.read().splitlines()
        else:
            sentences = args.sentences or sys.stdin.read().splitlines()
        signature.prepare(args, export_dir, sentences)
        served = target_languages(read_metadata(export_dir))
        if args.to and args.to not in served:
            raise ValueError(f"--to {args.to}: {export_dir} writes {', '.join(served)}.")
    except ValueError as error:
        sys.exit(f"error: {error}")
    use_serving_threads()
    translator = tf.saved_model.load(export_dir)
    if not hasattr(translator, signature.method):
        sys.exit(f"error: {export_dir} has no {signature.name} signature (an export of an earlier version): export it again.")
    for start in range(0, len(sentences), args.batch_size):
        batch = tf.constant(sentences[start : start + args.batch_size])
        request = signature.request(args, batch, start)
        if args.to and len(served) > 1:  # an export of one language has no such input
            request["target_language"] = tf.fill(tf.shape(batch), args.to)
        result = getattr(translator, signature.method)(**request)
        for line in signature.lines({key: value.numpy() for key, value in result.items()}, start, args):
            print(line, flush=True)


if __name__ == "__main__":
    main()
