"""Where a served decoding step's time goes: the ops the SavedModel's search loop runs per step,
by op type, with their count and time, under TensorFlow's profiler.

    python -m bench.decode_profile --export-dir exports/demo/1 --sentences FILE [--batch 32]

`serving_default` translates the first --batch sentences of FILE --calls times under the README's
TF Serving threads; the op events inside the search loops (`/while/body/`) are grouped by type
and divided by the loops' steps (each step evaluates one `All`, `ops.all(done)`). Op times add up
the threads', so they exceed the wall time when ops run side by side. One JSON line.
"""

import argparse
import collections
import glob
import os
import tempfile
import time

import tensorflow as tf
import tensorflow_text  # noqa: F401  (the SentencePiece ops of the SavedModel)

from bench.common import emit


def profile(export_dir, sentences, calls, top):
    from export.serving import use_serving_threads
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    use_serving_threads()
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    text = tf.constant(sentences)
    serve(text=text)
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        start = time.perf_counter()
        for _ in range(calls):
            serve(text=text)
        wall = (time.perf_counter() - start) / calls
        tf.profiler.experimental.stop()
        (path,) = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        with open(path, "rb") as f:
            space = xplane_pb2.XSpace.FromString(f.read())
    counts, micros = collections.Counter(), collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if "/while/body/" in name or "/while/cond/" in name:
                    kind = name.rsplit(":", 1)[-1]
                    counts[kind] += 1
                    micros[kind] += event.duration_ps / 1e6
    steps = max(1, round(counts["All"] / calls))  # the loop condition's `ops.all(done)`: once a step
    total = sum(micros.values())
    emit({"benchmark": "decode_profile", "export": export_dir, "batch": len(sentences),
          "wall_ms_per_call": round(1000 * wall, 2), "loop_steps_per_call": steps,
          "ops_per_step": round(sum(counts.values()) / calls / steps, 1),
          "op_us_per_step": round(total / calls / steps, 1), "op_types": [
          {"op": kind, "per_step": round(counts[kind] / calls / steps, 1), "share": round(micros[kind] / total, 4)}
          for kind, _ in micros.most_common(top) ]})  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export-dir", required=True, help="a SavedModel version folder of python -m export")
    parser.add_argument("--sentences", required=True, help="a file of source sentences, one a line")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--calls", type=int, default=3, help="profiled calls")
    parser.add_argument("--top", type=int, default=15, help="op types listed")
    args = parser.parse_args(argv)
    with open(args.sentences, encoding="utf-8") as f:
        sentences = f.read().splitlines()[: args.batch]
    profile(args.export_dir, sentences, args.calls, args.top)


if __name__ == "__main__":
    main()
