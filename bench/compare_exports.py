"""Served systems side by side in one process: the same requests to each in turn, round after
round (the order reversed every other round), each one's sentences per second as a ratio to the
first's in the same round, and the share of its translations equal to the first's (and its cased
BLEU when FILE holds references). The systems are SavedModels of `python -m export`, or with
--options one export's ways of asking: what each decoding option costs when a request sets it,
and what scoring costs against a search.

    python -m bench.compare_exports --sentences FILE BASE/1 OTHER/1 [--batch 32] [--rounds 10]
    python -m bench.compare_exports --options --sentences FILE EXPORT/1 [--rounds 6]

With --options the systems are `serving_default`; `options` with nothing set, with each option
of OPTIONS alone at its example value, and with all; and `score` of `serving_default`'s
translations. FILE holds sources, one a line, or test pairs as JSON lines (`[source,
reference, ...]`, as bench.real_serving writes them). An export of several target languages
writes its first (`loaded.translate`'s default). One JSON line a round, then one a system: its
ratios' median and range.
"""

import argparse
import json

from bench.common import emit, ratio_summary, timed_rounds


def read_sources(path, limit):
    """The first `limit` source sentences of a file of sentences or of JSON `[source, reference,
    ...]` lines, and their references (None for plain sentences)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()[:limit]
    if not lines or not lines[0].startswith("["):
        return lines, None
    pairs = [json.loads(line) for line in lines]
    return [pair[0] for pair in pairs], [pair[1] for pair in pairs]


def exports(export_dirs, tf):
    """Each export's `serving_default` (its loaded method, which applies the signature's defaults):
    {name: function(request text) -> translations}; an export named twice (an A/A run) is loaded
    once, and named DIR#INDEX."""
    loaded, calls = {}, {}
    for index, export_dir in enumerate(export_dirs):
        if export_dir not in loaded:
            loaded[export_dir] = tf.saved_model.load(export_dir)  # kept: its methods need its variables
        name = export_dir if export_dirs.count(export_dir) == 1 else f"{export_dir}#{index}"
        calls[name] = lambda text, served=loaded[export_dir]: served.translate(text)["translation"]
    return calls


def options(export_dir, tf):
    """One export's `serving_default` and `options` signature, {name: function(request text) ->
    translations}, and its `score` signature, function(request text, targets) -> scores."""
    from keras_transformer.search import OPTIONS

    loaded = tf.saved_model.load(export_dir)
    calls = {"serving_default": lambda text: loaded.translate(text)["translation"],
             "options, none set": lambda text: loaded.options(text)["translation"]}  # fmt: skip
    examples = {option.name: tf.constant([option.example]) for option in OPTIONS}  # one value for every sentence
    for name, value in examples.items():
        calls[f"options, {name}"] = lambda text, given={name: value}: loaded.options(text, **given)["translation"]
    calls["options, all set"] = lambda text: loaded.options(text, **examples)["translation"]
    return calls, lambda text, targets: loaded.score(text, targets)["score"]


def compare(calls, sources, batch, rounds, references=None, score=None):
    """Times `calls` (the first is the baseline) and, given `score`, the scoring of the
    baseline's translations; prints each round's sentences/s and each system's summary."""
    import tensorflow as tf

    requests = [tf.constant(sources[i : i + batch]) for i in range(0, len(sources), batch)]
    outputs = {name: [call(request).numpy() for request in requests] for name, call in calls.items()}
    baseline = next(iter(calls))
    same = {name: sum(int((a == b).sum()) for a, b in zip(outputs[baseline], output)) / len(sources)
            for name, output in outputs.items()}  # fmt: skip
    bleu = {}
    if references:
        from training.evaluate import score as bleu_of

        bleu = {name: bleu_of([t.decode() for part in output for t in part], references)["bleu"] for name, output in outputs.items()}
    if score:  # of the baseline's own translations
        targets = {id(request): tf.constant(output) for request, output in zip(requests, outputs[baseline])}
        calls["score"] = lambda request: score(request, targets[id(request)])
        calls["score"](requests[0])  # traced once, as the others were above
    speeds = timed_rounds(calls, requests, rounds)
    for round_ in range(rounds):
        emit({"benchmark": "compare_exports", "round": round_, "batch": batch, "sentences": len(sources),
              "sentences_per_s_each": {name: round(speed[round_], 1) for name, speed in speeds.items()}})  # fmt: skip
    for name in list(calls)[1:]:
        emit({"benchmark": "compare_exports_summary", "system": name, "baseline": baseline, "batch": batch, "rounds": rounds,
              **ratio_summary([a / b for a, b in zip(speeds[name], speeds[baseline])]),
              **({"same_translations": round(same[name], 4)} if name in same else {}),
              **({"bleu": bleu[name], "baseline_bleu": bleu[baseline]} if name in bleu else {})})  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exports", nargs="+", help="SavedModel version folders; ratios are to the first")
    parser.add_argument("--options", action="store_true", help="one export's options and scoring against its serving_default")
    parser.add_argument("--sentences", required=True, help="source sentences, or a run's test pairs as JSON lines")
    parser.add_argument("--batch", type=int, default=32, help="sentences a request")
    parser.add_argument("--rounds", type=int, help="default: 10; with --options 6")
    parser.add_argument("--limit", type=int, default=320, help="the first N sentences of --sentences")
    args = parser.parse_args(argv)
    if len(args.exports) != 1 if args.options else len(args.exports) < 2:
        parser.error("--options measures one export" if args.options else "two or more exports are needed")
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SentencePiece ops of the SavedModel)

    from export.serving import use_serving_threads

    use_serving_threads()
    calls, score = options(args.exports[0], tf) if args.options else (exports(args.exports, tf), None)
    sources, references = read_sources(args.sentences, args.limit)
    compare(calls, sources, args.batch, args.rounds or (6 if args.options else 10), references, score)


if __name__ == "__main__":
    main()
