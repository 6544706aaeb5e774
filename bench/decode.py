"""Decoding speed: generated tokens per second for greedy and beam search, in the served graph
(`served`: the SavedModel's parallel searches and threads), with TensorFlow's default threads
(`cached`) and with XLA, next to CTranslate2 on the same weights and to a decoder without a cache.

    python -m bench.decode            # d_model 256, 3+3 layers, batch 32
    python -m bench.decode --precisions float32,bfloat16 --modes served   # reduced precision
    python -m bench.decode --shortlist 2000 --ctranslate2-types float32,int8  # 2,000 candidates each side
    python -m bench.decode --marian /tmp/opus-mt --d-model 512 --layers 6 --heads 8 --d-ff 2048 --vocab-size 58101

With --marian DIR, the model is an OPUS-MT model (Marian's options: swish, a sine half and a cosine
half, a bias on the logits) of the flags' shape, the last command OPUS-MT's: DIR holds it as a
release folder of random weights (bench/marian_release.py; written if DIR has none), which ours
imports (training/marian.py), CTranslate2's own OpusMTConverter converts, and transformers'
MarianMTModel (PyTorch) reads in Hugging Face's form (its rows where it is installed: `pip
install torch transformers`). Each reference's greedy search must give our greedy tokens first.

Random weights and no end of sentence, so that every run generates exactly --length tokens a
sentence. Each measurement is a process of its own, in --rounds interleaved rounds; the last line
gives each row's median ratio to CTranslate2 (each compute type of --ctranslate2-types; and, with
--precisions, to float32) over the rounds.
Method and figures: bench/README.md, "Decoding speed".
"""

import argparse
import pathlib
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf

from bench import ctranslate2_reference, marian_release, transformers_reference
from bench.common import emit, in_turn, peak_rss_mb, ratio_summary, run_isolated, time_call
from keras_transformer import BOS_ID, EOS_ID, PAD_ID, Transformer, TransformerConfig
from export.saved_model import in_precision
from export.serving import PARALLEL_SEARCHES, SERVED_EXECUTION, in_parallel, use_serving_threads
from keras_transformer.search import DecodingSettings, Execution, beam_search, greedy_search
from keras_transformer.search.flags import flag_of
from keras_transformer.search.shortlist import search_over
from keras_transformer.search.loop import graph_function
from training import marian

# (mode, beam size, XLA): the rows of every round, then those measured once, for context.
ROWS = [("served", 1, False), ("cached", 1, False), ("cached", 1, True), ("ctranslate2", 1, False),
        ("served", 4, False), ("cached", 4, False), ("cached", 4, True), ("ctranslate2", 4, False)]  # fmt: skip
CONTEXT_ROWS = [("full_recompute", 1, False), ("full_recompute", 1, True)]


def full_recompute_greedy(model, source_ids, steps):
    """Greedy decoding without a cache: every step runs the decoder over the whole prefix, as the
    TensorFlow tutorial's translator does (here batched, with fixed shapes)."""
    batch = tf.shape(source_ids)[0]
    encoder_output, source_mask = model.encode(source_ids, training=False)
    tokens = tf.concat([tf.fill([batch, 1], BOS_ID), tf.zeros([batch, steps], tf.int32)], axis=1)

    def step(index, tokens):
        logits = tf.gather(model.decode(tokens[:, :-1], encoder_output, source_mask, training=False), index, axis=1)
        logits += tf.one_hot(PAD_ID, tf.shape(logits)[-1], on_value=-1e9)  # never padding, as the searches
        token = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return index + 1, tf.where(tf.range(steps + 1) == index + 1, token[:, None], tokens)

    _, tokens = tf.while_loop(lambda index, _: index < steps, step, (tf.constant(0), tokens))
    return tokens[:, 1:]


def _model_and_source(args):
    """The measured model (random weights, seeded; with --marian, imported from DIR) and source
    ids (with --marian ending with the end of sentence, as Marian's sources do), alike in every
    process."""
    rng = np.random.default_rng(0)
    if args.marian:
        model, _, _ = marian.load_marian(args.marian)
        source = rng.integers(4, model.config.vocab_size, size=(args.batch, args.length), dtype="int32")
        source[:, -1] = EOS_ID
        return model, source
    keras.utils.set_random_seed(0)
    config = TransformerConfig.tiny(
        args.vocab_size, num_layers=args.layers, d_model=args.d_model, num_heads=args.heads, d_ff=args.d_ff
    )
    model = Transformer(config)
    for weight in model.weights:  # biases and layer norms start at 0 and 1: make them count too
        if not weight.path.endswith("kernel") and "embedding" not in weight.path:
            weight.assign(weight + rng.normal(0.0, 0.1, weight.shape).astype("float32"))
    return model, rng.integers(4, args.vocab_size, size=(args.batch, args.length), dtype="int32")


def _vocab_size(args):
    """The model's vocabulary: --vocab-size, or with --marian Marian's --vocab-size pieces and
    two rows of ours (training/marian.py)."""
    return args.vocab_size + marian.NEW_ROWS if args.marian else args.vocab_size


def _write_release(args):
    """With --marian DIR, DIR as an OPUS-MT release of the flags' shape (unless it holds one), its
    pieces named as bench/ctranslate2_reference.py names our ids."""
    folder = pathlib.Path(args.marian)
    if not (folder / "model.npz").exists():
        pieces = [ctranslate2_reference.token(int(marian.our_id(i))) for i in range(args.vocab_size)]
        marian_release.write_release(folder, pieces, d_model=args.d_model, heads=args.heads, d_ff=args.d_ff,
                                     encoder_layers=args.layers, decoder_layers=args.layers, scale=args.d_model**-0.5)  # fmt: skip
        marian_release.write_hugging_face(folder / "hugging-face", folder, pieces)


def _ctranslate2_model(args, model, directory, candidates):
    """CTranslate2's conversion of the measured model into `directory`, and the source ids it
    takes: with --marian, OpusMTConverter's of DIR, which appends the end of sentence itself."""
    if args.marian:
        return ctranslate2_reference.convert_opus_mt(args.marian, directory, candidates), lambda source: source[:, :-1]
    return ctranslate2_reference.convert(model, directory, candidates), lambda source: source


def _candidates(args):
    """With --shortlist N, the N candidate ids of every request (0-3 and N - 4 others, drawn
    once, sorted); else None."""
    if not args.shortlist:
        return None
    others = np.random.default_rng(1).choice(np.arange(4, _vocab_size(args)), size=args.shortlist - 4, replace=False)
    return np.concatenate([np.arange(4), np.sort(others)]).astype("int32")


def _search(search, model, candidates):
    """`search(model, ids, settings, **options)`, over the candidates alone if there are."""
    if candidates is None:
        return lambda ids, settings, **options: search(model, ids, settings, **options)
    return lambda ids, settings, **options: search_over(candidates, search, model, ids, settings, **options)


def measure(mode, beam_size, xla, args, precision="float32", vocabulary=""):
    """One row; `precision`: the served rows' weights and matmuls, CTranslate2's compute type;
    `vocabulary` "full": the whole vocabulary even with --shortlist."""
    if mode == "served":  # before TensorFlow runs anything (in `python -m bench`'s one process: set already)
        use_serving_threads()
    model, source = _model_and_source(args)
    candidates = None if vocabulary == "full" else _candidates(args)
    if mode == "ctranslate2":
        if not ctranslate2_reference.available():
            print("CTranslate2 is not installed: no reference row (pip install -r export/requirements.txt).", file=sys.stderr)
            return
        directory, theirs = _ctranslate2_model(args, model, tempfile.mkdtemp(), candidates)
        translator = ctranslate2_reference.translator(directory, precision)
        vmap = candidates is not None
        if precision == "float32":  # int8 rounds the weights: its tokens differ
            tokens, scores = ctranslate2_reference.translate(translator, theirs(source), 1, args.length, use_vmap=vmap)
            _check_same_greedy_search("CTranslate2", model, source, candidates, tokens, scores)
        seconds = time_call(lambda: ctranslate2_reference.translate(translator, theirs(source), beam_size, args.length,
                                                                    forced=True, use_vmap=vmap), args.repeats)  # fmt: skip
        _emit(mode, beam_size, xla, seconds, args, precision, candidates)
        return
    if mode == "transformers":  # --marian's rows
        if not transformers_reference.available():
            print("transformers or PyTorch is not installed: no transformers row (pip install torch transformers).",
                  file=sys.stderr)  # fmt: skip
            return
        translator = transformers_reference.translator(f"{args.marian}/hugging-face")
        _check_same_greedy_search("transformers", model, source, None, transformers_reference.translate(translator, source, 1,
                                                                                                          args.length))  # fmt: skip
        seconds = time_call(lambda: transformers_reference.translate(translator, source, beam_size, args.length, forced=True),
                            args.repeats)  # fmt: skip
        _emit(mode, beam_size, xla, seconds, args, precision, None)
        return
    model = in_precision(model, precision)
    if mode == "full_recompute":
        decode = lambda s: full_recompute_greedy(model, s, args.length)  # noqa: E731
    else:
        execution = Execution.choose(compiled=True, platform="cpu") if xla else SERVED_EXECUTION
        settings = DecodingSettings(beam_size=beam_size, max_length_b=0)
        run = _search(greedy_search if beam_size == 1 else beam_search, model, candidates)
        search = lambda s: run(s, settings, execution=execution, eos_id=-1)  # noqa: E731
        searches = PARALLEL_SEARCHES if mode == "served" else 1
        decode = lambda s: in_parallel(search, s, searches).tokens  # noqa: E731
    compiled = graph_function(decode, jit_compile=xla)
    tokens = compiled(source)
    assert tokens.shape == (args.batch, args.length) and np.all(tokens.numpy() != 0), "length not forced"
    _emit(mode, beam_size, xla, time_call(lambda: compiled(source).numpy(), args.repeats), args, precision, candidates)


def _check_same_greedy_search(name, model, source, candidates, tokens, scores=None):
    """The greedy search of the reference `name` on our weights gave our `tokens` (ids of ours, a
    list a sentence), and log-probabilities (`scores`, if given) within 0.5% (its kernels round
    differently, by about 0.002 per token): the weights are mapped right, and both decoders agree
    (over the same candidates, if any)."""
    ours = _search(greedy_search, model, candidates)(source, DecodingSettings(beam_size=1, max_length_b=0, alpha=0.0))
    expected = [[int(t) for t in row if t != PAD_ID] for row in keras.ops.convert_to_numpy(ours.tokens)]
    assert tokens == expected, f"{name}'s greedy tokens differ from ours"
    if scores is not None:
        np.testing.assert_allclose(scores, keras.ops.convert_to_numpy(ours.scores), rtol=5e-3)


def _emit(mode, beam_size, xla, seconds, args, precision, candidates):
    emit({"benchmark": "decode", "mode": mode, "precision": precision, "beam_size": beam_size, "xla": xla,
          "batch": args.batch, "source_tokens": args.length, "generated_tokens": args.length, "d_model": args.d_model,
          "layers": args.layers, "vocab_size": _vocab_size(args), "marian": bool(args.marian),
          "candidates": _vocab_size(args) if candidates is None else len(candidates), "seconds": round(seconds, 4),
          "gen_tokens_per_s": round(args.batch * args.length / seconds, 1), "peak_rss_mb": round(peak_rss_mb(), 1)})  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=32, help="source and generated tokens")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--shortlist", type=int, default=0, help="a vocabulary shortlist of this many candidates for "
                        "every row, CTranslate2's as its vocabulary map, each of ours measured over the whole "
                        "vocabulary too (0: the whole vocabulary)")
    parser.add_argument("--ctranslate2-types", default="float32", help="comma-separated: CTranslate2's compute types "
                        "(float32, int8), a reference row each")  # fmt: skip
    parser.add_argument("--marian", metavar="DIR", help="the model an OPUS-MT model, read (or written, random weights) as "
                        "a release folder in DIR; --vocab-size counts Marian's pieces (see above)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every row (medians are reported)")
    parser.add_argument("--precisions", default="float32", help="comma-separated: served rows in each (float32, bfloat16, float16)")
    parser.add_argument("--modes", help="comma-separated: only these rows' modes (served, cached, ctranslate2; with "
                        "--marian, transformers)")
    parser.add_argument("--only", help="one measurement, MODE:BEAM:XLA[:PRECISION[:full]] (e.g. cached:4:1); the default runs "
                        "all, each in its own process so that peak memory is its own")
    args = parser.parse_args(argv)
    rows = []
    for row in ROWS:  # a CTranslate2 row for each compute type
        rows += [(*row, t) for t in args.ctranslate2_types.split(",")] if row[0] == "ctranslate2" else [row]
    rows += [("transformers", beam_size, False) for beam_size in (1, 4)] if args.marian else []
    rows = [row for row in rows if args.modes is None or row[0] in args.modes.split(",")]
    rows += [("served", beam_size, False, precision) for precision in args.precisions.split(",") if precision != "float32"
             for beam_size in (1, 4)]  # fmt: skip
    if args.shortlist:  # each of ours over the whole vocabulary too: the shortlist's own speed-up
        rows += [(mode, beam_size, xla, *(precision or ["float32"]), "full")
                 for mode, beam_size, xla, *precision in rows if mode not in ("ctranslate2", "transformers")]  # fmt: skip
    if args.only:
        mode, beam_size, xla, *precision = args.only.split(":")
        measure(mode, int(beam_size), bool(int(xla)), args, *precision)
        return
    passed = [f"{flag_of(k)}={v}" for k, v in vars(args).items()
              if k not in ("only", "rounds", "precisions", "modes", "ctranslate2_types") and v is not None]  # fmt: skip
    if args.marian:
        _write_release(args)
    if any(row[0] == "ctranslate2" for row in rows) and ctranslate2_reference.available():
        # Its faster matrix library here, chosen once on this model; the rows' processes inherit it.
        with tempfile.TemporaryDirectory() as directory:
            model = _model_and_source(args)[0]
            choice = ctranslate2_reference.choose_backend(_ctranslate2_model(args, model, directory, _candidates(args))[0])
        print(f"CTranslate2 with CT2_USE_MKL={choice} (the faster here).", file=sys.stderr, flush=True)
    rounds = [[record for row in in_turn(rows, index) for record in _run(row, passed)] for index in range(args.rounds)]
    if args.modes is None:
        for row in CONTEXT_ROWS:
            _run(row, passed)
    ratios = {}  # row name -> its ratio to CTranslate2 (or to float32) in each round
    key = lambda r: (r["mode"], r["beam_size"], r["xla"], r["precision"])  # noqa: E731  (a row but for its vocabulary)
    suffix = lambda dtype, prefix: "" if dtype == "float32" else prefix + dtype  # noqa: E731  (none for the default)
    for records in rounds:
        # With --shortlist, the rows scored over it; the whole vocabulary's rows are its baseline.
        main = [r for r in records if not args.shortlist or r["candidates"] == args.shortlist]
        full = {key(r): r["gen_tokens_per_s"] for r in records if args.shortlist and r["candidates"] == _vocab_size(args)}
        references = {(r["beam_size"], r["precision"]): r["gen_tokens_per_s"] for r in main if r["mode"] == "ctranslate2"}
        transformers = {r["beam_size"]: r["gen_tokens_per_s"] for r in records if r["mode"] == "transformers"}  # whole vocabulary
        float32 = {r["beam_size"]: r["gen_tokens_per_s"] for r in main if r["mode"] == "served" and r["precision"] == "float32"}
        for r in main:
            if r["mode"] in ("ctranslate2", "transformers"):
                continue
            row = f"{r['mode']}_beam{r['beam_size']}_{'xla' if r['xla'] else 'graph'}" + suffix(r["precision"], "_")
            if key(r) in full:
                ratios.setdefault(row + "_shortlist_vs_full", []).append(r["gen_tokens_per_s"] / full[key(r)])
            if r["precision"] != "float32" and r["beam_size"] in float32:
                name = f"served_beam{r['beam_size']}_{r['precision']}_vs_float32"
                ratios.setdefault(name, []).append(r["gen_tokens_per_s"] / float32[r["beam_size"]])
            for (beam_size, compute_type), reference in references.items():
                if beam_size == r["beam_size"]:  # against CTranslate2's float32, and _vs_int8 against its int8
                    ratios.setdefault(row + suffix(compute_type, "_vs_"), []).append(r["gen_tokens_per_s"] / reference)
            if r["beam_size"] in transformers:  # ours over the whole vocabulary too, as transformers decodes
                ours = full.get(key(r), r["gen_tokens_per_s"])
                ratios.setdefault(row + "_vs_transformers", []).append(ours / transformers[r["beam_size"]])
    if ratios:
        summary = {name: ratio_summary(values, digits=2) for name, values in ratios.items()}
        emit({"benchmark": "decode_vs_ctranslate2", "rounds": args.rounds, **summary})


def _run(row, passed):
    """Measures one row in its own process (its own peak memory); returns its records."""
    mode, beam_size, xla, *precision = row
    return run_isolated("bench.decode", [*passed, f"--only={':'.join(map(str, [mode, beam_size, int(xla), *precision]))}"])


if __name__ == "__main__":
    main()
