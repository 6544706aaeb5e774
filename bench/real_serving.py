"""Serving real text: a trained run's SavedModel against CTranslate2 on the same weights, on the
run's own test sentences, in sentences per second, with both BLEUs (so that both are seen to
decode the same).

    python -m bench.real_serving --run-dir runs/demo            # the README's demo model
    python -m bench.real_serving --run-dir runs/multi30k        # a multi30k-preset model
    python -m bench.real_serving --smoke                        # seconds: the smoke export (bench/smoke.py)

The run is exported once per --beam-sizes, --stopping rule and --exports kind (default, xla,
shortlist: `python -m export --shortlist`) and converted for CTranslate2 once per
--ctranslate2 weight type (`python -m export.ctranslate2`); each measurement is a fresh
process, the two systems alternating round after round (--rounds); a round's ratio is ours over
CTranslate2's sentences per second, for each of its weight types, with its vocabulary map
(`use_vmap`) where ours has the shortlist. How each side is run: bench/README.md, "Serving real
text". Without CTranslate2 (`pip install -r export/requirements.txt`) only ours is measured.
"""

import argparse
import json
import os
import sys
import tempfile
import time

from export.quiet import quiet_tensorflow

quiet_tensorflow()

import numpy as np  # noqa: E402

from bench.common import emit, peak_rss_mb, run_isolated  # noqa: E402


def measure_ours(export_dir, sentences, batch):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SentencePiece ops of the SavedModel)

    from bench.serving import replay_warmup_requests
    from export.serving import use_serving_threads

    use_serving_threads()
    start = time.perf_counter()
    loaded = tf.saved_model.load(export_dir)
    serve = loaded.signatures["serving_default"]
    replay_warmup_requests(export_dir, loaded)
    ready = {"ready_s": round(time.perf_counter() - start, 1)}  # loaded and warmed up, as a server before it serves

    def translate(texts):
        return [t.decode("utf-8") for t in serve(text=tf.constant(texts))["translation"].numpy()]

    return (*_timed_pass(translate, sentences, batch), ready)


def measure_ctranslate2(model_dir, sentences, batch, beam_size, alpha, max_length_b, use_vmap=False):
    """export/ctranslate2.py's conversion, translated by its recipe: SentencePiece's pieces in and out."""
    import ctranslate2
    import sentencepiece

    translator = ctranslate2.Translator(model_dir, device="cpu", inter_threads=1, intra_threads=os.cpu_count())
    pieces = sentencepiece.SentencePieceProcessor(model_file=os.path.join(model_dir, "sentencepiece.model"))

    def translate(texts):
        sources = pieces.encode(texts, out_type=str)
        results = translator.translate_batch(sources, beam_size=beam_size, length_penalty=alpha, use_vmap=use_vmap,
                                             max_decoding_length=max(len(source) + 1 for source in sources) + max_length_b)  # fmt: skip
        return pieces.decode([result.hypotheses[0] for result in results])

    return (*_timed_pass(translate, sentences, batch), {})


def _timed_pass(translate, sentences, batch):
    """Translates `sentences` in batches of `batch`, in order, once to warm up and once timed;
    returns the timed pass's translations and each request's seconds."""
    translate(sentences[:batch])
    translations, seconds = [], []
    for begin in range(0, len(sentences), batch):
        start = time.perf_counter()
        translations += translate(sentences[begin : begin + batch])
        seconds.append(time.perf_counter() - start)
    return translations, seconds


def worker(args):
    """One measurement, in this process: prints its JSON line."""
    import sacrebleu

    with open(args.sentences, encoding="utf-8") as f:
        sources, references = zip(*(json.loads(line) for line in f))
    sources, references = list(sources), list(references)
    with open(os.path.join(args.export_dir, "assets", "metadata.json")) as f:
        decoding = json.load(f)
    if args.worker == "ours":
        translations, seconds, ready = measure_ours(args.export_dir, sources, args.batch)
    else:
        translations, seconds, ready = measure_ctranslate2(args.ctranslate2_dir, sources, args.batch, decoding["beam_size"],
                                                           decoding["alpha"], decoding["max_length_b"],
                                                           use_vmap=bool(decoding.get("shortlist")))  # fmt: skip
    latency = {}
    if args.batch == 1:
        latency = {f"p{p}_ms": round(1000 * float(np.percentile(seconds, p)), 2) for p in (50, 95)}
    emit({
        "benchmark": "real_serving",
        "system": args.worker if args.worker == "ours" else f"ctranslate2_{_weights(args.ctranslate2_dir)}",
        "export": "xla" if decoding.get("xla") else "shortlist" if decoding.get("shortlist") else "default",
        "round": args.round,
        "beam_size": decoding["beam_size"],
        "stopping": decoding["stopping"],
        "batch": args.batch,
        "sentences": len(sources),
        "sentences_per_s": round(len(sources) / sum(seconds), 1),
        **latency,
        **ready,
        "bleu": round(sacrebleu.corpus_bleu(translations, [references]).score, 2),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    })  # fmt: skip


def _weights(model_dir):
    """The weight type a CTranslate2 model directory was converted to (its folder's name)."""
    return os.path.basename(model_dir.rstrip(os.sep))


def prepare(run_dir, scratch, args, exports=None):
    """Exports the run for each beam size (and stopping rule) unless `exports` are given,
    converts it for CTranslate2 for each weight type and writes the test pairs; returns the
    exports, the CTranslate2 folders and the pairs' file."""
    from bench import ctranslate2_reference
    from bench.serving import export_search
    from export import ctranslate2 as conversion
    from export.xla import CompiledShapes
    from keras_transformer.search import DecodingSettings
    from training.run_folder import RunFolder

    run = RunFolder(run_dir)
    pairs = run.load_corpus().text_pairs("test", args.limit)
    sentences = os.path.join(scratch, "test.jsonl")
    with open(sentences, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(pair, ensure_ascii=False) + "\n" for pair in pairs)
    if exports is None:  # {(beam size, stopping rule, kind): export folder}; greedy search has no rule
        exports = {}
        for size in args.beam_sizes:
            for stopping in args.stopping if size > 1 else [DecodingSettings.stopping]:
                for kind in args.exports:
                    base = os.path.join(scratch, f"beam{size}_{stopping}_{kind}")
                    shapes = CompiledShapes() if kind == "xla" else None
                    exports[size, stopping, kind] = export_search(run_dir, base, args.max_length_b, compiled_shapes=shapes,
                                                                  shortlist="run" if kind == "shortlist" else None,
                                                                  beam_size=size, stopping=stopping)  # fmt: skip
    if not ctranslate2_reference.available():
        print("CTranslate2 is not installed: no reference rows (pip install -r export/requirements.txt).", file=sys.stderr)
        return exports, [], sentences
    # Converted after the exports: a shortlist export learns the run's table, which becomes vmap.txt.
    directories = [conversion.export(run_dir, os.path.join(scratch, "ctranslate2", weights), weights)
                   for weights in args.ctranslate2]  # fmt: skip
    if not args.smoke:  # a measurement: its faster matrix library here (two timed processes)
        print(f"CTranslate2 with CT2_USE_MKL={ctranslate2_reference.choose_backend(directories[0])} (the faster here).",
              file=sys.stderr)  # fmt: skip
    return exports, directories, sentences


def compare(exports, ctranslate2_dirs, sentences, args):
    for round_ in range(args.rounds):
        for (beam_size, stopping, kind), export_dir in exports.items():
            for batch in args.batch_sizes:
                systems = ["ours", *ctranslate2_dirs]
                if round_ % 2:
                    systems.reverse()
                figures = {}
                for system in systems:
                    worker = ["--worker=ours"] if system == "ours" else ["--worker=ctranslate2", f"--ctranslate2-dir={system}"]
                    (figures[system],) = run_isolated("bench.real_serving", [
                        *worker, f"--export-dir={export_dir}", f"--sentences={sentences}", f"--batch={batch}",
                        f"--round={round_}"])  # fmt: skip
                ours = figures["ours"]
                for directory in ctranslate2_dirs:
                    theirs = figures[directory]
                    emit({"benchmark": "real_serving_ratio", "round": round_, "export": kind, "beam_size": beam_size,
                          "stopping": stopping, "batch": batch, "ctranslate2": theirs["system"],
                          "ratio": round(ours["sentences_per_s"] / theirs["sentences_per_s"], 3),
                          "bleu_ours": ours["bleu"], "bleu_ctranslate2": theirs["bleu"]})  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", help="a run folder of training.train")
    parser.add_argument("--smoke", action="store_true", help="the smoke export, a few sentences, one round")
    parser.add_argument("--beam-sizes", default="4,1")
    parser.add_argument("--stopping", default="exact,first_k", help="beam search's stopping rules measured")
    parser.add_argument("--exports", default="default,xla", help="the exports measured: default (no XLA), xla, "
                        "shortlist (python -m export --shortlist)")  # fmt: skip
    parser.add_argument("--ctranslate2", default="float32,int8", help="CTranslate2's weight types measured beside ours")
    parser.add_argument("--batch-sizes", default="32,8,1")
    parser.add_argument("--rounds", type=int, default=2, help="times each measurement runs, the systems alternating")
    parser.add_argument("--limit", type=int, help="the first N test sentences (default: all)")
    parser.add_argument("--max-length-b", type=int, help="as python -m export (default: its default)")
    parser.add_argument("--worker", choices=["ours", "ctranslate2"], help=argparse.SUPPRESS)
    for hidden in ("--export-dir", "--ctranslate2-dir", "--sentences"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    args.beam_sizes = [int(size) for size in args.beam_sizes.split(",")]
    args.batch_sizes = [int(size) for size in args.batch_sizes.split(",")]
    args.stopping = args.stopping.split(",")
    args.exports = args.exports.split(",")
    args.ctranslate2 = args.ctranslate2.split(",")
    with tempfile.TemporaryDirectory() as scratch:
        if args.smoke:  # the smoke export (beam 4, the exact rule), a few sentences, one round
            from bench import smoke

            args.limit, args.rounds, args.batch_sizes, args.ctranslate2 = 8, 1, [4], ["int8"]
            compare(*prepare(smoke.run(scratch), scratch, args, {(4, "exact", "default"): smoke.export(scratch)}), args)
            return
        if not args.run_dir:
            sys.exit("error: --run-dir is required (a run folder of training.train), or --smoke")
        compare(*prepare(args.run_dir, scratch, args), args)


if __name__ == "__main__":
    main()
