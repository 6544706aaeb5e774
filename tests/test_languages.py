"""training/languages.py: the directions of --pairs, their corpora, the target-language tag, the
pairs' weights, several pairs' training splits as one, and their evaluation."""

import os

import numpy as np
import pytest
import tensorflow as tf

from training import evaluate
from training.languages import (
    MultilingualShards,
    languages,
    load_corpora,
    pair_weights,
    parse_pairs,
    requested_pairs,
    tag,
    tagged,
    tagging,
)
from training.shards import InMemoryShards
from training.tokenized import TokenizedShards
from training.tokenizer import Tokenizer, train_sentencepiece


def test_pairs_are_read_in_order_and_a_bad_entry_is_named():
    assert parse_pairs("en-de, de-en,en-fr") == (("en", "de"), ("de", "en"), ("en", "fr"))
    assert parse_pairs("en-zh_Hant") == (("en", "zh_Hant"),)
    for value, entry in [("en-de,ende", "'ende'"), ("en-de,en-", "'en-'"), ("en-en", "'en-en'"), ("EN-de", "'EN-de'"),
                         ("en-de-fr", "'en-de-fr'"), ("en-de,", "''")]:  # fmt: skip
        with pytest.raises(ValueError, match=f"--pairs: {entry} is not SRC-TGT"):
            parse_pairs(value)
    with pytest.raises(ValueError, match="--pairs: en-de is given twice"):
        parse_pairs("en-de,en-fr,en-de")


def test_a_tag_is_the_language_to_write_in_front_of_the_source_as_text_and_in_the_graph():
    assert tag("de") == "<2de>" and tagged("A dog.", "fr") == "<2fr> A dog."
    assert tagged(tf.constant(["A dog.", ""]), "cs").numpy().tolist() == [b"<2cs> A dog.", b"<2cs> "]


def test_pair_weights_follow_the_temperature_formula():
    sizes = [4_500_000, 36_000_000, 29_000]
    np.testing.assert_allclose(pair_weights(sizes), np.array(sizes) / sum(sizes))  # 1: proportional to size
    shares = np.array(sizes) / sum(sizes)
    for temperature in (2.0, 5.0):  # p_i proportional to (n_i / N) ** (1 / T), by hand
        expected = [share ** (1 / temperature) / sum(s ** (1 / temperature) for s in shares) for share in shares]
        np.testing.assert_allclose(pair_weights(sizes, temperature), expected)
    assert pair_weights(sizes, 5.0)[2] > 5 * pair_weights(sizes)[2]  # the small pair gains
    np.testing.assert_allclose(pair_weights(sizes, 1e9), [1 / 3] * 3, rtol=1e-6)  # evened out
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="--pair-temperature must be positive and finite"):
            pair_weights(sizes, bad)
    with pytest.raises(ValueError, match="every pair needs training pairs"):
        pair_weights([10, 0])


def _split(language, count, per_shard):
    pairs = [(f"source {i}", f"{language} {i}") for i in range(count)]
    return InMemoryShards(pairs, pairs_per_shard=per_shard)


def test_several_pairs_read_as_one_split_each_source_tagged_with_its_target_language():
    shards = MultilingualShards({("en", "de"): _split("de", 5, 2), ("en", "cs"): _split("cs", 3, 2)})
    assert shards.shard_sizes == [2, 2, 1, 2, 1] and shards.num_pairs == 8
    assert [shards.pair_of(i) for i in range(5)] == [("en", "de")] * 3 + [("en", "cs")] * 2
    read = [(s.decode(), t.decode()) for i in range(5) for s, t in shards.pairs(i).as_numpy_iterator()]
    expected = [(f"<2{lang}> source {i}", f"{lang} {i}") for lang, count in (("de", 5), ("cs", 3)) for i in range(count)]
    assert read == expected


def test_the_tokenizer_sample_takes_as_many_pairs_of_each_spread_over_it():
    big, small = _split("de", 1000, 100), _split("cs", 30, 100)
    sample = MultilingualShards({("en", "de"): big, ("en", "cs"): small}, sample_size=40).sample()
    sources = [source for source, _ in sample]
    assert sum(s.startswith("<2de> ") for s in sources) == 20 == sum(s.startswith("<2cs> ") for s in sources)
    numbers = sorted(int(target.split()[1]) for _, target in sample if target.startswith("de "))
    assert numbers[0] < 100 and numbers[-1] > 900  # the big pair's over its whole sample, not its first 20
    assert len(MultilingualShards({("en", "de"): big, ("en", "cs"): small}, sample_size=1000).sample()) == 500 + 30


def test_a_tag_is_one_piece_of_a_vocabulary_that_declares_it():
    sentences = [tagged(s, lang) for s in ("a dog sees a cat", "the red car", "hello world") for lang in ("de", "fr")] * 50
    tokenizer = Tokenizer(train_sentencepiece(sentences, 60, symbols=[tag("de"), tag("fr")]))
    pieces = tokenizer.source.pieces(tokenizer.source.tokenize(tf.constant(["<2de> a dog", "<2fr> the car"])).to_tensor()).numpy()
    assert [row[1] for row in pieces] == [b"<2de>", b"<2fr>"]  # after SentencePiece's word boundary
    assert tokenizer.source.detokenize(tokenizer.source.tokenize(tf.constant(["<2fr> the car"]))).numpy().tolist() == [b"<2fr> the car"]


def test_an_epoch_reads_each_pair_as_often_as_its_weight_asks(tmp_path):
    splits = {("en", "de"): _split("de", 40, 4), ("en", "cs"): _split("cs", 4, 4)}
    assert MultilingualShards(splits).pair_reads == {("en", "de"): 1, ("en", "cs"): 1}  # 1: as the sizes give
    # T = 2: weights 0.76 and 0.24 (pair_weights), for 40 and 4 pairs: the small one 3.2 times as often a pair.
    assert MultilingualShards(splits, temperature=2.0).pair_reads == {("en", "de"): 1, ("en", "cs"): 3}
    shards = MultilingualShards(splits, temperature=1e9)  # evened out: half of an epoch each
    assert shards.pair_reads == {("en", "de"): 1, ("en", "cs"): 10}
    tokenizer = Tokenizer(train_sentencepiece([t for pair in shards.sample() for t in pair], 60, symbols=[tag("de"), tag("cs")]))
    tokenized = TokenizedShards(shards, tokenizer, str(tmp_path / "tokenized"))
    try:
        epoch = [target for _, target in tokenized.dataset().take(80).as_numpy_iterator()]  # 40 + 10 x 4 pairs
    finally:
        tokenized.close()
    targets = tokenizer.target.detokenize(tf.ragged.constant(epoch)).numpy()
    assert sum(t.startswith(b"de ") for t in targets) == 40 == sum(t.startswith(b"cs ") for t in targets)
    assert len(set(targets)) == 44  # every pair, the small one's ten times each
    assert sorted(os.listdir(tmp_path / "tokenized")) == [f"shard-{i:05d}.tfrecord" for i in range(11)]  # each written once


def test_the_flags_ask_for_one_direction_or_several_and_a_bad_request_is_named():
    assert requested_pairs("en", "de") is None and requested_pairs() is None  # one: the dataset's, as before
    assert requested_pairs("en", "de, fr,cs") == (("en", "de"), ("en", "fr"), ("en", "cs"))
    assert requested_pairs(pairs="en-de,de-en") == (("en", "de"), ("de", "en"))
    for flags, message in [
        (dict(source_lang="en", pairs="en-de"), "--pairs names every language: give it without --source-lang"),
        (dict(target_lang="de,fr"), "--target-lang de,fr needs --source-lang"),
        (dict(source_lang="en", target_lang="de,FR"), "--target-lang: 'FR' is not a language code"),
        (dict(source_lang="en", target_lang="de,de"), "--target-lang: en-de is given twice"),
        (dict(pairs="en_de"), "--pairs: 'en_de' is not SRC-TGT"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            requested_pairs(**flags)


def _write(folder, pairs, target, splits=("train", "val")):
    folder.mkdir(parents=True, exist_ok=True)
    for split in splits:
        for side, lang in enumerate(("en", target)):
            (folder / f"{split}.{lang}").write_text("".join(pair[side] + "\n" for pair in pairs))


def test_several_pairs_come_from_the_built_in_corpus_a_folder_its_subfolders_and_tfds(synthetic_corpus, tmp_path):
    import tensorflow_datasets as tfds

    built_in = load_corpora("synthetic", "en", "de,qaa")
    assert list(built_in) == [("en", "de"), ("en", "qaa")]
    german, capitals = (corpus.text_pairs("test", 50) for corpus in built_in.values())
    assert [s for s, _ in german] == [s for s, _ in capitals] and [t.upper() for _, t in german] == [t for _, t in capitals]
    assert german == synthetic_corpus.text_pairs("test", 50)  # the one-pair corpus is unchanged

    pairs = synthetic_corpus.text_pairs("train", 6)
    _write(tmp_path / "data", pairs, "de")
    _write(tmp_path / "data" / "en-fr", [(s, "fr: " + t) for s, t in pairs], "fr")  # a pair's own folder
    corpora = load_corpora(str(tmp_path / "data"), pairs="en-de,en-fr", dev_split="val")
    assert corpora[("en", "fr")].train_files[1] == str(tmp_path / "data" / "en-fr" / "train.fr")
    assert [t for _, t in corpora[("en", "fr")].text_pairs("dev")] == ["fr: " + t for _, t in pairs]
    assert corpora[("en", "de")].text_pairs("dev") == pairs
    missing = tmp_path / "data" / "val.cs"  # the first file of the pair read
    with pytest.raises(ValueError, match=f"The pair en-cs: {missing} does not exist"):
        load_corpora(str(tmp_path / "data"), "en", "de,cs", dev_split="val")

    with tfds.testing.mock_data(num_examples=4, data_dir=str(tmp_path / "tfds")):
        wmt = load_corpora("tfds:wmt14_translate", pairs="en-de,en-fr")  # each pair from its config
        assert [corpus.name for corpus in wmt.values()] == ["tfds:wmt14_translate/de-en", "tfds:wmt14_translate/fr-en"]
        assert len(wmt[("en", "fr")].text_pairs("dev", 2)) == 2


def test_the_pair_temperature_flag_sets_each_pairs_share_of_the_epoch_that_training_reads(tmp_path, monkeypatch):
    """training.train, from its flags to the training split it reads (stopped there): of 40 en-de
    pairs and 4 en-fr, an epoch reads the en-fr ones once each as their sizes give (T = 1), and
    3 times each at T = 2 (`pair_weights`; `test_an_epoch_reads_each_pair_as_often_as_its_weight_asks`
    reads such an epoch)."""
    import training.train as train_module

    class Split(Exception):
        pass

    def stop(run, text, *args, **kwargs):  # the split whose sample the tokenizer would learn from
        raise Split(text)

    monkeypatch.setattr(train_module, "get_tokenizer", stop)
    for target, count in (("de", 40), ("fr", 4)):
        _write(tmp_path / "data" / f"en-{target}", [(f"s{i}", f"{target}{i}") for i in range(count)], target, ("train",))
    for extra, fr_reads in (([], 1), (["--pair-temperature", "2"], 3)):
        args = train_module.parse_args(["--run-dir", str(tmp_path / f"run{len(extra)}"), "--dataset", str(tmp_path / "data"),
                                        "--pairs", "en-de,en-fr", "--strategy", "cpu", *extra])  # fmt: skip
        with pytest.raises(Split) as split:
            train_module.train(args)
        (text,) = split.value.args
        assert isinstance(text, MultilingualShards)
        assert text.pair_reads == {("en", "de"): 1, ("en", "fr"): fr_reads}


def test_a_vocabulary_of_several_pairs_holds_their_tags_and_refuses_a_language_it_lacks():
    sentences = ["a dog sees a cat", "the red car", "hello world"] * 50
    several = Tokenizer(train_sentencepiece(sentences, 60, symbols=[tag("de"), tag("qaa")]))
    one = Tokenizer(train_sentencepiece(sentences, 60))
    assert languages(several) == ("de", "qaa") and languages(one) == ()
    assert tagging([("en", "qaa")], several, "A")  # one pair of a run of several: still tagged
    assert not tagging([("en", "de")], one, "B")  # a run of one pair, as ever
    with pytest.raises(ValueError, match=r"The vocabulary of A has the tags of de, qaa: it lacks <2fr>"):
        tagging([("en", "de"), ("en", "fr")], several, "A")
    with pytest.raises(ValueError, match=r"The vocabulary of B has no language tags \(a run of one pair\): it lacks <2de>, <2fr>"):
        tagging([("en", "de"), ("en", "fr")], one, "B")


def test_several_pairs_are_evaluated_each_its_sources_tagged_beside_their_mean(monkeypatch, tmp_path):
    corpora = load_corpora("synthetic", "en", "de,qaa")

    def translator(model, tokenizer, settings, jit_compile=True):  # the target of each pair, read off its tag
        references = {tagged(s, lang): t for (_, lang), c in corpora.items() for s, t in c.text_pairs("dev", 20)}
        return lambda sources: ([references.get(s, "?") if i % 2 else "?" for i, s in enumerate(sources)], [0.0] * len(sources))

    monkeypatch.setattr(evaluate, "make_translator", translator)
    paths = {pair: str(tmp_path / f"{pair[1]}.txt") for pair in corpora}
    metrics = evaluate.evaluate_pairs(None, None, corpora, "dev", tagged=True, limit=20, output_paths=paths)
    each = metrics["pairs"]
    assert list(each) == ["en-de", "en-qaa"] and each["en-de"]["sentences"] == 20 and metrics["sentences"] == 40
    assert 0 < each["en-qaa"]["bleu"] < 100 and metrics["bleu"] == round((each["en-de"]["bleu"] + each["en-qaa"]["bleu"]) / 2, 2)
    assert metrics["chrf"] == round((each["en-de"]["chrf"] + each["en-qaa"]["chrf"]) / 2, 2)
    assert metrics["signature"] == each["en-de"]["signature"] and "bleu_paper" not in metrics  # qaa has none
    assert (tmp_path / "qaa.txt").read_text().splitlines()[1] == corpora[("en", "qaa")].text_pairs("dev", 2)[1][1]
    one = evaluate.evaluate_pairs(None, None, {("en", "de"): corpora[("en", "de")]}, "dev", limit=20)
    assert "pairs" not in one and one["bleu"] == 0.0  # untagged sources: not among the references


def test_the_mean_over_pairs_is_their_plain_mean_whatever_their_sentence_counts(monkeypatch):
    """A pair of 2 dev sentences weighs as much in the mean (what --keep-best and --early-stop
    compare) as one of 12: here one translated perfectly, the other not at all."""
    from training.data import Corpus

    pairs = load_corpora("synthetic", "en", "de")[("en", "de")].text_pairs("dev", 14)
    corpora = {("en", "de"): Corpus("big", "en", "de", pairs={"dev": pairs[:12]}),
               ("en", "qaa"): Corpus("small", "en", "qaa", pairs={"dev": pairs[12:]})}  # fmt: skip
    perfect = dict(pairs[:12])  # the big pair's sources translated as referenced; the small pair's not at all
    translator = lambda sources: ([perfect.get(s, "?") for s in sources], [0.0] * len(sources))  # noqa: E731
    monkeypatch.setattr(evaluate, "make_translator", lambda *args, **kwargs: translator)
    metrics = evaluate.evaluate_pairs(None, None, corpora, "dev")
    assert metrics["pairs"]["en-de"]["sentences"] == 12 and metrics["pairs"]["en-qaa"]["sentences"] == 2
    assert [metrics["pairs"][name]["bleu"] for name in ("en-de", "en-qaa")] == [100.0, 0.0]
    assert metrics["bleu"] == 50.0  # not 12 / 14 of 100
    assert metrics["chrf"] == round((metrics["pairs"]["en-de"]["chrf"] + metrics["pairs"]["en-qaa"]["chrf"]) / 2, 2)


@pytest.mark.slow
def test_a_run_of_two_targets_resumes_records_each_pairs_dev_bleu_and_keeps_the_best_mean(artifacts):
    """The shared two-target run, stopped at step 60 and resumed: its evaluations at 40 and 80."""
    from artifacts import MULTILINGUAL_STOP
    from training.learning_curve import read_scalars
    from training.run_folder import RunFolder

    run, resumed = RunFolder(artifacts.multilingual_run), artifacts.output("multilingual")
    assert f"Resumed from {run.path}/checkpoints/ckpt-{MULTILINGUAL_STOP} at step {MULTILINGUAL_STOP}." in resumed
    printed = artifacts.output("multilingual-start") + resumed
    dev = read_scalars(os.path.join(run.log_dir, "dev"))
    assert sorted(dev["bleu"]) == [40, 80] and set(dev) >= {"bleu/en-de", "bleu/en-qaa", "chrf/en-qaa"}
    for step, mean in dev["bleu"].items():  # each evaluation's mean of the two, as printed
        assert mean == pytest.approx((dev["bleu/en-de"][step] + dev["bleu/en-qaa"][step]) / 2, abs=0.006)
        assert f"step {step}: dev BLEU {mean:g}" in printed and f"en-qaa {dev['bleu/en-qaa'][step]:g}" in printed
    assert max(dev["bleu"].values()) > 0  # it learns: the best is not a tie of zeros
    best_step = max(dev["bleu"], key=dev["bleu"].get)
    assert run.best()["step"] == best_step and run.best()["bleu"] == pytest.approx(dev["bleu"][best_step])  # the mean's
    assert run.checkpoint("best").endswith(f"ckpt-{best_step}.weights.h5")


@pytest.mark.slow
def test_the_served_target_language_selects_the_language_as_the_library_with_its_tag(artifacts, capsys, monkeypatch):
    from conftest import loaded_export, warmup_requests
    from export import translate as command
    from export.layout import read_metadata
    from export.signatures import SIGNATURES
    from keras_transformer.search import DecodingSettings
    from training.evaluate import make_translator
    from training.run_folder import RunFolder

    export_dir = artifacts.exports["multilingual"]
    assert {key: read_metadata(export_dir)[key] for key in ("pairs", "target_languages", "target_lang")} == {
        "pairs": ["en-de", "en-qaa"], "target_languages": ["de", "qaa"], "target_lang": "de"}  # fmt: skip
    served = loaded_export(export_dir)
    for declared in SIGNATURES:  # every signature takes it in an export of several
        assert "target_language" in served.signatures[declared.name].structured_input_signature[1], declared.name
    run = RunFolder(artifacts.multilingual_run)
    sources = [source for source, _ in run.load_corpus().text_pairs("test", 8)]
    model, _ = run.load_model()
    library = make_translator(model, run.load_tokenizer(), DecodingSettings(), jit_compile=False)
    text = tf.constant(sources)
    results = {}
    for language in ("de", "qaa"):
        result = served.translate(text, target_language=tf.constant([language]))
        results[language] = [t.decode() for t in result["translation"].numpy()]
        expected, scores = library([tagged(source, language) for source in sources])
        assert results[language] == expected
        np.testing.assert_allclose(result["score"].numpy(), scores, rtol=1e-4)
    assert sum(t == t.upper() for t in results["qaa"]) >= 6 and not any(t == t.upper() for t in results["de"])
    omitted = served.translate(text)["translation"].numpy()
    assert [t.decode() for t in omitted] == results["de"]  # the export's first language
    mixed = served.translate(text, target_language=tf.constant(["qaa", "de"] * 4))["translation"].numpy()
    assert [t.decode() for t in mixed] == [results[("qaa", "de")[i % 2]][i] for i in range(8)]
    # The score signature reads a translation as written in the language it is given.
    qaa = tf.constant(results["qaa"])
    as_qaa, as_de = (served.score(text, qaa, target_language=tf.constant([lang]))["log_prob"].numpy() for lang in ("qaa", "de"))
    assert np.all(as_qaa > as_de)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"target_language must be one of the target languages of "
                       r"this export \(de, qaa\); unknown:\] \[fr\]"):  # fmt: skip
        served.n_best(text[:2], tf.constant([1, 1]), target_language=tf.constant(["de", "fr"]))

    from bench.real_serving import measure_ours, test_pairs

    asked = {}  # the warm-up requests TF Serving runs first: each signature's ask for each language
    for name, inputs in warmup_requests(export_dir):
        asked[name] = asked.get(name, set()) | set(inputs["target_language"].numpy().tolist())
    assert asked == {declared.name: {b"de", b"qaa"} for declared in SIGNATURES}
    monkeypatch.setattr(command, "use_serving_threads", lambda: None)
    monkeypatch.setattr(tf.saved_model, "load", loaded_export)  # the loads below: this one
    pairs = test_pairs(artifacts.multilingual_run, 4)  # bench.real_serving's sentences: each pair's in turn
    assert [language for _, _, language in pairs] == ["de", "qaa"] * 4 and pairs[0][0] == pairs[1][0] == sources[0]
    measured, _, _ = measure_ours(export_dir, [source for source, _, _ in pairs], 4, False, [lang for _, _, lang in pairs])
    assert measured == [results[language][i // 2] for i, (_, _, language) in enumerate(pairs)]
    command.main([export_dir, *sources[:2], "--to", "qaa"])
    assert capsys.readouterr().out.splitlines() == results["qaa"][:2]
    with pytest.raises(SystemExit, match=f"--to fr: {export_dir} writes de, qaa"):
        command.main([export_dir, sources[0], "--to", "fr"])


@pytest.mark.slow
def test_a_run_of_two_targets_fine_tunes_onto_one_of_new_data_and_refuses_a_language_it_lacks(artifacts, tmp_path):
    """--init-from the two-target run onto en -> qaa from a folder of other sentences: its sources
    keep the tag the model learned; onto en -> fr, whose tag the vocabulary lacks: refused before
    anything is written."""
    import glob

    from training import records, synthetic
    from training.recipes import MECHANICS
    from training.run_folder import RunFolder
    from training.train import parse_args, train

    splits = synthetic.generate_splits(seed=7, train=300, dev=4, test=4)
    for side, lang in ((0, "en"), (1, "qaa"), (1, "fr")):  # new sentences; "fr", the German again
        for split, pairs in splits.items():
            write = str.upper if lang == "qaa" else str
            (tmp_path / f"{split}.{lang}").write_text("".join(write(pair[side]) + "\n" for pair in pairs))
    flags = [*MECHANICS, "--steps", "2", "--checkpoint-every", "2", "--steps-per-call", "2", "--encoder-layers", "2",
             "--decoder-layers", "2", "--no-evaluate", "--no-xla", "--dataset", str(tmp_path), "--source-lang", "en",
             "--init-from", artifacts.multilingual_run]  # fmt: skip  (the recipe's depths)
    tuned = RunFolder(str(tmp_path / "tuned"))
    train(parse_args(["--run-dir", tuned.path, *flags, "--target-lang", "qaa"]))
    assert tuned.pairs() == (("en", "qaa"),) and [step for step, _ in tuned.checkpoints()] == [0, 2]
    tokenizer = tuned.load_tokenizer()
    (shard,) = glob.glob(os.path.join(tuned.path, "data", "tokenized-*", "shard-00000.tfrecord"))
    source, _ = records.decode(next(iter(tf.data.TFRecordDataset(shard))))
    assert tokenizer.source.pieces(source[:2]).numpy().tolist() == [b"\xe2\x96\x81", b"<2qaa>"]  # as the model learned it
    assert tuned.targets() == {"qaa": "<2qaa> "}  # its export tags each source so too

    refused = tmp_path / "refused"
    with pytest.raises(ValueError, match=r"The vocabulary of .*multilingual/tokenizer.model has the tags of de, qaa: "
                       r"it lacks <2fr>"):  # fmt: skip
        train(parse_args(["--run-dir", str(refused), *flags, "--target-lang", "fr"]))
    assert not refused.exists()
