"""Serving latency of an exported SavedModel: cold start, then p50 / p95 per request at batch 1
and batch 32.

    python -m bench.serving --run-dir runs/multi30k   # exports the run, then measures it
    python -m bench.serving --smoke                   # seconds: the smoke export (bench/smoke.py)

Each --beam-sizes export is measured in a fresh process, as a server starts it: load, TF
Serving's warm-up requests, the first request; then requests of the run's test sentences to
`serving_default` (the model's time, without HTTP or gRPC), under the README's TF Serving threads
(or TensorFlow's defaults: --tensorflow-threads). One JSON line per beam size and batch size.
"""

import argparse
import os
import sys
import tempfile
import time

from keras_transformer.quiet import quiet_tensorflow

quiet_tensorflow()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402,F401  (the SentencePiece ops of the SavedModel)

from bench.common import emit, peak_rss_mb, run_isolated  # noqa: E402
from export.layout import WARMUP_REQUESTS, read_metadata  # noqa: E402

def measure(export_dir, sentences_path, batch_sizes, requests, serving_threads=True):
    if serving_threads:
        from export.serving import use_serving_threads

        use_serving_threads()
    with open(sentences_path, encoding="utf-8") as f:
        sentences = f.read().splitlines()
    start = time.perf_counter()
    model = tf.saved_model.load(export_dir)
    serve = model.signatures["serving_default"]
    loaded = time.perf_counter()
    replay_warmup_requests(export_dir, model)
    warmed = time.perf_counter()
    serve(text=tf.constant(sentences[:1]))
    cold_start = time.perf_counter() - start
    beam_size = read_metadata(export_dir)["beam_size"]
    for batch in batch_sizes:
        latencies, position = [], 1
        for _ in range(requests):
            rows = [sentences[(position + i) % len(sentences)] for i in range(batch)]
            position += batch
            begin = time.perf_counter()
            serve(text=tf.constant(rows))["translation"].numpy()
            latencies.append(time.perf_counter() - begin)
        emit(
            {
                "benchmark": "serving",
                "beam_size": beam_size,
                "batch": batch,
                "searches": read_metadata(export_dir).get("searches", 1),
                "threads": "serving" if serving_threads else "tensorflow default",
                "requests": requests,
                "cold_start_s": round(cold_start, 3),
                "load_s": round(loaded - start, 3),
                "warmup_s": round(warmed - loaded, 3),
                "first_request_ms": round(1000 * (cold_start - (warmed - start)), 1),
                "p50_ms": round(1000 * float(np.percentile(latencies, 50)), 1),
                "p95_ms": round(1000 * float(np.percentile(latencies, 95)), 1),
                "sentences_per_s": round(batch * requests / sum(latencies), 1),
                "peak_rss_mb": round(peak_rss_mb(), 1),
            }
        )


def replay_warmup_requests(export_dir, loaded):
    """What TF Serving does before it serves a new version: run the requests of the SavedModel's
    `assets.extra/tf_serving_warmup_requests` (PredictionLog records) through the signatures
    they name of `loaded` (the loaded SavedModel)."""
    from tensorflow_serving.apis import prediction_log_pb2

    path = os.path.join(export_dir, WARMUP_REQUESTS)
    for record in tf.data.TFRecordDataset(path):
        request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
        signature = loaded.signatures[request.model_spec.signature_name]
        signature(**{name: tf.constant(tf.make_ndarray(proto)) for name, proto in request.inputs.items()})


def export_search(run_dir, base, max_length_b=None, compiled_shapes=None, shortlist=None, **settings):
    """The run exported to `base` as `python -m export` does, with `settings` (`DecodingSettings`'
    fields), `max_length_b` (None: its default), `compiled_shapes` (`--xla`'s; None: no XLA)
    and `shortlist` (`--shortlist`'s); returns the version folder."""
    from export.saved_model import export
    from keras_transformer.search import DecodingSettings

    if max_length_b is not None:
        settings["max_length_b"] = max_length_b
    return export(run_dir, base, DecodingSettings(**settings), compiled_shapes=compiled_shapes, shortlist=shortlist)


def export_and_measure(run_dir, scratch, args, export_dirs=None):
    """Exports the run for each of `args.beam_sizes` (unless `export_dirs` are given) and
    measures each export in a process of its own on the run's test sources."""
    from training.run_folder import RunFolder

    sources = [source for source, _ in RunFolder(run_dir).load_corpus().text_pairs("test")]
    sentences_path = os.path.join(scratch, "sentences.txt")
    with open(sentences_path, "w", encoding="utf-8") as f:
        f.writelines(sentence + "\n" for sentence in sources)
    if export_dirs is None:
        export_dirs = [export_search(run_dir, os.path.join(scratch, f"beam{size}"), args.max_length_b, beam_size=size)
                       for size in args.beam_sizes]  # fmt: skip
    for export_dir in export_dirs:
        run_isolated("bench.serving", [f"--only={export_dir}", f"--sentences={sentences_path}",
                                       f"--batch-sizes={','.join(map(str, args.batch_sizes))}", f"--requests={args.requests}"])  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", help="a run folder of training.train")
    parser.add_argument("--smoke", action="store_true", help="the smoke export (bench/smoke.py), few requests")
    parser.add_argument("--beam-sizes", default="4,1")
    parser.add_argument("--batch-sizes", default="1,32")
    parser.add_argument("--requests", type=int, default=50, help="timed requests per batch size")
    parser.add_argument("--max-length-b", type=int, help="as python -m export (default: its default)")
    parser.add_argument("--only", help="measure this export folder (in this process)")
    parser.add_argument("--sentences", help="with --only: a file of source sentences")
    parser.add_argument("--tensorflow-threads", action="store_true",
                        help="with --only: TensorFlow's default threads, not the README's serving settings")  # fmt: skip
    args = parser.parse_args(argv)
    args.beam_sizes = [int(size) for size in args.beam_sizes.split(",")]
    args.batch_sizes = [int(size) for size in args.batch_sizes.split(",")]
    if args.only:
        measure(args.only, args.sentences, args.batch_sizes, args.requests, serving_threads=not args.tensorflow_threads)
        return
    with tempfile.TemporaryDirectory() as scratch:
        if args.smoke:  # one export: the smoke mode checks the script, not greedy search
            from bench import smoke

            args.requests = 3
            export_and_measure(smoke.run(scratch), scratch, args, [smoke.export(scratch)])
            return
        if not args.run_dir:
            sys.exit("error: --run-dir is required (a run folder of training.train), or --smoke")
        export_and_measure(args.run_dir, scratch, args)


if __name__ == "__main__":
    main()
