import dataclasses
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import ACCUMULATION_CONFIG, accumulation_batches, assert_accumulation_is_exact
from keras_transformer import Transformer, TransformerConfig
from keras_transformer.search import greedy_search
from training import data
from training.run_folder import RunFolder
from training.backends.tensorflow import Trainer
from training.schedule import TransformerSchedule, paper_optimizer
from training.train import parse_args


def _small_config(tokenizer, dropout=0.0):
    return TransformerConfig.tiny(tokenizer.target.vocab_size, d_model=64, d_ff=128, dropout=dropout, max_length=24)


def _trainer(config, strategy=None, weights=None, warmup_steps=40, scale=1.0, label_smoothing=0.1, optimizer=paper_optimizer,
             accumulate_steps=1, jit_compile=True):  # fmt: skip
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        model = Transformer(config)
        if weights is not None:
            model.set_weights(weights)
        optimizer = optimizer(TransformerSchedule(config.d_model, warmup_steps, scale))
        optimizer.build(model.trainable_variables)
    return Trainer(model, optimizer, strategy, label_smoothing, jit_compile, accumulate_steps)


def _flat(weights):
    return np.concatenate([np.ravel(w) for w in weights])


@pytest.fixture(scope="module")
def mirrored():
    """One MirroredStrategy over the two logical CPUs for the module: two strategies in one process
    number their collectives alike, and the second's clash with the first's shapes."""
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


@pytest.mark.parametrize("jit_compile", [False, pytest.param(True, marks=pytest.mark.slow)])  # XLA compiles 4 shapes
def test_an_update_from_accumulated_batches_is_the_update_of_their_union(tmp_path, jit_compile, request):
    """On one device; compiled by XLA, a+b accumulated over two devices (MirroredStrategy) too,
    against the one device's updates of a, b and their union."""
    from backend_worker import batches_in_turn

    paths, tokens = accumulation_batches(tmp_path)
    config = TransformerConfig(**ACCUMULATION_CONFIG)
    start = Transformer(config).get_weights()

    def update(name, strategy=None):  # SGD: an update is the learning rate times the gradient
        trainer = _trainer(config, strategy, start, warmup_steps=10, optimizer=keras.optimizers.SGD,
                           accumulate_steps=2 if name == "a+b" else 1, jit_compile=jit_compile)  # fmt: skip
        trainer.train_steps(iter(batches_in_turn(paths[name])), tf.constant(1))
        return _flat(trainer.model.get_weights())

    updated = {name: update(name) for name in paths}
    assert_accumulation_is_exact(updated, _flat(start), tokens, atol=2e-6)
    if jit_compile:
        two_devices = update("a+b", request.getfixturevalue("mirrored"))
        assert_accumulation_is_exact({**updated, "a+b": two_devices}, _flat(start), tokens, atol=2e-6)


def test_the_schedule_counts_updates_not_batches(tmp_path):
    from backend_worker import batches_in_turn

    paths, _ = accumulation_batches(tmp_path)
    config = TransformerConfig(**ACCUMULATION_CONFIG)
    start = Transformer(config).get_weights()
    runs = {}
    for name, accumulate_steps in (("a+b", 2), ("union", 1)):
        trainer = _trainer(config, None, start, warmup_steps=10, optimizer=keras.optimizers.SGD,
                           accumulate_steps=accumulate_steps, jit_compile=False)  # fmt: skip
        iterator = iter(batches_in_turn(paths[name]))
        trainer.train_steps(iterator, tf.constant(3))
        runs[name] = trainer
    accumulated, union = runs["a+b"], runs["union"]
    assert int(accumulated.optimizer.iterations) == int(union.optimizer.iterations) == 3
    # The three updates took the schedule's rates at steps 1, 2 and 3 (not 1, 3 and 5, as they
    # would if it counted batches), as the union's did.
    np.testing.assert_allclose(_flat(accumulated.model.get_weights()), _flat(union.model.get_weights()), rtol=0, atol=5e-6)


@pytest.mark.slow
def test_a_tiny_model_overfits_8_pairs(synthetic_corpus, synthetic_tokenizer, tokenize):
    def tokens(text):
        return len(synthetic_tokenizer.source.tokenize(text))

    # Eight pairs of one bucket (length 8): every batch holds each of them twice.
    pairs = [p for p in synthetic_corpus.text_pairs("train", 400) if tokens(p[0]) < 8 and tokens(p[1]) < 8][:8]
    corpus = data.Corpus("eight", "en", "de", pairs={"train": pairs})
    batches = data.training_batches(tokenize(corpus, synthetic_tokenizer), batch_tokens=16 * 8, max_length=16, shuffle_buffer=8)
    # No label smoothing, so that a memorised batch has a loss near 0.
    trainer = _trainer(_small_config(synthetic_tokenizer), label_smoothing=0.0)
    iterator = iter(batches)
    first_loss, _, _ = trainer.train_steps(iterator, tf.constant(1))
    loss, _, _ = trainer.train_steps(iterator, tf.constant(300))
    assert float(loss) < 0.1 * float(first_loss)

    sources = [list(ids) + [3] for ids in synthetic_tokenizer.source.tokenize(tf.constant([p[0] for p in pairs])).to_list()]
    source_ids = tf.ragged.constant(sources).to_tensor()
    result = greedy_search(trainer.model, source_ids, max_length_b=10)
    translations = [t.decode() for t in synthetic_tokenizer.target.detokenize(result.tokens).numpy()]
    assert translations == [p[1] for p in pairs]


@pytest.mark.slow
def test_mirrored_strategy_equals_one_device(synthetic_corpus, synthetic_tokenizer, tokenize, mirrored):
    config = _small_config(synthetic_tokenizer)
    batches = data.training_batches(tokenize(synthetic_corpus, synthetic_tokenizer), batch_tokens=256, max_length=24,
                                    batch_multiple=2)  # fmt: skip
    batch = next(iter(batches))
    halves = np.split(batch["target_output"].numpy(), 2)
    assert np.sum(halves[0] != 0) != np.sum(halves[1] != 0), "the replicas should see different token counts"
    weights = Transformer(config).get_weights()

    results = []
    for strategy in (tf.distribute.get_strategy(), mirrored):
        trainer = _trainer(config, strategy, weights)
        iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
        losses = [float(trainer.train_steps(iterator, tf.constant(1))[0]) for _ in range(3)]
        results.append((losses, trainer.model.get_weights()))
    (single_losses, single_weights), (mirrored_losses, mirrored_weights) = results
    np.testing.assert_allclose(mirrored_losses, single_losses, rtol=1e-5)
    # Key biases get no gradient in theory (softmax ignores a shift), so Adam turns float noise
    # into updates of up to ~1e-5 there: hence the absolute tolerance.
    for mirrored, single in zip(mirrored_weights, single_weights):
        np.testing.assert_allclose(mirrored, single, rtol=1e-4, atol=5e-5)
    assert not np.allclose(single_weights[0], weights[0])


@pytest.mark.slow
def test_the_step_is_traced_once_across_buckets(synthetic_corpus, synthetic_tokenizer, tokenize):
    trainer = _trainer(_small_config(synthetic_tokenizer), jit_compile=False)  # tracing is before XLA
    batches = data.training_batches(tokenize(synthetic_corpus, synthetic_tokenizer), batch_tokens=256, max_length=24)
    shapes = {tuple(batch["source"].shape) for batch in batches.take(12)}
    assert len(shapes) > 1, "the batches should come from several buckets"
    iterator = iter(batches)
    for _ in range(3):
        trainer.train_steps(iterator, tf.constant(4))
    assert trainer.train_steps.experimental_get_tracing_count() == 1
    assert trainer.loss_and_gradients.experimental_get_tracing_count() == 1


def test_a_resume_refuses_another_run_reports_what_changes_the_math_and_keeps_each_segment(tmp_path):
    run = RunFolder(str(tmp_path))
    settings = {"backend": "tensorflow", "dataset": "synthetic", "source_lang": "en", "target_lang": "de", "seed": 0,
                "pairs": "en-de", "pair_temperature": 1.0, "processes": 1, "warmup_steps": 400, "learning_rate_scale": 1.0,
                "separate_vocabularies": False, "dropout": None, "steps": 10}  # fmt: skip
    assert run.check_resume(TransformerConfig.tiny(100), settings) == []  # a new run folder
    run.record_segment(TransformerConfig.tiny(100), settings, 0, now="t0")
    assert run.check_resume(TransformerConfig.tiny(100), {**settings, "steps": 20}) == []  # may change, unreported
    changed = {**settings, "warmup_steps": 100, "dropout": 0.3, "steps": 20}
    assert run.check_resume(TransformerConfig.tiny(100, dropout=0.3), changed) == [("dropout", 0.1, 0.3), ("warmup_steps", 400, 100)]
    run.record_segment(TransformerConfig.tiny(100, dropout=0.3), changed, 10, now="t1")
    assert run.segments() == [{"started": "t0", "step": 0, "settings": settings}, {"started": "t1", "step": 10, "settings": changed}]
    assert run.settings() == changed and run.config().dropout == 0.3
    with pytest.raises(ValueError, match=r"holds a different run \(d_model: 128 in .*config.json, 256 now"):
        run.check_resume(TransformerConfig.tiny(100, d_model=256, dropout=0.3), changed)
    with pytest.raises(ValueError, match=r"decoder_layers: 2 in .*config.json, 1 now"):
        run.check_resume(TransformerConfig.tiny(100, decoder_layers=1, dropout=0.3), changed)
    with pytest.raises(ValueError, match=r"dataset: 'synthetic' in .*training.json, 'tfds:x' now"):
        run.check_resume(TransformerConfig.tiny(100, dropout=0.3), {**changed, "dataset": "tfds:x"})
    with pytest.raises(ValueError, match=r"pairs: 'en-de' in .*training.json, 'en-de,en-qaa' now"):
        run.check_resume(TransformerConfig.tiny(100, dropout=0.3), {**changed, "pairs": "en-de,en-qaa"})
    with pytest.raises(ValueError, match=r"pair_temperature: 1.0 in .*training.json, 5.0 now"):  # the mix of the data
        run.check_resume(TransformerConfig.tiny(100, dropout=0.3), {**changed, "pair_temperature": 5.0})
    with pytest.raises(ValueError, match=r"separate_vocabularies: False in .*training.json, True now"):  # the tokenizer
        run.check_resume(TransformerConfig.tiny(100, dropout=0.3), {**changed, "separate_vocabularies": True})
    with pytest.raises(ValueError, match=r"processes: 1 in .*training.json, 2 now\).*\(and number of processes\)"):
        run.check_resume(TransformerConfig.tiny(100, dropout=0.3), {**changed, "processes": 2})
    with pytest.raises(ValueError, match=r"trained under tensorflow .* resume it with KERAS_BACKEND=tensorflow"):
        run.check_resume(TransformerConfig.tiny(100, dropout=0.3), {**changed, "backend": "jax"})


def test_a_run_folder_of_older_code_reads_as_one_segment_with_the_defaults_of_settings_added_since(tmp_path):
    run = RunFolder(str(tmp_path))
    old = {"dataset": "synthetic", "source_lang": "en", "target_lang": "de", "seed": 0, "warmup_steps": 400}
    config = TransformerConfig.tiny(100).to_dict()
    config["num_layers"] = config.pop("encoder_layers")  # one depth for both stacks, as recorded then
    del config["decoder_layers"]
    run.write_json(run.config_path, config)
    run.write_json(run.settings_path, old)  # flat, without backend and processes (recorded since)
    assert run.segments() == [{"started": None, "step": 0, "settings": old}]
    assert run.settings() == {**old, "backend": "tensorflow", "processes": 1, "learning_rate_scale": 1.0,
                              "pair_temperature": 1.0, "pairs": "en-de", "separate_vocabularies": False}  # fmt: skip
    assert run.check_resume(TransformerConfig.tiny(100), run.settings()) == []


def test_the_corpus_rows_are_load_corpus_keywords_and_a_run_folder_loads_the_corpus_they_recorded(tmp_path):
    import inspect

    from training import flags

    assert list(inspect.signature(data.load_corpus).parameters) == ["dataset", "source_lang", "target_lang",
                                                                    *flags.corpus_options({})]  # fmt: skip
    folder = tmp_path / "data"
    folder.mkdir()
    for prefix in ("train", "val", "test", "held"):
        for lang in ("en", "de"):
            (folder / f"{prefix}.{lang}").write_text(f"{prefix} {lang}\n")
    args = parse_args(["--run-dir", str(tmp_path / "run"), "--dataset", str(folder), "--source-lang", "en",
                       "--target-lang", "de", "--dev-split", "val", "--test-split", "held"])  # fmt: skip
    run = RunFolder(args.run_dir)
    run.record_segment(TransformerConfig.tiny(100), {**vars(args), "pairs": "en-de"}, 0)
    (corpus,) = run.load_corpora().values()
    assert (corpus.text_pairs("dev"), corpus.text_pairs("test")) == ([("val en", "val de")], [("held en", "held de")])


BAD_FLAGS = [
    (["--config", "huge"], "--config 'huge': choose tiny, small, multi30k, multi30k_shallow, base, big"),
    (["--steps", "0"], "--steps must be positive, got 0"),
    (["--max-minutes", "-1"], "--max-minutes must be positive, got -1.0"),
    (["--accumulate-steps", "0"], "--accumulate-steps must be positive, got 0"),
    (["--checkpoint-every-minutes", "-5"], "--checkpoint-every-minutes must be 0 (none) or positive, got -5.0"),
    (["--decoder-layers", "0"], "--decoder-layers must be positive, got 0"),
    (["--encoder-layers", "-1"], "--encoder-layers must be positive, got -1"),
    (["--activation", "gelu"], "--activation: invalid choice: 'gelu' (choose from 'relu', 'swish')"),
]


def test_bad_flags_are_named(capsys):
    for flags, message in BAD_FLAGS:
        with pytest.raises(SystemExit):
            parse_args(["--run-dir", "x", *flags])
        assert message in capsys.readouterr().err
    assert parse_args(["--run-dir", "x", "--config", "base"]).batch_tokens == 25000


def test_each_flag_row_gives_its_flag_its_check_and_its_resume_rule(tmp_path, monkeypatch, capsys):
    from training import flags

    # Every checked flag refuses a value outside its check, naming it and the check's words.
    for flag in flags.FLAGS:
        if flag.check is not None:
            bad = 0 if flag.check is flags.POSITIVE else -1
            with pytest.raises(SystemExit):
                parse_args(["--run-dir", "x", flag.flag, str(bad)])
            assert f"{flag.flag} must be {flag.check[0]}, got {flag.type(bad)}" in capsys.readouterr().err
    # A new flag that a resume reports is its row: parsed, recorded, reported when it changes, and
    # read as its `recorded` value from a run folder written before it existed.
    knob = flags.Flag("knob", float, 1.0, "a new setting", flags.POSITIVE, flags.REPORTED, recorded=1.0)
    monkeypatch.setattr(flags, "FLAGS", (*flags.FLAGS, knob))
    assert parse_args(["--run-dir", "x", "--knob", "2"]).knob == 2.0
    run, config = RunFolder(str(tmp_path)), TransformerConfig.tiny(100)
    settings = {"backend": "tensorflow", "dataset": "synthetic", "source_lang": "en", "target_lang": "de", "seed": 0}
    run.record_segment(config, settings, 0, now="t0")  # written before the knob existed
    resumed = run.settings()
    assert resumed["knob"] == 1.0 and run.check_resume(config, resumed) == []
    assert run.check_resume(config, {**resumed, "knob": 3.0}) == [("knob", 1.0, 3.0)]
    monkeypatch.setattr(flags, "FLAGS", (*flags.FLAGS[:-1], dataclasses.replace(knob, resume=flags.REFUSED)))
    with pytest.raises(ValueError, match=r"holds a different run \(knob: 1.0 in .*training.json, 3.0 now"):
        run.check_resume(config, {**resumed, "knob": 3.0})


def test_the_process_flags_and_heartbeat_reach_jax_distributed_initialize(tmp_path, monkeypatch):
    import jax

    from training import backends
    from training.backends.jax import HEARTBEAT_SECONDS
    from training.train import train

    class Joined(Exception):
        pass

    def initialize(*args, **kwargs):  # where the real one would join the coordinator
        raise Joined(args, kwargs)

    monkeypatch.setattr(backends, "current", lambda: "jax")
    monkeypatch.setattr(jax.config, "update", lambda *args: None)
    monkeypatch.setattr(jax.distributed, "initialize", initialize)
    flags = ["--run-dir", str(tmp_path), "--backend", "jax", "--processes", "2", "--coordinator-address",
             "127.0.0.1:1234", "--process-id", "1"]  # fmt: skip
    for extra, heartbeat in (([], HEARTBEAT_SECONDS), (["--heartbeat-seconds", "7"], 7)):
        with pytest.raises(Joined) as joined:
            train(parse_args([*flags, *extra]))
        assert joined.value.args == (("127.0.0.1:1234", 2, 1), {"heartbeat_timeout_seconds": heartbeat})


@pytest.mark.slow
def test_schedule_smoothing_and_model_flags_reach_the_optimizer_the_loss_and_the_model(tmp_path, monkeypatch):
    import training.backends.tensorflow as tensorflow_backend
    import training.train as train_module

    optimizers, smoothings = [], []
    original_loss = tensorflow_backend.smoothed_cross_entropy

    def recording_optimizer(schedule):
        optimizers.append(paper_optimizer(schedule))
        return optimizers[-1]

    def recording_loss(labels, logits, smoothing):
        smoothings.append(smoothing)
        return original_loss(labels, logits, smoothing)

    monkeypatch.setattr(tensorflow_backend, "smoothed_cross_entropy", recording_loss)
    monkeypatch.setattr(train_module, "paper_optimizer", recording_optimizer)
    flags = ["--run-dir", str(tmp_path), "--steps", "3", "--steps-per-call", "3", "--batch-tokens", "256", "--max-length", "16",
             "--vocab-size", "200", "--no-evaluate", "--strategy", "cpu", "--warmup-steps", "7",
             "--learning-rate-scale", "3.5", "--label-smoothing", "0.25", "--encoder-layers", "2", "--decoder-layers", "1",
             "--d-model", "48",
             "--num-heads", "3", "--d-ff", "40", "--dropout", "0.2", "--attention-dropout", "0.05",
             "--relu-dropout", "0.15", "--no-xla"]  # fmt: skip
    model, _ = train_module.train(parse_args(flags))
    shape = dict(encoder_layers=2, decoder_layers=1, d_model=48, num_heads=3, d_ff=40, dropout=0.2, attention_dropout=0.05, relu_dropout=0.15)
    assert {name: getattr(model.config, name) for name in shape} == shape
    assert RunFolder(str(tmp_path)).config() == model.config
    (layer,) = model.decoder.layers
    assert (layer.feed_forward.dropout, layer.self_attention.dropout, layer.dropout) == (0.15, 0.05, 0.2)
    (optimizer,) = optimizers
    d_model = model.config.d_model
    # After 3 updates Keras evaluates the schedule at iterations = 3, that is step_num 4 (section 5.3).
    expected = 3.5 * d_model**-0.5 * min(4**-0.5, 4 * 7**-1.5)
    np.testing.assert_allclose(float(optimizer.learning_rate), expected, rtol=1e-6)
    assert int(optimizer.iterations) == 3
    assert smoothings and set(smoothings) == {0.25}


def test_metrics_updates_on_a_filesystem_that_is_not_posix_keep_the_earlier_values():
    """ram:// stands in for a bucket, where os.path sees no file: each command's update of
    metrics.json (training.train, training.evaluate, training.average_checkpoints) adds to it."""
    path = "ram://runs/metrics-kept"
    RunFolder(path).update_metrics({"bleu": 40.1, "steps": 8})
    RunFolder(path).update_metrics({"averaged_checkpoints": ["ckpt-4", "ckpt-8"]})
    RunFolder(path).update_metrics({"bleu": 40.5})
    with tf.io.gfile.GFile(RunFolder(path).metrics_path) as f:
        assert json.load(f) == {"bleu": 40.5, "steps": 8, "averaged_checkpoints": ["ckpt-4", "ckpt-8"]}


# What `python -m training.train --run-dir DIR` reads on the one-corpus path (the built-in corpus,
# seed 0): the tokenizer's sample, the pieces it learns from it, and the first batches, as
# digests. They are the digests of the code before several language pairs could be trained: a
# change to them changes what every run of one corpus learns from. To change them on purpose,
# take the new digests from this test's failure and say why in the commit.
ONE_CORPUS_DIGESTS = {"sample": "0cd97c4afaf5d7b2", "pieces": "00ba48e76c1746b0", "batches": "0ab2ba785d595a7e"}
DIGESTED_BATCHES = 5


def test_a_run_of_one_corpus_samples_tokenizes_and_batches_as_it_always_has(tmp_path, monkeypatch):
    import hashlib
    import types

    import training.train as train_module

    def digest(chunks):
        hashed = hashlib.sha256()
        for chunk in chunks:
            hashed.update(chunk)
        return hashed.hexdigest()[:16]

    args = parse_args(["--run-dir", str(tmp_path)])
    one_process = types.SimpleNamespace(is_chief=True, process_index=0, num_processes=1, local_replicas=1)
    monkeypatch.setattr(train_module, "print", lambda *a, **k: None, raising=False)  # the tokenizer's progress lines
    setup = train_module._set_up(args, RunFolder(args.run_dir), one_process)
    tokenized, batches = train_module._batches(args, RunFolder(args.run_dir), one_process, setup)
    try:
        first = [batch for _, batch in zip(range(DIGESTED_BATCHES), batches)]
    finally:
        tokenized.close()
    pieces = [piece.encode() for piece in setup.tokenizer.target.piece_list()]
    digests = {
        "sample": digest(["\n".join(f"{source}\t{target}" for source, target in setup.text.sample()).encode()]),
        "pieces": digest([b"\n".join(pieces)]),
        "batches": digest(chunk for batch in first for key in ("source", "target_input", "target_output")
                          for chunk in (str(batch[key].shape).encode(), batch[key].numpy().astype(np.int32).tobytes())),
    }  # fmt: skip
    assert digests == ONE_CORPUS_DIGESTS
