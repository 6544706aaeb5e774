"""`python -m export --run-dir DIR --out BASE`: write a SavedModel to BASE/<version>/
(export/saved_model.py), with the tokenizer and the search behind one signature.

Decoding settings are fixed here (`--beam-size 1` is greedy search), as the defaults of the
`options` signature, which takes each per request.
"""

import argparse
import os
import sys

from keras_transformer.quiet import quiet_tensorflow

# The served graph is TensorFlow's, whichever backend trained the run. Set before TensorFlow is
# imported: importing it imports Keras, which fixes its backend then.
os.environ["KERAS_BACKEND"] = "tensorflow"
quiet_tensorflow()

from export.saved_model import PRECISIONS, export  # noqa: E402
from export.serving import PARALLEL_SEARCHES  # noqa: E402
from export.xla import CompiledShapes  # noqa: E402
from keras_transformer.search import DecodingSettings  # noqa: E402
from keras_transformer.search.flags import add_decoding_flags, decoding_settings, needs_tokenizer  # noqa: E402
from training.run_folder import RunFolder  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="a run folder of training.train")
    parser.add_argument("--out", required=True, help="the model base path; the export goes to OUT/<version>/")
    add_decoding_flags(parser)
    parser.add_argument("--alignment-layer", type=int, default=DecodingSettings.alignment_layer,
                        help="the decoder layer whose attention the alignments signature returns (-1: the last)")
    parser.add_argument("--version", type=int, help="the version number (default: the highest there + 1)")
    parser.add_argument("--checkpoint", help="latest, a step, averaged, or a checkpoint's path (default: averaged "
                        "while it is the newest, else latest)")
    parser.add_argument("--searches", type=int, default=PARALLEL_SEARCHES,
                        help="independent searches a request's sentences are split between, run side by side "
                        "on separate cores (about one per core a request should use)")  # fmt: skip
    parser.add_argument("--xla", action="store_true",
                        help="compile serving_default's search by XLA for small requests (export/xla.py): for TF Serving "
                        "started with --xla_cpu_compilation_enabled=true")  # fmt: skip
    parser.add_argument("--xla-batch-sizes", type=_numbers, default=CompiledShapes.batch_sizes,
                        help="with --xla: the batch sizes compiled, comma-separated")
    parser.add_argument("--xla-source-lengths", type=_numbers, default=CompiledShapes.source_lengths,
                        help="with --xla: the source lengths compiled (pieces), comma-separated")
    parser.add_argument("--shortlist", nargs="?", const="run", metavar="FILE",
                        help="score only the target pieces a request's sources can need: the run's lexical table "
                        "(learned first if the run has none: training/shortlist.py), or FILE's")  # fmt: skip
    parser.add_argument("--precision", default="float32", choices=PRECISIONS,
                        help="the weights' and matmuls' dtype: bfloat16 for CPUs with AVX-512 BF16 or AMX, float16 for "
                        "GPUs (softmax, logits and scores stay float32)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        target = RunFolder(args.run_dir).load_tokenizer().target if needs_tokenizer(args) else None
        settings = decoding_settings(args, target, alignment_layer=args.alignment_layer)
        shapes = CompiledShapes(args.xla_batch_sizes, args.xla_source_lengths) if args.xla else None
        target = export(args.run_dir, args.out, settings, version=args.version, checkpoint=args.checkpoint,
                        searches=args.searches, precision=args.precision, compiled_shapes=shapes,
                        shortlist=args.shortlist)  # fmt: skip
    except ValueError as error:
        sys.exit(f"error: {error}")
    print(f"Exported to {target}")


def _numbers(text):
    try:
        return tuple(int(number) for number in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None


if __name__ == "__main__":
    main()
