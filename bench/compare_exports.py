"""SavedModels of `python -m export` side by side in one process: the same requests to each in
turn, round after round (the order reversed every other round), each one's sentences per second
as a ratio to the first export's in the same round, and the share of its translations equal to
the first's (and its cased BLEU when FILE holds references).

    python -m bench.compare_exports --sentences FILE BASE/1 OTHER/1 [--batch 32] [--rounds 10]
    python -m bench.compare_exports --smoke                # seconds: the smoke exports, beam 4 against greedy

FILE holds sources, one a line, or test pairs as JSON lines (`[source, reference]`, as
bench.real_serving writes them). One JSON line a round, then one an export: its ratios' median and
range.
"""

import argparse
import json
import os
import tempfile

from keras_transformer.quiet import quiet_tensorflow

quiet_tensorflow()

from bench.common import emit, ratio_summary, run_isolated, timed_rounds  # noqa: E402


def read_sources(path, limit):
    """The first `limit` source sentences of a file of sentences or of JSON `[source, reference]`
    lines, and their references (None for plain sentences)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()[:limit]
    if not lines or not lines[0].startswith("["):
        return lines, None
    pairs = [json.loads(line) for line in lines]
    return [source for source, _ in pairs], [reference for _, reference in pairs]


def compare(export_dirs, sources, batch, rounds, references=None):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SentencePiece ops of the SavedModel)

    from export.serving import use_serving_threads

    use_serving_threads()
    serving = {}  # an export named twice is loaded once
    for export_dir in dict.fromkeys(export_dirs):
        loaded = tf.saved_model.load(export_dir)
        serving[export_dir] = loaded.signatures["serving_default"]
    serves = [serving[export_dir] for export_dir in export_dirs]
    requests = [tf.constant(sources[i : i + batch]) for i in range(0, len(sources), batch)]
    outputs = [[serve(text=request)["translation"].numpy() for request in requests] for serve in serves]
    same = [sum(int((a == b).sum()) for a, b in zip(outputs[0], output)) / len(sources) for output in outputs]
    bleu = [None] * len(serves)
    if references:
        from training.evaluate import score

        bleu = [score([t.decode() for part in output for t in part], references)["bleu"] for output in outputs]

    speeds = timed_rounds({index: lambda request, serve=serve: serve(text=request) for index, serve in enumerate(serves)},
                          requests, rounds)  # fmt: skip
    for round_ in range(rounds):
        emit({"benchmark": "compare_exports", "round": round_, "batch": batch, "sentences": len(sources),
              "sentences_per_s_each": [round(speeds[index][round_], 1) for index in speeds],
              "ratios": [round(speeds[index][round_] / speeds[0][round_], 3) for index in speeds]})  # fmt: skip
    for index, export_dir in list(enumerate(export_dirs))[1:]:
        emit({"benchmark": "compare_exports_summary", "export": export_dir, "baseline": export_dirs[0], "batch": batch,
              "rounds": rounds, **ratio_summary([a / b for a, b in zip(speeds[index], speeds[0])]),
              "same_translations": round(same[index], 4),
              **({"bleu": bleu[index], "baseline_bleu": bleu[0]} if references else {})})  # fmt: skip


def add_request_flags(parser, rounds):
    """--sentences, --batch, --rounds (default `rounds`), --limit and --smoke, for benchmarks that
    send a file's sentences to exports."""
    parser.add_argument("--sentences", help="source sentences, or a run's test pairs as JSON lines")
    parser.add_argument("--batch", type=int, default=32, help="sentences a request")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--limit", type=int, default=320, help="the first N sentences of --sentences")
    parser.add_argument("--smoke", action="store_true")


# The smoke modes' sentences.
SMOKE_SENTENCES = ["a small test", "another sentence here", "and a third", "the dog sees the red car ."]


def run_smoke(module, exports_of):
    """`python -m module` in a fresh process (its threads) on the smoke exports (`exports_of(scratch)`:
    the positional arguments; bench/smoke.py's `export`) and SMOKE_SENTENCES, two a request, for two
    rounds."""
    with tempfile.TemporaryDirectory() as scratch:
        sentences = os.path.join(scratch, "sentences.txt")
        with open(sentences, "w") as f:
            f.write("".join(sentence + "\n" for sentence in SMOKE_SENTENCES))
        run_isolated(module, [*exports_of(scratch), f"--sentences={sentences}", "--batch=2", "--rounds=2"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exports", nargs="*", help="SavedModel version folders; ratios are to the first")
    add_request_flags(parser, rounds=10)
    args = parser.parse_args(argv)
    if args.smoke:
        from bench import smoke

        run_smoke("bench.compare_exports", lambda scratch: [smoke.export(scratch), smoke.export(scratch, beam_size=1)])
        return
    if len(args.exports) < 2 or not args.sentences:
        parser.error("two or more exports and --sentences are needed (or --smoke)")
    sources, references = read_sources(args.sentences, args.limit)
    compare(args.exports, sources, args.batch, args.rounds, references)


if __name__ == "__main__":
    main()
