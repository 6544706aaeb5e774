"""`python -m export.translate EXPORT_DIR "a sentence" ...`: translate with an exported model alone.

EXPORT_DIR is a version folder, or a base path whose highest version is used. Sentences come
from the arguments, from --input-file (one per line), or from standard input. Each translation
is printed on a line of its own; with --n-best N, each sentence's N best translations (the
`n_best` signature), a line each: the sentence's number (from 1), the rank, the score and the
translation, tab-separated; with --alignments, each translation then a tab and its alignment
(the `alignments` signature) as source-target pairs of SentencePiece piece indices, from 0,
"i-j" for each target piece j and the source piece i it attended to most. --prefix TEXT makes
each translation start with TEXT (the `prefix` signature). --sample N draws N translations of
each sentence at random (the `sample` signature; --temperature, --top-k, --top-p and --seed as
`keras_transformer.search.SamplingSettings`), printed as --n-best prints its lists. A decoding
option's flag (--no-repeat-ngram-size 3, --min-length 2, ..., one per row of export/README.md's
table) decodes with it (the `options` signature; the export's values for the others) and reports
each sentence whose source was cut on standard error. --score FILE scores the translations in
FILE (one per line, a line per sentence) instead (the `score` signature): each line the score,
the log-probability, then the log-probability of each piece and of the end of sentence, tab- and
space-separated.
"""

import argparse
import json
import os
import re
import sys

from export.quiet import quiet_tensorflow

os.environ["KERAS_BACKEND"] = "tensorflow"  # a SavedModel runs on TensorFlow (as in export/__main__.py)
quiet_tensorflow()

import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402,F401  (registers the SentencePiece ops the SavedModel uses)

from export.serving import MAX_SAMPLES, use_serving_threads  # noqa: E402
from keras_transformer.search import OPTIONS, SamplingSettings  # noqa: E402
from keras_transformer.search.flags import add_decoding_flags  # noqa: E402


def resolve(export_dir):
    """A version folder as is; for a base path, its highest numbered version."""
    if os.path.exists(os.path.join(export_dir, "saved_model.pb")):
        return export_dir
    versions = [int(n) for n in os.listdir(export_dir) if re.fullmatch(r"\d+", n)] if os.path.isdir(export_dir) else []
    if not versions:
        raise ValueError(f"{export_dir} is neither a SavedModel nor a base path with numbered versions.")
    return os.path.join(export_dir, str(max(versions)))


def check(args):
    """The export folder the arguments name, after checking what can be checked before the model
    is loaded; ValueError otherwise."""
    export_dir = resolve(args.export_dir)
    if args.n_best is not None:
        with open(os.path.join(export_dir, "assets", "metadata.json")) as f:
            beam_size = json.load(f)["beam_size"]
        if not 1 <= args.n_best <= beam_size:
            raise ValueError(f"--n-best {args.n_best}: {export_dir} searches with a beam of {beam_size}, so 1 to {beam_size}.")
    if options_of(args) and any(getattr(args, name) for name in ("n_best", "alignments", "prefix", "sample", "score")):
        raise ValueError("decoding options apply to plain translations (the options signature), not with --n-best, "
                         "--alignments, --prefix, --sample or --score.")  # fmt: skip
    if args.sample is not None:
        SamplingSettings(args.temperature, args.top_k, args.top_p)
        if not 1 <= args.sample <= MAX_SAMPLES:
            raise ValueError(f"--sample {args.sample}: 1 to {MAX_SAMPLES}.")
    return export_dir


def options_of(args):
    """The decoding options the flags give: name -> value."""
    return {option.name: getattr(args, option.name) for option in OPTIONS if getattr(args, option.name) is not None}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export_dir")
    parser.add_argument("sentences", nargs="*")
    parser.add_argument("--input-file", help="one sentence per line")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--scores", action="store_true", help="print each score before its translation")
    other = parser.add_mutually_exclusive_group()
    other.add_argument("--n-best", type=int, help="print each sentence's N best translations, with their scores")
    other.add_argument("--alignments", action="store_true", help="print each translation's alignment to its source pieces")
    other.add_argument("--prefix", help="the start each translation must have")
    other.add_argument("--sample", type=int, help="print N translations of each sentence drawn at random, with their scores")
    other.add_argument("--score", metavar="FILE", help="score the translations in FILE, one a line, instead")
    sampling = parser.add_argument_group("sampling (with --sample)")
    defaults = SamplingSettings()
    sampling.add_argument("--temperature", type=float, default=defaults.temperature)
    sampling.add_argument("--top-k", type=int, default=defaults.top_k, help="0: every token")
    sampling.add_argument("--top-p", type=float, default=defaults.top_p)
    sampling.add_argument("--seed", type=int, default=0, help="sentence i (from 0) draws with seed SEED + i")
    add_decoding_flags(parser, defaults=False)  # None: the export's
    args = parser.parse_args(argv)
    options = options_of(args)
    try:
        export_dir = check(args)
    except ValueError as error:
        sys.exit(f"error: {error}")
    use_serving_threads()
    translator = tf.saved_model.load(export_dir)
    for signature in ("n_best", "alignments", "prefix", "sample", "score", "options"):  # as the flags are named
        asked = options if signature == "options" else getattr(args, signature)
        if asked and not hasattr(translator, signature):
            sys.exit(f"error: {export_dir} has no {signature} signature (an export of an earlier version): export it again.")
    if args.input_file:
        with open(args.input_file, encoding="utf-8", errors="replace") as f:
            sentences = f.read().splitlines()
    else:
        sentences = args.sentences or sys.stdin.read().splitlines()
    targets = None
    if args.score:
        with open(args.score, encoding="utf-8", errors="replace") as f:
            targets = f.read().splitlines()
        if len(targets) != len(sentences):
            sys.exit(f"error: --score {args.score} has {len(targets)} lines for {len(sentences)} sentences.")
    for start in range(0, len(sentences), args.batch_size):
        batch = tf.constant(sentences[start : start + args.batch_size])
        if targets is not None:
            result = translator.score(batch, tf.constant(targets[start : start + args.batch_size]))
            for score, log_prob, tokens, length in zip(*(result[key].numpy() for key in ("score", "log_prob", "token_log_probs", "length"))):
                print(f"{score:.4f}\t{log_prob:.4f}\t{' '.join(f'{t:.4f}' for t in tokens[:length])}", flush=True)
            continue
        if options:
            given = {name: tf.constant([value]) for name, value in options.items()}  # one value for every sentence
            result = translator.options(batch, **given)
            for row, (translation, score, cut) in enumerate(zip(*(result[key].numpy() for key in ("translation", "score", "cut")))):
                if cut:
                    print(f"sentence {start + row + 1}: its source was cut", file=sys.stderr)
                line = translation.decode("utf-8")
                print(f"{score:.4f}\t{line}" if args.scores else line, flush=True)
            continue
        if args.n_best or args.sample:
            if args.n_best:
                result = translator.n_best(batch, tf.fill(tf.shape(batch), args.n_best))
            else:
                size = tf.shape(batch)
                result = translator.sample(batch, tf.fill(size, args.sample), tf.fill(size, args.temperature),
                                           tf.fill(size, args.top_k), tf.fill(size, args.top_p),
                                           args.seed + start + tf.range(size[0]))  # fmt: skip
            for row, (translations, scores) in enumerate(zip(result["translations"].numpy(), result["scores"].numpy())):
                for rank, (translation, score) in enumerate(zip(translations, scores), 1):
                    print(f"{start + row + 1}\t{rank}\t{score:.4f}\t{translation.decode('utf-8')}", flush=True)
            continue
        if args.alignments:
            result = translator.alignments(batch)
            for translation, attention, source_length, target_length in zip(
                *(result[key].numpy() for key in ("translation", "attention", "source_length", "target_length"))
            ):
                sources = attention[:target_length, :source_length].argmax(axis=-1)
                pairs = " ".join(f"{i}-{j}" for j, i in enumerate(sources))
                print(f"{translation.decode('utf-8')}\t{pairs}", flush=True)
            continue
        result = translator.prefix(batch, tf.fill(tf.shape(batch), args.prefix)) if args.prefix else translator.translate(batch)
        for translation, score in zip(result["translation"].numpy(), result["score"].numpy()):
            line = translation.decode("utf-8")
            print(f"{score:.4f}\t{line}" if args.scores else line, flush=True)

if __name__ == "__main__":
    main()
