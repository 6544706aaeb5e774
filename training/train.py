"""`python -m training.train --run-dir DIR`: train a Transformer, then evaluate it.

With only --run-dir: the tiny config on the built-in synthetic corpus, then beam search on its
test split and DIR/metrics.json. Rerun with the same --run-dir to resume from the last checkpoint
(model, optimizer, step and the position in the data).

Keras' backend chooses how the step runs (training/backends/): TensorFlow with a tf.distribute
strategy (CPUs, GPUs, several workers), or JAX over every local device (TPUs). `--backend jax`
is the same as KERAS_BACKEND=jax; the flags, the run folder and the outputs are the same.

    python -m training.train --run-dir runs/wmt --config base --dataset tfds:wmt14_translate/de-en \\
        --source-lang en --target-lang de --strategy auto --mixed-precision
    python -m training.train --backend jax --strategy tpu --run-dir runs/wmt --config base ...
    python -m training.train --backend jax --strategy tpu --processes auto --run-dir DIR ...  # on every host
    python -m training.train --run-dir runs/multi30k --dataset ../shared/data/multi30k \\
        --source-lang en --target-lang de --dev-split val --test-split test2016
    python -m training.train --run-dir runs/en-x --dataset ../shared/data/multi30k \\
        --source-lang en --target-lang de,fr,cs ...  # one model, three directions (training/languages.py)
"""

import argparse
import dataclasses
import os
import sys
import time

from keras_transformer.quiet import quiet_tensorflow

quiet_tensorflow()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer import TransformerConfig  # noqa: E402
from keras_transformer.search.flags import add_decoding_flags, decoding_settings  # noqa: E402
from training import backends, data, evaluate, files, languages, supervisor  # noqa: E402
from training.average_checkpoints import average_checkpoints  # noqa: E402
from training.flags import MODEL_FIELDS, add_flags, apply_preset_and_check, corpus_options  # noqa: E402
from training.run_folder import RunFolder, load_weights, step_of  # noqa: E402
from training.schedule import TransformerSchedule, paper_optimizer  # noqa: E402
from training.selection import Selection  # noqa: E402
from training.tokenized import TokenizedShards  # noqa: E402
from training.tokenizer import Tokenizer, train_sentencepiece  # noqa: E402


clock = time.perf_counter  # what training time is measured with (tests give it a fake)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser)
    add_decoding_flags(parser)
    args = parser.parse_args(argv)
    args.backend = args.backend or keras.config.backend()
    apply_preset_and_check(parser, args)
    if args.early_stop is not None and not (args.eval_every or args.eval_every_minutes):
        parser.error("--early-stop counts dev evaluations: give --eval-every or --eval-every-minutes")
    if args.processes != "auto" and not (args.processes.isdigit() and int(args.processes) > 0):
        parser.error(f"--processes must be auto or a positive number, got {args.processes!r}")
    if args.processes not in ("1", "auto"):
        if args.coordinator_address is None or args.process_id is None:
            parser.error(f"--processes {args.processes} needs --coordinator-address and --process-id (each process its own)")
        if not 0 <= args.process_id < int(args.processes):
            parser.error(f"--process-id {args.process_id} is not one of --processes {args.processes} (0 to {int(args.processes) - 1})")
    if args.processes != "1" and args.backend != "jax":
        parser.error("--processes is for the JAX backend; under TensorFlow, --strategy multiworker reads TF_CONFIG")
    return args


def get_tokenizer(run, text, vocab_size, is_chief, symbols=(), separate=False):
    """The run's tokenizer: loaded if the run folder has one, else trained on the sample of the
    training split that `text` (`shards.TextShards`) drew, with `symbols` (the tags of several
    target languages, which sources begin with) one piece each (by the chief, which the other
    processes wait for): one SentencePiece model of both sides, or with `separate` one a side."""
    if not is_chief:
        files.wait_for(run.tokenizer_path, "process 0 to train the tokenizer")
    if not tf.io.gfile.exists(run.tokenizer_path):
        start = time.perf_counter()
        pairs = text.sample()
        print(f"Training a SentencePiece tokenizer ({vocab_size:,} pieces at most) on {len(pairs):,} pairs sampled "
              f"from the {text.num_pairs:,} of the training split...", flush=True)  # fmt: skip
        if separate:
            tokenizer = Tokenizer(train_sentencepiece([source for source, _ in pairs], vocab_size, symbols=symbols),
                                  train_sentencepiece([target for _, target in pairs], vocab_size))  # fmt: skip
        else:
            tokenizer = Tokenizer(train_sentencepiece([sentence for pair in pairs for sentence in pair], vocab_size,
                                                      symbols=symbols))  # fmt: skip
        print(f"Trained the tokenizer in {time.perf_counter() - start:.0f} s.", flush=True)
        run.save_tokenizer(tokenizer)
        return tokenizer
    return run.load_tokenizer()


def initial_checkpoint(spec, run, is_chief, pairs):
    """`--init-from RUN[:CHECKPOINT]`: the origin a new run of `pairs` records (the source run,
    its checkpoint's path and step, the source's metrics of that checkpoint); the source's
    tokenizer copied into `run` by the chief. A run folder whose tokenizer differs from the
    source's is refused (ValueError), and so is a target language the source's vocabulary has no
    tag for, before anything is written."""
    path, _, name = spec.rpartition(":")
    if not path or not (name.isdigit() or name in ("latest", "averaged", "best")):  # a path with a colon (gs://...)
        path, name = spec, "latest"
    source = RunFolder(path)
    checkpoint = source.checkpoint(name)
    tokenizer = source.load_tokenizer()
    languages.tagging(pairs, tokenizer, source.tokenizer_path)
    if tf.io.gfile.exists(run.tokenizer_path):
        if run.load_tokenizer().digest() != tokenizer.digest():
            raise ValueError(f"--init-from {spec}: {run.tokenizer_path} is not the tokenizer of {path}; use a new --run-dir.")
    elif is_chief:
        run.save_tokenizer(tokenizer)
    metrics = source.metrics()
    of_checkpoint = {key: value for key, value in metrics.items() if "bleu" in key or "chrf" in key} \
        if metrics.get("checkpoint") == checkpoint else {}  # fmt: skip
    return {"run": path, "checkpoint": checkpoint, "step": step_of(checkpoint), "metrics": of_checkpoint}


def fine_tuned_config(source, config, given, spec):
    """The config of a run started from a model of config `source` (`--init-from spec`): the
    source's, with `config`'s (this command's) dropout, and its max_length where positions are
    sinusoids (no weight depends on it). Refuses (ValueError, naming each difference) model
    flags `given` ({field: value}, those on the command line) and a max_length of learned
    positions that differ from the source's."""
    free = {"dropout", "attention_dropout", "relu_dropout"}
    free |= {"max_length"} if source.positional_encoding != "learned" else set()
    asked = {**given, "max_length": config.max_length}
    if "num_layers" in asked:  # the shorthand for both depths
        depth = asked.pop("num_layers")
        asked = {"encoder_layers": depth, "decoder_layers": depth, **asked}
    differences = [f"{name}: {getattr(source, name)!r} there, {value!r} here" for name, value in sorted(asked.items())
                   if name not in free and getattr(source, name) != value]  # fmt: skip
    if differences:
        raise ValueError(f"--init-from {spec}: its model differs from the flags here ({'; '.join(differences)}). Leave "
                         "the model flags out: the model is the run's (and so is --max-length where positions are "
                         "learned).")  # fmt: skip
    return dataclasses.replace(source, **{name: getattr(config, name) for name in free})


def train(args, strategy=None):
    """Trains (or resumes) the run of `args` (from `parse_args`) under Keras' backend; returns
    (model, metrics). `strategy`, a tf.distribute strategy connected to its devices already,
    overrides `--strategy` (TensorFlow only)."""
    if args.backend != backends.current():
        raise ValueError(f"--backend {args.backend}, but Keras runs on {backends.current()}: set KERAS_BACKEND="
                         f"{args.backend} before Keras is imported (the command line does it for you).")  # fmt: skip
    decoding = decoding_settings(args)  # for the evaluations; checked before training
    backend = _create_backend(args, strategy)
    run = RunFolder(args.run_dir)
    setup = _set_up(args, run, backend)
    schedule = TransformerSchedule(setup.config.d_model, args.warmup_steps, args.learning_rate_scale)
    tokenized, iterator, train_seconds = _start(args, run, backend, setup, schedule)
    writers = {name: _log_writer(run, backend, name) for name in ("train", "dev")}
    selection = _selection(args, run)
    train_seconds, dropped, last_dev = _train_loop(args, run, backend, setup, schedule, iterator, train_seconds,
                                                   selection, decoding, writers)  # fmt: skip
    tokenized.close()
    backend.sync_model()
    averaged = _average(run, backend, args.average_last) if args.average_last else None
    backend.close()
    model, step = backend.model, backend.step
    metrics = {"steps": step, "train_seconds": round(train_seconds, 1), "dropped_pairs": dropped, "backend": backend.name}
    # Every process evaluates, so that none ends (and leaves JAX's runtime) while another works on.
    if not args.no_evaluate:
        metrics.update(_final_evaluation(args, run, backend, setup, decoding, selection, last_dev, writers["dev"], averaged))
    if not backend.is_chief:
        return model, None
    run.update_metrics(metrics)
    return model, metrics


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a run trains on and what it records.

    corpora: {(source, target): `data.Corpus`} of its pairs, in order.
    text: the training split's shards (`shards.TextShards`).
    tokenizer: its `Tokenizer`.
    tagged: whether each source starts with its target language's tag (training/languages.py).
    config: the model's `TransformerConfig`.
    settings: this segment's settings, as training.json records them.
    origin: `initial_checkpoint`'s record of --init-from, or None.
    changes: the changes a resume reports, [(name, old, new)].
    """

    corpora: dict
    text: object
    tokenizer: Tokenizer
    tagged: bool
    config: TransformerConfig
    settings: dict
    origin: dict | None
    changes: list


def _create_backend(args, strategy):
    """The backend of `--strategy` (or `strategy`), `--mixed-precision` and `--processes`."""
    processes = None
    if args.processes != "1":
        processes = {"coordinator_address": args.coordinator_address, "process_id": args.process_id,
                     "num_processes": None if args.processes == "auto" else int(args.processes),
                     **({"heartbeat_seconds": args.heartbeat_seconds} if args.heartbeat_seconds else {})}  # fmt: skip
    return backends.create(args.strategy, strategy, mixed_precision=args.mixed_precision, processes=processes)


def _set_up(args, run, backend):
    """The run's `Setup`: its corpora, the training split, the tokenizer (trained, or --init-from's),
    the model's config; a resume of another run refused (ValueError). Seeds every random number
    generator with --seed first (the batches' shuffles and the model's initial weights follow it)."""
    keras.utils.set_random_seed(args.seed)
    corpora = languages.load_corpora(args.dataset, args.source_lang, args.target_lang, args.pairs, **corpus_options(vars(args)))
    pairs = tuple(corpora)
    origin = initial_checkpoint(args.init_from, run, backend.is_chief, pairs) if args.init_from else None

    def training_split(tagged):
        return languages.training_split(corpora, run.text_dir, tagged=tagged, temperature=args.pair_temperature,
                                        sample_size=args.tokenizer_sample, seed=args.seed, cut=backend.is_chief,
                                        shares=backend.num_processes)  # fmt: skip

    text = training_split(tagged=len(pairs) > 1)  # a new tokenizer's sample
    tokenizer = get_tokenizer(run, text, args.vocab_size, backend.is_chief, symbols=languages.tags(pairs),
                              separate=args.separate_vocabularies)  # fmt: skip
    tagged = languages.tagging(pairs, tokenizer, run.tokenizer_path)
    if tagged and len(pairs) == 1:  # one pair of a run of several (--init-from): its sources tagged as they learned
        text = training_split(tagged=True)
    given = {name: getattr(args, name) for name in MODEL_FIELDS if getattr(args, name) is not None}
    overrides = {**given, "max_length": args.max_length}
    if not tokenizer.one_vocabulary:  # --separate-vocabularies, or a run of them (--init-from)
        overrides["source_vocab_size"] = tokenizer.source.vocab_size
    config = TransformerConfig.preset(args.config, tokenizer.target.vocab_size, **overrides)
    settings = {name: getattr(args, name) for name in vars(args)}
    settings.update(dataset=args.dataset, source_lang=pairs[0][0], target_lang=pairs[0][1], processes=backend.num_processes,
                    pairs=",".join(map(languages.pair_name, pairs)))  # fmt: skip
    if origin:  # the source's model; this command's flags give dropout and the training
        config = fine_tuned_config(RunFolder(origin["run"]).config(), config, given, args.init_from)
        resumed = run.segments()[0]["settings"] if tf.io.gfile.exists(run.settings_path) else {}
        settings["init_from"] = resumed.get("init_from", origin)  # a resume keeps the origin of its start
    changes = run.check_resume(config, settings)
    return Setup(corpora, text, tokenizer, tagged, config, settings, origin, changes)


def _start(args, run, backend, setup, schedule):
    """Builds and compiles the model (with --init-from's weights), starts the batches, restores
    the latest checkpoint and records the segment; returns (the tokenized split, which the end
    closes; the batches' iterator; the training seconds so far)."""
    say = _speaker(backend)
    config, origin = setup.config, setup.origin
    backend.build(config, lambda: paper_optimizer(schedule))
    if origin:  # a resume restores its own checkpoint below instead
        load_weights(backend.model, origin["checkpoint"])
    backend.compile(args.label_smoothing, jit_compile=not args.no_xla, accumulate_steps=args.accumulate_steps)
    tokenized, batches = _batches(args, run, backend, setup)
    iterator = iter(batches)
    latest, train_seconds = backend.restore(run, iterator, max(args.keep_checkpoints, args.average_last))
    step = backend.step
    if latest:
        say(f"Resumed from {latest} at step {step}.")
    elif origin:  # step 0: the source's weights and a fresh optimizer, the run's first checkpoint
        saved = backend.save(0, 0.0)
        say(f"Started from {origin['checkpoint']} (step {origin['step']} of {origin['run']}) with a fresh optimizer: "
            f"checkpoint {saved}.")  # fmt: skip
    for name, old, new in setup.changes:
        say(f"Resumed with {name} {new!r} (it was {old!r}): the run follows it from step {step} on.")
    if backend.is_chief:
        run.record_segment(config, setup.settings, step)
    return tokenized, iterator, train_seconds


def _batches(args, run, backend, setup):
    """(the tokenized split, which the end closes; this process' training batches). The first
    epoch tokenizes the split into shards while training reads them; each process its own share.
    Several processes agree on each batch's bucket through a schedule."""
    tokenized = TokenizedShards(setup.text, setup.tokenizer, run.tokenized_dir(setup.tokenizer), args.seed,
                                backend.process_index, backend.num_processes, show_progress=backend.is_chief)  # fmt: skip
    bucket_schedule = None
    batch_tokens = args.batch_tokens // backend.num_processes // args.accumulate_steps  # this process' rows of a batch
    max_length = setup.config.max_length
    if backend.num_processes > 1:
        bucket_schedule = data.bucket_schedule(setup.text, setup.tokenizer, batch_tokens=batch_tokens, max_length=max_length,
                                               num_shares=backend.num_processes)  # fmt: skip
    batches = data.training_batches(tokenized, batch_tokens=batch_tokens, max_length=max_length,
                                    batch_multiple=backend.local_replicas, schedule=bucket_schedule)  # fmt: skip
    return tokenized, batches


def _train_loop(args, run, backend, setup, schedule, iterator, train_seconds, selection, decoding, writers):
    """Trains from the backend's step to --steps (or --max-minutes, or an early stop of
    `selection`), with checkpoints, TensorBoard scalars (`writers`: "train" and "dev") and dev
    evaluations; returns (the training seconds, the pairs the last call dropped, (step, BLEU) of
    the last dev evaluation, or (None, None))."""
    say = _speaker(backend)
    step = backend.step
    progress = keras.utils.Progbar(args.steps, stateful_metrics=["loss", "lr", "tok/s"], unit_name="step",
                                   verbose=1 if backend.is_chief else 0)  # fmt: skip
    progress.update(step)
    dropped = 0
    out_of_time = lambda: args.max_minutes is not None and train_seconds >= 60 * args.max_minutes  # noqa: E731
    periods_evaluated = _periods(train_seconds, args.eval_every_minutes)
    periods_saved = _periods(train_seconds, args.checkpoint_every_minutes)
    stopped = lambda: selection is not None and selection.stop  # noqa: E731
    evaluated = bleu = None  # the step of the last dev evaluation, and its BLEU
    while step < args.steps and not out_of_time() and not stopped():
        boundary = min(args.steps, (step // args.checkpoint_every + 1) * args.checkpoint_every)
        num_steps = min(args.steps_per_call, boundary - step)
        start = clock()
        loss, tokens, dropped = backend.train_steps(iterator, num_steps)
        seconds = clock() - start
        train_seconds = backend.agree(train_seconds + seconds)  # process 0's clock decides for all
        step = backend.step
        learning_rate = float(keras.ops.convert_to_numpy(schedule(step)))  # the next update's
        progress.update(step, [("loss", loss), ("lr", learning_rate), ("tok/s", tokens / seconds)])
        with writers["train"].as_default(step=step):
            tf.summary.scalar("loss", loss)
            tf.summary.scalar("learning_rate", learning_rate)
            tf.summary.scalar("target_tokens_per_second", tokens / seconds)
            tf.summary.scalar("dropped_pairs", dropped)
            tf.summary.scalar("training_minutes", train_seconds / 60)  # the x axis of learning curves
        clock_periods = _periods(train_seconds, args.checkpoint_every_minutes)
        saved = step == boundary or out_of_time() or clock_periods > periods_saved
        if saved:
            periods_saved = clock_periods
            say(f"\nSaved checkpoint {backend.save(step, train_seconds)} at step {step}.")
        periods = _periods(train_seconds, args.eval_every_minutes)
        if step < args.steps and (args.eval_every and step % args.eval_every == 0 or periods > periods_evaluated):
            periods_evaluated, evaluated = periods, step
            backend.sync_model()
            bleu = _evaluate_dev(backend.model, setup.tokenizer, setup.corpora, setup.tagged, decoding, args.eval_sentences,
                                 writers["dev"], step, say)  # fmt: skip
            if selection is not None:
                _select(selection, run, backend, step, bleu, args.keep_best)
                if stopped() and not saved:  # the run ends here: its last checkpoint too
                    say(f"\nSaved checkpoint {backend.save(step, train_seconds)} at step {step}.")
    if stopped():
        kept = f", kept in {run.checkpoint('best')}" if args.keep_best else ""
        say(f"Stopped early at step {step}: {selection.since} dev evaluations without an improvement of at least "
            f"{args.min_delta}. The best: dev BLEU {selection.bleu} at step {selection.step}{kept}.")  # fmt: skip
    elif step < args.steps:
        say(f"Stopped at step {step} of {args.steps}: --max-minutes {args.max_minutes} reached.")
    if dropped:
        say(f"{dropped} training pairs longer than --max-length {setup.config.max_length} were dropped.")
    return train_seconds, dropped, (evaluated, bleu)


def _final_evaluation(args, run, backend, setup, decoding, selection, last_dev, dev_writer, averaged):
    """The metrics of the end: the dev BLEU (`last_dev`'s, (step, BLEU), if it is of the last
    step's model; else measured, and the last model may then be the best of `selection`) and the
    test split's BLEU, chrF and signatures, each pair's and their mean; the checkpoint evaluated,
    `averaged` (its path) or the last."""
    say = _speaker(backend)
    model, step, corpora, pairs = backend.model, backend.step, setup.corpora, tuple(setup.corpora)
    metrics = {}
    evaluated, bleu = last_dev
    if step == evaluated and not averaged:  # the last step's model was evaluated on the dev split already
        metrics["dev_bleu"] = bleu
    elif all(corpus.text_pairs("dev", 1) for corpus in corpora.values()):
        metrics["dev_bleu"] = _evaluate_dev(model, setup.tokenizer, corpora, setup.tagged, decoding, args.eval_sentences,
                                            dev_writer, step, say)  # fmt: skip
        if selection is not None and not selection.stop:  # the last model may be the best
            _select(selection, run, backend, step, metrics["dev_bleu"], args.keep_best)
    outputs = {pair: run.translations_path("test", pair) for pair in pairs} if backend.is_chief else None
    metrics.update(evaluate.evaluate_pairs(model, setup.tokenizer, corpora, "test", decoding, tagged=setup.tagged,
                                           output_paths=outputs))  # fmt: skip
    metrics["checkpoint"] = averaged or run.checkpoints()[-1][1]
    for name, of_pair in metrics.get("pairs", {}).items():
        say(f"{name}: test BLEU {of_pair['bleu']} (chrF {of_pair['chrf']}) on {of_pair['sentences']} sentences")
    mean = "Mean test BLEU" if len(pairs) > 1 else "Test BLEU"
    paper = f", the paper's tokenized BLEU {metrics['bleu_paper']}" if "bleu_paper" in metrics else ""
    say(f"{mean} {metrics['bleu']} (chrF {metrics['chrf']}{paper}) on {metrics['sentences']} sentences; {metrics['signature']}")
    return metrics


def _average(run, backend, last):
    """The paper's model (section 6.1): the mean of the last `last` checkpoints, written into
    DIR/averaged/ by process 0 and loaded into the backend's model by every process; its path."""
    if backend.is_chief:
        saved, paths = average_checkpoints(run.path, last)
        steps = ", ".join(str(step_of(path)) for path in paths)
        _speaker(backend)(f"Averaged the last {len(paths)} checkpoints (steps {steps}) into {saved}.")
    backend.agree(0.0)  # every process waits for the file
    saved = run.checkpoint("averaged")
    load_weights(backend.model, saved)
    return saved


def _selection(args, run):
    """The `Selection` of --keep-best and --early-stop, going on from the run's record; None
    without either."""
    if not (args.keep_best or args.early_stop):
        return None
    record = run.best()
    return Selection(args.early_stop, args.min_delta, record.get("bleu"), record.get("step"), record.get("since", 0))


def _speaker(backend):
    """`say(message)`: printed by process 0, which speaks for all."""

    def say(message):
        if backend.is_chief:
            print(message, flush=True)

    return say


def _log_writer(run, backend, name):
    """The TensorBoard writer of the run's logs/`name` (process 0's; the others' write nothing)."""
    return tf.summary.create_file_writer(os.path.join(run.log_dir, name)) if backend.is_chief else tf.summary.create_noop_writer()


def _select(selection, run, backend, step, bleu, keep_best):
    """Model selection after a dev evaluation (process 0's BLEU, so that all stop alike): the
    record written and, with `keep_best`, a new best's weights."""
    if selection.update(step, backend.agree(bleu)) and keep_best and backend.is_chief:
        run.record_best(selection.record(), backend.model)
    elif backend.is_chief:
        run.record_best(selection.record())


def _periods(seconds, minutes):
    """Whole periods of `minutes` in `seconds` (0 if `minutes` is 0)."""
    return int(seconds // (60 * minutes)) if minutes else 0


def _evaluate_dev(model, tokenizer, corpora, tagged, decoding, sentences, writer, step, say=print):
    """Dev BLEU on the first `sentences` of each pair's dev split (their mean for several pairs,
    each also in TensorBoard as bleu/SRC-TGT)."""
    metrics = evaluate.evaluate_pairs(model, tokenizer, corpora, "dev", decoding, tagged=tagged, limit=sentences, jit_compile=False)
    with writer.as_default(step=step):
        for key in ("bleu", "chrf"):
            tf.summary.scalar(key, metrics[key])
            for name, of_pair in metrics.get("pairs", {}).items():
                tf.summary.scalar(f"{key}/{name}", of_pair[key])
    each = "".join(f", {name} {of_pair['bleu']}" for name, of_pair in metrics.get("pairs", {}).items())
    say(f"step {step}: dev BLEU {metrics['bleu']} (chrF {metrics['chrf']}){each}")
    return metrics["bleu"]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.backend != keras.config.backend():  # Keras fixes its backend at import: start again under it
        os.execve(sys.executable, [sys.executable, "-m", "training.train", *argv],
                  {**os.environ, "KERAS_BACKEND": args.backend})  # fmt: skip
    if args.processes != "1" and not supervisor.is_supervised():  # a small process watches the training
        process_id = "auto" if args.process_id is None else str(args.process_id)
        os.execv(sys.executable, [sys.executable, "-m", "training.supervisor", args.run_dir, process_id, args.processes,
                                  "--", sys.executable, "-m", "training.train", *argv])  # fmt: skip
    try:
        train(args)
    except ValueError as error:
        sys.exit(f"error: {error}")
    except supervisor.LostProcess as lost:  # for the watching process, which says what to do
        sys.stdout.flush()
        print(lost.report(), file=sys.stderr, flush=True)
        os._exit(supervisor.EXIT_LOST)  # not sys.exit: JAX's exit handler would wait for the lost process


if __name__ == "__main__":
    main()
