"""What each decoding option costs when a request sets it, and what scoring costs against a search:
one export in one process, the same requests in every mode of a round, the order reversed every
other round, each mode's sentences per second as a ratio to `serving_default`'s in that round.

    python -m bench.options --sentences FILE EXPORT/1 [--batch 32] [--rounds 6] [--limit 320]
    python -m bench.options --smoke            # seconds: the smoke export

Modes: `serving_default`; `options` with nothing set, with each option of OPTIONS alone at its
example value, and with all; `score` of `serving_default`'s translations. FILE as
bench.compare_exports reads it. One JSON line a round, then one a mode: its ratios' median and
range, and the share of translations equal to `serving_default`'s.
"""

import argparse

from keras_transformer.quiet import quiet_tensorflow

quiet_tensorflow()

from bench.common import emit, ratio_summary, timed_rounds  # noqa: E402
from bench.compare_exports import add_request_flags, read_sources, run_smoke  # noqa: E402
from keras_transformer.search import OPTIONS  # noqa: E402

def modes(loaded, tf):
    """name -> function(request text) -> the strings it returns (None for `score`)."""
    found = {"serving_default": lambda text: loaded.translate(text)["translation"],
             "options, none set": lambda text: loaded.options(text)["translation"]}  # fmt: skip
    examples = {option.name: tf.constant([option.example]) for option in OPTIONS}  # one value for every sentence
    for name, value in examples.items():
        found[f"options, {name}"] = lambda text, given={name: value}: loaded.options(text, **given)["translation"]
    found["options, all set"] = lambda text: loaded.options(text, **examples)["translation"]
    return found


def measure(export_dir, sources, batch, rounds):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SentencePiece ops of the SavedModel)

    from export.serving import use_serving_threads

    use_serving_threads()
    loaded = tf.saved_model.load(export_dir)
    requests = [tf.constant(sources[i : i + batch]) for i in range(0, len(sources), batch)]
    calls = modes(loaded, tf)
    outputs = {name: [call(request).numpy() for request in requests] for name, call in calls.items()}
    targets = [tf.constant(output) for output in outputs["serving_default"]]
    calls["score"] = lambda request, targets=dict(zip(map(id, requests), targets)): loaded.score(request, targets[id(request)])["score"]
    calls["score"](requests[0])  # traced once, as the others were above
    same = {name: sum(int((a == b).sum()) for a, b in zip(outputs["serving_default"], output)) / len(sources)
            for name, output in outputs.items()}  # fmt: skip
    speeds = timed_rounds(calls, requests, rounds)
    for round_ in range(rounds):
        emit({"benchmark": "options", "round": round_, "batch": batch, "sentences": len(sources),
              "sentences_per_s_each": {name: round(speed[round_], 1) for name, speed in speeds.items()}})  # fmt: skip
    for name in list(calls)[1:]:
        emit({"benchmark": "options_summary", "mode": name, "batch": batch, "rounds": rounds,
              **ratio_summary([a / b for a, b in zip(speeds[name], speeds["serving_default"])]),
              **({"same_translations": round(same[name], 4)} if name in same else {})})  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", nargs="?", help="a SavedModel version folder")
    add_request_flags(parser, rounds=6)
    args = parser.parse_args(argv)
    if args.smoke:
        from bench import smoke

        run_smoke("bench.options", lambda scratch: [smoke.export(scratch)])
        return
    if not args.export or not args.sentences:
        parser.error("an export and --sentences are needed (or --smoke)")
    sources, _ = read_sources(args.sentences, args.limit)
    measure(args.export, sources, args.batch, args.rounds)


if __name__ == "__main__":
    main()
