"""`python -m training.evaluate --run-dir DIR`: translate a split with beam search and score it
with sacreBLEU (cased BLEU, chrF and lowercased BLEU on detokenized text, with their signatures),
and for a German target with the paper's tokenized BLEU (`bleu_paper`, training/paper_bleu.py).

Writes the figures into `DIR/metrics.json` (the test split's as they are, the dev split's with a
`dev_` prefix) and the translations into `DIR/translations.<split>.txt`. A run of several pairs
is evaluated on each (or on one, `--pair`): each pair's figures in `pairs`, their mean beside
them, each pair's translations in `DIR/translations.<split>.<pair>.txt`.
"""

import argparse
import json
import sys
import time

from keras_transformer.quiet import quiet_tensorflow

quiet_tensorflow()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import sacrebleu  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer import PAD_ID  # noqa: E402
from keras_transformer.search import DecodingSettings, Execution, decode  # noqa: E402
from keras_transformer.search.flags import add_decoding_flags, decoding_settings  # noqa: E402
from keras_transformer.search.loop import graph_function  # noqa: E402
from training import languages, paper_bleu, run_folder  # noqa: E402
from training.data import bucket_lengths  # noqa: E402


def make_translator(model, tokenizer, settings=DecodingSettings(), *, batch_size=64, jit_compile=True):
    """Returns `translate(sentences) -> (translations, scores)` over Python strings, decoding
    with `settings` (a `DecodingSettings`).

    Sentences are sorted by length, batched, and padded to the data pipeline's bucket lengths,
    so the compiled search sees a few shapes. Sources longer than the model's `max_length`
    tokens are cut there, as the exported model cuts them.
    """
    max_length = model.config.max_length
    lengths = bucket_lengths(max_length)
    search = compile_search(model, settings, jit_compile=jit_compile)

    def translate(sentences):
        ids = tokenizer.encode_source(tf.constant(sentences, tf.string), max_length).to_list() if sentences else []
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        translations, scores = [None] * len(ids), [0.0] * len(ids)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            width = next(length for length in lengths if length >= max(len(ids[i]) for i in rows))
            batch = np.full((batch_size, width), PAD_ID, np.int32)
            for slot, i in enumerate(rows):
                batch[slot, : len(ids[i])] = ids[i]
            tokens, batch_scores = (keras.ops.convert_to_numpy(x) for x in search(batch))
            texts = tokenizer.target.detokenize(tokens).numpy()
            for slot, i in enumerate(rows):
                translations[i] = texts[slot].decode("utf-8")
                scores[i] = float(batch_scores[slot])
        return translations, scores

    return translate


def compile_search(model, settings=DecodingSettings(), jit_compile=True):
    """`search(source_ids) -> SearchResult`, `decode` of `model` with `settings`, compiled for
    Keras' backend as `compile_for_backend` compiles."""
    return compile_for_backend(model, lambda source_ids, execution: decode(model, source_ids, settings, execution), jit_compile)


def compile_for_backend(model, function, jit_compile=True):
    """`function(*arrays, execution)` (a search of `model`) as `compiled(*arrays)`, compiled for
    Keras' backend: `tf.function` (with XLA and the static cache, one program a shape; with
    `jit_compile=False` one graph for every shape, as served), or `jax.jit` with the model's
    weights as arguments rather than constants baked into the program."""
    if keras.config.backend() != "jax":
        execution = Execution.choose(compiled=jit_compile)
        search = graph_function(lambda *arrays: function(*arrays, execution), jit_compile=jit_compile)
        if jit_compile:
            return search

        def any_shape(*arrays):
            arrays = [tf.convert_to_tensor(array) for array in arrays]
            return search.get_concrete_function(*(tf.TensorSpec([None] * a.shape.rank, a.dtype) for a in arrays))(*arrays)

        return any_shape
    import jax

    variables = model.variables
    execution = Execution.choose(compiled=True)

    @jax.jit
    def stateless(values, *arrays):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return function(*arrays, execution)

    return lambda *arrays: stateless([v.value for v in variables], *arrays)


def score(translations, references, target_lang=None):
    """sacreBLEU's scores of detokenized text, with their signatures: cased BLEU and chrF (this
    project's figures), and BLEU on lowercased text (`bleu_lowercase`, 13a tokenization), the
    looser measure most papers on Multi30k report. For a German target also `bleu_paper`, the
    tokenized BLEU the paper reports (training/paper_bleu.py)."""
    metrics = {}
    for name, metric in (("bleu", sacrebleu.metrics.BLEU()), ("chrf", sacrebleu.metrics.CHRF()),
                         ("bleu_lowercase", sacrebleu.metrics.BLEU(lowercase=True, tokenize="13a"))):  # fmt: skip
        metrics[name] = round(metric.corpus_score(translations, [references]).score, 2)
        metrics["signature" if name == "bleu" else f"{name}_signature"] = str(metric.get_signature())
    if target_lang in paper_bleu.LANGUAGES:
        paper = paper_bleu.PaperBleu(target_lang)
        metrics.update(bleu_paper=paper.score(translations, references), bleu_paper_signature=paper.signature)
    return metrics


def evaluate(model, tokenizer, corpus, split, settings=DecodingSettings(), *, limit=None, output_path=None, jit_compile=True,
             target_language=None, translate=None):  # fmt: skip
    """Translates `split` of `corpus` with `settings` and scores it; returns the metrics dict.
    With `target_language`, each source asks for it with its tag (training/languages.py);
    `translate` is a `make_translator` of the same model and settings to reuse."""
    pairs = corpus.text_pairs(split, limit)
    if not pairs:
        raise ValueError(f"The {split} split of {corpus.name} is empty: nothing to evaluate.")
    sources, references = zip(*pairs)
    if target_language:
        sources = [languages.tagged(source, target_language) for source in sources]
    start = time.perf_counter()
    translate = translate or make_translator(model, tokenizer, settings, jit_compile=jit_compile)
    translations, _ = translate(list(sources))
    metrics = {
        **score(translations, list(references), corpus.target_lang),
        "split": split,
        "sentences": len(pairs),
        "beam_size": settings.beam_size,
        "alpha": settings.alpha,
        "decode_seconds": round(time.perf_counter() - start, 1),
    }
    if output_path:
        with tf.io.gfile.GFile(output_path, "w") as f:
            f.write("".join(line + "\n" for line in translations))
    return metrics


def evaluate_pairs(model, tokenizer, corpora, split, settings=DecodingSettings(), *, tagged=False, limit=None,
                   output_paths=None, jit_compile=True):  # fmt: skip
    """`evaluate` on the `split` of each of `corpora` ({(source, target): Corpus}), each source
    tagged with its target language if `tagged`, into `output_paths[pair]` (if given).

    One pair gives its metrics. Several give `{"pairs": {"en-de": its metrics, ...}}` beside the
    mean of each score over the pairs (`bleu`, `chrf`, ...: what model selection compares), the
    sentences and seconds of all, and the signatures (the same for every pair)."""
    translate = make_translator(model, tokenizer, settings, jit_compile=jit_compile)
    per_pair = {
        languages.pair_name(pair): evaluate(model, tokenizer, corpus, split, settings, limit=limit, translate=translate,
                                            output_path=(output_paths or {}).get(pair),
                                            target_language=pair[1] if tagged else None)
        for pair, corpus in corpora.items()
    }  # fmt: skip
    if len(per_pair) == 1:
        return next(iter(per_pair.values()))
    first = next(iter(per_pair.values()))
    shared = [key for key in first if all(key in metrics for metrics in per_pair.values())]
    metrics = {key: first[key] for key in shared if "signature" in key or key in ("split", "beam_size", "alpha")}
    for key in ("bleu", "chrf", "bleu_lowercase", "bleu_paper"):
        if key in shared:
            metrics[key] = round(float(np.mean([pair[key] for pair in per_pair.values()])), 2)
    for key in ("sentences", "decode_seconds"):
        metrics[key] = round(sum(pair[key] for pair in per_pair.values()), 1)
    return {**metrics, "pairs": per_pair}


def prefixed(metrics, split):
    """`metrics` of `split` with keys named for it (`dev_bleu`, ...), to sit beside the test
    split's in `metrics.json`."""
    return {f"{split}_{key}": value for key, value in metrics.items() if key != "split"}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--split", default="test", choices=["dev", "test"])
    parser.add_argument("--pair", help="of a run of several pairs, evaluate only this one (SRC-TGT; default: every pair)")
    parser.add_argument("--checkpoint", help="latest, a step, averaged, or a checkpoint's path (default: the averaged one "
                        "while it is the newest, else the latest)")
    add_decoding_flags(parser)
    parser.add_argument("--limit", type=int, help="evaluate only the first N sentences")
    parser.add_argument("--no-xla", action="store_true", help="search without XLA (TensorFlow only): no compile "
                        "time, for a few sentences")
    args = parser.parse_args(argv)

    run = run_folder.RunFolder(args.run_dir)
    try:
        model, checkpoint_path = run.load_model(args.checkpoint)
        corpora, tokenizer = run.load_corpora(), run.load_tokenizer()
        several = len(corpora) > 1
        if args.pair:
            pair = languages.parse_pairs(args.pair, "--pair")[0]
            if pair not in corpora:
                raise ValueError(f"--pair {args.pair}: {run.path} was trained on {', '.join(map(languages.pair_name, corpora))}.")
            corpora = {pair: corpora[pair]}
        metrics = evaluate_pairs(
            model,
            tokenizer,
            corpora,
            args.split,
            decoding_settings(args, tokenizer.target),
            tagged=bool(languages.languages(tokenizer)),
            limit=args.limit,
            output_paths={pair: run.translations_path(args.split, pair) for pair in corpora},
            jit_compile=not args.no_xla,
        )
    except ValueError as error:
        sys.exit(f"error: {error}")
    metrics["checkpoint"] = checkpoint_path
    record = metrics if args.split == "test" else prefixed(metrics, "dev")
    if args.pair and several:  # one pair's figures, beside the others' (the mean is of an evaluation of all)
        key = "pairs" if args.split == "test" else "dev_pairs"
        record = {key: {**run.metrics().get(key, {}), languages.pair_name(pair): metrics}}
    run.update_metrics(record)
    print(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    main()
