"""Serving real text: a trained run's SavedModel against CTranslate2 on the same weights, on the
run's own test sentences, in sentences per second and per-request latency, with both BLEUs (so
that both are seen to decode the same) and the share of equal translations; and each export's
cold start as a server sees it.

    python -m bench.real_serving --run-dir runs/demo            # the README's demo model
    python -m bench.real_serving --run-dir runs/multi30k        # a multi30k-preset model
    python -m bench.real_serving --run-dir runs/multi30k --run-dir runs/shallow --exports default,shortlist
    python -m bench.real_serving --run-dir runs/multi30k --exports default --ctranslate2 none --batch-sizes 1,32

Each run is exported once per --beam-sizes, --stopping rule and --exports kind (default, xla,
shortlist: `python -m export --shortlist`, or xla+shortlist; or --export, one made already) and
converted for CTranslate2 once per --ctranslate2 weight type (`python -m export.ctranslate2`),
which is also measured with its vocabulary map (`use_vmap`) where an export has the shortlist.
Each measurement is a fresh process, and ours starts as a server does: load, TF Serving's
warm-up requests, one sentence, then the run's test sentences in requests of each batch size
(the model's own time, without HTTP or gRPC), under the README's TF Serving threads (or
TensorFlow's defaults: --tensorflow-threads). All systems of all runs alternate, round after
round (--rounds). A ratio is an export's sentences/s over another system's in the same round:
CTranslate2 on its own run's weights and on the first run's, and the default export of both
runs. How each side is run: bench/README.md, "Serving real text". Without CTranslate2 (`pip
install -r export/requirements.txt`) only ours is measured.
"""

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from bench.common import emit, in_turn, peak_rss_mb, ratio_summary, run_isolated
from export.layout import WARMUP_REQUESTS, read_metadata, target_languages


def measure_ours(export_dir, sentences, batch, serving_threads=True, languages=None):
    """Our export, started as a server starts it; returns its translations of `sentences` (into
    `languages`, one each, for an export of several), each request's seconds, and its cold
    start: load, warm-up and the first request of one sentence."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SentencePiece ops of the SavedModel)

    from export.serving import use_serving_threads

    if serving_threads:
        use_serving_threads()
    start = time.perf_counter()
    loaded = tf.saved_model.load(export_dir)
    serve = loaded.signatures["serving_default"]
    load = time.perf_counter()
    replay_warmup_requests(export_dir, loaded)
    warm = time.perf_counter()

    def translate(requests):  # sentences, or (sentence, language) pairs for an export of several languages
        texts, asked = zip(*requests) if languages else (requests, None)
        inputs = {"target_language": tf.constant(asked)} if languages else {}
        return [t.decode("utf-8") for t in serve(text=tf.constant(texts), **inputs)["translation"].numpy()]

    requests = list(zip(sentences, languages)) if languages else sentences
    translate(requests[:1])
    cold = {"load_s": round(load - start, 2), "warmup_s": round(warm - load, 2),
            "first_request_ms": round(1000 * (time.perf_counter() - warm), 1)}  # fmt: skip
    return (*_timed_pass(translate, requests, batch), cold)


def replay_warmup_requests(export_dir, loaded):
    """What TF Serving does before it serves a new version: run the requests of the SavedModel's
    warm-up file (PredictionLog records) through the signatures they name of `loaded`."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    for record in tf.data.TFRecordDataset(os.path.join(export_dir, WARMUP_REQUESTS)):
        request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
        signature = loaded.signatures[request.model_spec.signature_name]
        signature(**{name: tf.constant(tf.make_ndarray(proto)) for name, proto in request.inputs.items()})


def measure_ctranslate2(model_dir, sentences, batch, beam_size, alpha, max_length_b, use_vmap=False):
    """export/ctranslate2.py's conversion, translated by its recipe: SentencePiece's pieces in and out."""
    import sentencepiece

    from bench import ctranslate2_reference

    translator = ctranslate2_reference.translator(model_dir)
    pieces = sentencepiece.SentencePieceProcessor(model_file=os.path.join(model_dir, "sentencepiece.model"))

    def translate(texts):
        sources = pieces.encode(texts, out_type=str)
        results = translator.translate_batch(sources, beam_size=beam_size, length_penalty=alpha, use_vmap=use_vmap,
                                             max_decoding_length=max(len(source) + 1 for source in sources) + max_length_b)  # fmt: skip
        return pieces.decode([result.hypotheses[0] for result in results])

    return (*_timed_pass(translate, sentences, batch), {})


def _timed_pass(translate, sentences, batch):
    """Translates `sentences` (what `translate` takes a list of) in batches of `batch`, in order,
    once to warm up and once timed; returns the timed pass's translations and each request's
    seconds."""
    translate(sentences[:batch])
    translations, seconds = [], []
    for begin in range(0, len(sentences), batch):
        start = time.perf_counter()
        translations += translate(sentences[begin : begin + batch])
        seconds.append(time.perf_counter() - start)
    return translations, seconds


def worker(args):
    """One measurement, in this process: prints its JSON line and writes its translations."""
    import sacrebleu

    with open(args.sentences, encoding="utf-8") as f:
        sources, references, languages = (list(side) for side in zip(*(json.loads(line) for line in f)))
    decoding = read_metadata(args.export_dir)
    several = len(target_languages(decoding)) > 1
    if args.worker == "ours":
        translations, seconds, cold = measure_ours(args.export_dir, sources, args.batch, not args.tensorflow_threads,
                                                   languages if several else None)  # fmt: skip
    else:
        if several:  # CTranslate2 reads the tag in the source, as the export puts it there
            from training.languages import tagged

            sources = [tagged(source, language) for source, language in zip(sources, languages)]
        translations, seconds, cold = measure_ctranslate2(args.ctranslate2_dir, sources, args.batch, decoding["beam_size"],
                                                           decoding["alpha"], decoding["max_length_b"], args.use_vmap)  # fmt: skip
    with open(args.translations, "w", encoding="utf-8") as f:
        json.dump(translations, f, ensure_ascii=False)
    emit({"benchmark": "real_serving", "system": args.label, "round": args.round, "beam_size": decoding["beam_size"],
          "stopping": decoding["stopping"], "batch": args.batch, "sentences": len(sources),
          "sentences_per_s": round(len(sources) / sum(seconds), 1),
          **{f"p{p}_ms": round(1000 * float(np.percentile(seconds, p)), 2) for p in (50, 95)}, **cold,
          "bleu": round(sacrebleu.corpus_bleu(translations, [references]).score, 2),
          "peak_rss_mb": round(peak_rss_mb(), 1)})  # fmt: skip


class Run:
    """A run folder's measured systems: `exports` {(beam size, stopping rule): {kind: export
    folder}} and `ctranslate2` (its converted folders, one a weight type)."""

    def __init__(self, name, exports, ctranslate2=()):
        self.name, self.exports, self.ctranslate2 = name, exports, list(ctranslate2)

    def systems(self, cell):
        """[(label, worker flags)] of one (beam size, stopping rule): each export, then
        CTranslate2 in each weight type, and with its vocabulary map too where an export has the
        shortlist."""
        exports = self.exports[cell]
        systems = [(f"{self.name}/{kind}", ["--worker=ours", f"--export-dir={path}"]) for kind, path in exports.items()]
        any_export = next(iter(exports.values()))  # CTranslate2 decodes with its settings (metadata.json)
        vmap = [False, True] if any("shortlist" in kind for kind in exports) else [False]
        for directory in self.ctranslate2:
            for use_vmap in vmap:
                label = f"{self.name}/ctranslate2_{os.path.basename(directory)}" + ("_vmap" if use_vmap else "")  # its weights
                systems.append((label, ["--worker=ctranslate2", f"--ctranslate2-dir={directory}", f"--export-dir={any_export}",
                                        *(["--use-vmap"] if use_vmap else [])]))  # fmt: skip
        return systems


def test_pairs(run_dir, limit):
    """The first `limit` test pairs (None: all) of each of the run's pairs, as (source, reference,
    target language): for a run of several, the pairs' sentences in turn."""
    from training.run_folder import RunFolder

    of_each = [[(*pair, target) for pair in corpus.text_pairs("test", limit)]
               for (_, target), corpus in RunFolder(run_dir).load_corpora().items()]  # fmt: skip
    return [pair for turn in itertools.zip_longest(*of_each) for pair in turn if pair is not None]


def write_pairs(pairs, scratch):
    """`pairs` as the workers read them (a JSON list a line); returns the file."""
    path = os.path.join(scratch, "test.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(pair, ensure_ascii=False) + "\n" for pair in pairs)
    return path


def prepare(run_dir, scratch, args, name, given=None):
    """Exports the run into `scratch` for each beam size, stopping rule and kind (or takes the
    export `given`) and converts it for CTranslate2 for each weight type; returns the `Run`."""
    from bench import ctranslate2_reference
    from export import ctranslate2 as conversion
    from export.saved_model import export
    from export.xla import CompiledShapes
    from keras_transformer.search import DecodingSettings

    exports = {}  # greedy search has no stopping rule
    if given:
        decoding = read_metadata(given)
        exports[decoding["beam_size"], decoding["stopping"]] = {"export": given}
    for size in args.beam_sizes if not given else ():
        for stopping in args.stopping if size > 1 else [DecodingSettings.stopping]:
            settings = DecodingSettings(beam_size=size, stopping=stopping,
                                        **({} if args.max_length_b is None else {"max_length_b": args.max_length_b}))  # fmt: skip
            for kind in args.exports:
                features = kind.split("+")
                exports.setdefault((size, stopping), {})[kind] = export(
                    run_dir, os.path.join(scratch, f"beam{size}_{stopping}_{kind}"), settings,
                    compiled_shapes=CompiledShapes() if "xla" in features else None,
                    shortlist="run" if "shortlist" in features else None)  # fmt: skip
    if not ctranslate2_reference.available():
        print("CTranslate2 is not installed: no reference rows (pip install -r export/requirements.txt).", file=sys.stderr)
        return Run(name, exports)
    # Converted after the exports: a shortlist export learns the run's table, which becomes vmap.txt.
    directories = [conversion.export(run_dir, os.path.join(scratch, "ctranslate2", weights), weights)
                   for weights in args.ctranslate2]  # fmt: skip
    return Run(name, exports, directories)


def mean_candidates(run_dir, sources, batch):
    """How many tokens the run's shortlist lets a request of `batch` of `sources` score, on
    average, as the export tokenizes them; and the vocabulary's size."""
    import sentencepiece
    import tensorflow as tf

    from keras_transformer.search.shortlist import candidates
    from training import shortlist as lexical
    from training.run_folder import RunFolder, local_copy

    run = RunFolder(run_dir)
    with local_copy(run.tokenizer_path) as path:
        pieces = sentencepiece.SentencePieceProcessor(model_file=path)
    table, always = lexical.read(run.shortlist_path, pieces)
    tokenizer = run.load_tokenizer()
    counts = [len(candidates(tokenizer.encode_source(tf.constant(sources[begin : begin + batch])).to_tensor(), table, always))
              for begin in range(0, len(sources), batch)]  # fmt: skip
    return float(np.mean(counts)), pieces.get_piece_size()


def compared(ours, others, runs):
    """The systems `ours` (an export's label) is measured against: CTranslate2 on its run's
    weights and on the first run's, and the default export of both runs."""
    within = (ours.split("/")[0], runs[0].name)
    return [other for other in others if other != ours and other.split("/")[0] in within
            and (other.split("/")[1].startswith("ctranslate2") or other.split("/")[1] == "default")]  # fmt: skip


def compare(runs, sentences, args, scratch):
    """Every system of every run, alternating round after round, per beam size, stopping rule
    and batch; then a ratio of each export's sentences/s to each system it is compared with in
    the same round, with the share of equal translations; then each ratio's median and range."""
    ratios = {}
    for round_ in range(args.rounds):
        for cell in runs[0].exports:
            systems = [system for run in runs for system in run.systems(cell)]
            for batch in args.batch_sizes:
                figures, outputs = {}, {}
                for index, (label, flags) in enumerate(in_turn(systems, round_)):
                    path = os.path.join(scratch, f"translations.{index}.json")
                    (figures[label],) = run_isolated("bench.real_serving", [
                        *flags, f"--label={label}", f"--translations={path}", f"--sentences={sentences}",
                        f"--batch={batch}", f"--round={round_}",
                        *(["--tensorflow-threads"] if args.tensorflow_threads else [])])  # fmt: skip
                    with open(path, encoding="utf-8") as f:
                        outputs[label] = json.load(f)
                for ours in (label for label, flags in systems if flags[0] == "--worker=ours"):
                    for other in compared(ours, figures, runs):
                        row = {"beam_size": cell[0], "stopping": cell[1], "batch": batch, "ours": ours, "other": other}
                        ratio = figures[ours]["sentences_per_s"] / figures[other]["sentences_per_s"]
                        same = float(np.mean([a == b for a, b in zip(outputs[ours], outputs[other])]))
                        emit({"benchmark": "real_serving_ratio", "round": round_, **row, "ratio": round(ratio, 3),
                              "identical": round(same, 3), "bleu_ours": figures[ours]["bleu"],
                              "bleu_other": figures[other]["bleu"]})  # fmt: skip
                        ratios.setdefault(json.dumps(row), []).append((ratio, same))
    for key, values in ratios.items():
        emit({"benchmark": "real_serving_summary", **json.loads(key), "rounds": len(values),
              **ratio_summary([r for r, _ in values]), "identical": round(statistics.mean(s for _, s in values), 3)})  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", action="append", help="a run folder of training.train; repeat it to measure several "
                        "runs side by side (the first is the one the others are compared with)")  # fmt: skip
    parser.add_argument("--export", help="an export of the (first) run to measure, instead of --beam-sizes, --stopping and "
                        "--exports")  # fmt: skip
    parser.add_argument("--beam-sizes", default="4,1")
    parser.add_argument("--stopping", default="exact,first_k", help="beam search's stopping rules measured")
    parser.add_argument("--exports", default="default,xla", help="the exports measured: default (no XLA), xla, shortlist "
                        "(python -m export --shortlist), xla+shortlist")  # fmt: skip
    parser.add_argument("--ctranslate2", default="float32,int8", help="CTranslate2's weight types measured beside ours "
                        "(none: no CTranslate2)")  # fmt: skip
    parser.add_argument("--tensorflow-threads", action="store_true",
                        help="ours under TensorFlow's default threads, not the README's serving settings")  # fmt: skip
    parser.add_argument("--batch-sizes", default="32,8,1")
    parser.add_argument("--rounds", type=int, default=2, help="times each measurement runs, the systems alternating")
    parser.add_argument("--limit", type=int, help="the first N test sentences (default: all)")
    parser.add_argument("--max-length-b", type=int, help="as python -m export (default: its default)")
    parser.add_argument("--worker", choices=["ours", "ctranslate2"], help=argparse.SUPPRESS)
    for hidden in ("--export-dir", "--ctranslate2-dir", "--sentences", "--label", "--translations"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--use-vmap", action="store_true", help=argparse.SUPPRESS)
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
    args.ctranslate2 = [] if args.ctranslate2 == "none" else args.ctranslate2.split(",")
    unknown = [kind for kind in args.exports if not set(kind.split("+")) <= {"default", "xla", "shortlist"}]
    if unknown:
        parser.error(f"--exports: {', '.join(unknown)} is not default, xla, shortlist or xla+shortlist")
    if not args.run_dir:
        parser.error("--run-dir is required (a run folder of training.train)")
    with tempfile.TemporaryDirectory() as scratch:
        pairs = test_pairs(args.run_dir[0], args.limit)
        for run_dir in args.run_dir[1:]:  # checked before anything is exported
            if test_pairs(run_dir, args.limit) != pairs:
                sys.exit(f"error: --run-dir {run_dir}'s test pairs differ from {args.run_dir[0]}'s: runs measured side "
                         "by side translate the same sentences")  # fmt: skip
        runs = []
        for index, run_dir in enumerate(args.run_dir):
            name = os.path.basename(os.path.normpath(run_dir))
            if name in (run.name for run in runs):
                name = f"{name}{index}"
            os.makedirs(os.path.join(scratch, name))
            runs.append(prepare(run_dir, os.path.join(scratch, name), args, name, args.export if index == 0 else None))
            if any("shortlist" in kind for kind in args.exports):  # the run's table exists now
                for batch in args.batch_sizes:
                    mean, vocab_size = mean_candidates(run_dir, [source for source, _, _ in pairs], batch)
                    emit({"benchmark": "real_serving_candidates", "run": name, "batch": batch,
                          "mean_candidates": round(mean, 1), "vocab_size": vocab_size})  # fmt: skip
        from bench import ctranslate2_reference

        if runs[0].ctranslate2:  # a measurement: its faster matrix library here (two timed processes)
            print(f"CTranslate2 with CT2_USE_MKL={ctranslate2_reference.choose_backend(runs[0].ctranslate2[0])} "
                  "(the faster here).", file=sys.stderr)  # fmt: skip
        compare(runs, write_pairs(pairs, scratch), args, scratch)


if __name__ == "__main__":
    main()
