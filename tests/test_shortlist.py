"""The vocabulary shortlist's search (keras_transformer/search/shortlist.py): candidates, and every
search over them against references that see the whole vocabulary."""

import itertools

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf

from conftest import SCORE_TOLERANCE
from keras_transformer import BOS_ID, EOS_ID, PAD_ID, TransformerConfig
from keras_transformer.search import beam_search, decode, sample_search
from keras_transformer.search import DecodingSettings, Execution
from keras_transformer.search.shortlist import candidates, most_candidates, search_over, to_candidates, to_vocabulary
from search_helpers import _forward, _length_penalty, _model, _sources

VOCAB = 12


def _table(rows):
    """A lexical table `[VOCAB, 3]` from {source token: [candidates]}."""
    table = np.zeros((VOCAB, 3), "int32")
    for source, targets in rows.items():
        table[source, : len(targets)] = targets
    return table


TABLE = _table({4: [6, 7], 5: [8], 6: [6, 9, 10], 11: [5]})
ALWAYS = np.array([4], "int32")


def test_candidates_are_the_sorted_union_of_the_sources_rows_the_always_list_specials_and_forced_tokens():
    sources = np.array([[4, 11, 0], [5, 0, 0]], "int32")
    vocabulary = candidates(sources, TABLE, ALWAYS, forced=np.array([[9, 0], [0, 0]]))
    expected = sorted({0, 1, 2, 3} | {4} | {6, 7, 5} | {8} | {9})
    assert np.asarray(vocabulary).tolist() == expected
    # Padded with 0 (padding, never chosen) to a minimum; the specials keep their ids.
    padded = np.asarray(candidates(sources[1:], TABLE, ALWAYS, minimum=8)).tolist()
    assert padded == [0, 1, 2, 3, 4, 8, 0, 0]
    assert np.asarray(to_candidates(np.array([[8, 3, 0, 7]]), np.array(padded))).tolist() == [[5, 3, 0, -1]]
    # A static size (XLA's), the most these sources can have: the same, padded.
    size = most_candidates(sources.shape, TABLE.shape[1], len(ALWAYS), VOCAB)
    static = candidates(sources, TABLE, ALWAYS, forced=np.array([[9, 0], [0, 0]]), size=size)
    assert size == VOCAB and np.asarray(static).tolist() == expected + [0] * (size - len(expected))
    assert np.asarray(to_vocabulary(np.array([[5, 4, 0]]), np.array(padded))).tolist() == [[8, 4, 0]]


# Sources `[2, 3]` whose rows and the always list hold 4 + 3 + 2 * 3 * 2 = 19 different ids, as many
# as `most_candidates` allows them: the specials, the always list and the vocabulary's 12 highest.
BOUND_VOCAB, BOUND_ALWAYS = 64, np.array([4, 5, 6], "int32")
BOUND_SOURCES = np.array([[10, 11, 12], [13, 14, 15]], "int32")
BOUND_TABLE = np.zeros((BOUND_VOCAB, 2), "int32")
BOUND_TABLE[10:16] = np.stack([np.arange(52, 58), np.arange(58, 64)], axis=1)
BOUND_CANDIDATES = [0, 1, 2, 3, 4, 5, 6, *range(52, 64)]


def test_a_request_with_as_many_candidates_as_the_static_bound_keeps_every_one():
    size = most_candidates(BOUND_SOURCES.shape, BOUND_TABLE.shape[1], len(BOUND_ALWAYS), BOUND_VOCAB)
    static = candidates(BOUND_SOURCES, BOUND_TABLE, BOUND_ALWAYS, size=size)
    assert np.asarray(static).tolist() == BOUND_CANDIDATES  # the highest ids too, and no padding: the bound is reached
    assert size == len(BOUND_CANDIDATES) < BOUND_VOCAB
    # Beyond it (a forced token, which the export never gives with a static size): `size` ids, the
    # lowest, as `candidates` orders them: the highest are left out, hence a bound counting every kind.
    beyond = candidates(BOUND_SOURCES, BOUND_TABLE, BOUND_ALWAYS, forced=np.array([[7], [0]]), size=size)
    assert np.asarray(beyond).tolist() == [*BOUND_CANDIDATES[:7], 7, *BOUND_CANDIDATES[7:-1]]


def test_the_export_bounds_a_static_requests_candidates_by_its_table_and_always_list(monkeypatch):
    """The served search of a request of a static shape (XLA's; eager here, whose shapes are
    static too) over a shortlist: its candidates are every one of the request's. (Ids in, ids
    out: no tokenizer.)"""
    from export import serving

    chosen = []

    def spied(*args, **kwargs):
        chosen.append(candidates(*args, **kwargs))
        return chosen[-1]

    monkeypatch.setattr(serving, "candidates", spied)
    model = _model(BOUND_VOCAB, seed=25)
    translator = serving.Translator(model, None, languages={"de": ""}, shortlist=(BOUND_TABLE, BOUND_ALWAYS))
    result = translator._decode(decode, tf.constant(BOUND_SOURCES), DecodingSettings(max_length_b=2),
                                execution=serving.SERVED_EXECUTION)  # fmt: skip
    (vocabulary,) = chosen
    assert np.asarray(vocabulary).tolist() == BOUND_CANDIDATES
    assert set(np.asarray(result.tokens).ravel().tolist()) <= set(BOUND_CANDIDATES)


class _Masked:
    """A `DecodingModel` that wraps a model and bans every token outside `vocabulary` (a set of
    ids) with `NEG_INF` over the whole vocabulary: the reference the shortlist's search must
    equal."""

    def __init__(self, model, vocabulary):
        self.model, self.config, self.encode = model, model.config, model.encode
        self.reorder_cache, self.init_cache = model.reorder_cache, model.init_cache
        self.banned = tf.constant([[0.0 if i in vocabulary else -1e9 for i in range(model.config.vocab_size)]])

    def decode_step(self, token_ids, index, cache):
        logits, cache = self.model.decode_step(token_ids, index, cache)
        return logits + self.banned, cache


def _exhaustive_best(model, source, vocabulary, max_length, alpha):
    """The best output over `vocabulary`'s tokens, every hypothesis scored by full forward passes
    with the log-softmax over those tokens alone."""
    allowed = sorted(set(vocabulary) - {PAD_ID})
    body = [t for t in allowed if t != EOS_ID]
    hypotheses = [[*middle, last] for length in range(1, max_length + 1)
                  for middle in itertools.product(body, repeat=length - 1)
                  for last in (allowed if length == max_length else [EOS_ID])]  # fmt: skip
    inputs = np.zeros((len(hypotheses), max_length), "int32")
    for row, hypothesis in enumerate(hypotheses):
        inputs[row, : len(hypothesis)] = [BOS_ID, *hypothesis[:-1]]
    logits = np.asarray(_forward(model)(np.repeat(source[None], len(hypotheses), axis=0), inputs))[..., allowed]
    log_probs = np.asarray(tf.nn.log_softmax(logits))  # over the candidates alone
    place = {token: i for i, token in enumerate(allowed)}
    scored = [(sum(log_probs[row, i, place[t]] for i, t in enumerate(h)) / _length_penalty(len(h), alpha),
               [t for t in h if t != EOS_ID]) for row, h in enumerate(hypotheses)]  # fmt: skip
    return max(scored, key=lambda pair: pair[0])


def test_a_wide_beam_over_the_candidates_finds_the_exhaustive_best_over_them(rng):
    model = _model(VOCAB, seed=21)
    sources = np.array([[11, 4, 0], [5, 0, 0]], "int32")
    vocabulary = candidates(sources, TABLE, ALWAYS, minimum=2 * 24)
    ids = set(np.asarray(vocabulary).tolist())
    result = search_over(vocabulary, beam_search, model, sources, DecodingSettings(beam_size=24, alpha=0.6), max_length=3)
    for row, source in enumerate(sources):
        score, output = _exhaustive_best(model, source, ids, 3, 0.6)
        tokens = np.asarray(result.tokens[row])
        assert list(tokens[tokens != PAD_ID]) == output
        np.testing.assert_allclose(result.scores[row], score, rtol=1e-4)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_every_search_equals_the_full_vocabularys_with_the_other_tokens_banned(beam_size, rng):
    """Greedy, beam and n-best searches, with a token sequence to suppress (one of candidates,
    one with a token that is none: it bans nothing) and a target prefix outside the sources'
    candidates, which still starts the output."""
    model = _model(40, seed=22)
    table = rng.integers(4, 40, size=(40, 3)).astype("int32")
    sources = _sources(rng, [5, 3, 6, 2], 40)
    prefix = np.array([[39, 38], [0, 0], [38, 0], [0, 0]], "int32")
    vocabulary = candidates(sources, table, np.array([4, 5, 6], "int32"), forced=prefix, minimum=8)
    ids = set(np.asarray(vocabulary).tolist())
    assert {38, 39} <= ids and len(ids) < 35
    outside = next(t for t in range(4, 40) if t not in ids)
    inside = sorted(ids - {0, 1, 2, 3, 38, 39})[:2]
    settings = DecodingSettings(beam_size=beam_size, max_length_b=6, num_hypotheses=beam_size,
                         suppress_sequences=((inside[0], inside[1]), (outside, inside[0])))  # fmt: skip
    ours = search_over(vocabulary, decode, model, sources, settings, prefix)
    reference = decode(_Masked(model, ids), sources, settings, target_prefix=prefix)
    np.testing.assert_array_equal(ours.tokens, reference.tokens)
    np.testing.assert_allclose(ours.scores, reference.scores, **SCORE_TOLERANCE)
    tokens = np.asarray(ours.tokens)
    assert set(tokens.flatten()) <= ids
    assert tokens[0, 0, :2].tolist() == [39, 38] and tokens[2, 0, 0] == 38


@pytest.mark.slow
def test_under_xla_the_candidates_of_a_static_size_give_the_graphs_translations(rng):
    model = _model(40, seed=24)
    table = rng.integers(4, 40, size=(40, 2)).astype("int32")
    sources = _sources(rng, [5, 3], 40)
    settings = DecodingSettings(max_length_b=4, suppress_sequences=((7, 8),))

    def search(ids, size, execution):
        vocabulary = candidates(ids, table, np.array([4, 5], "int32"), minimum=8, size=size)
        return search_over(vocabulary, decode, model, ids, settings, execution=execution)

    graph = search(sources, None, Execution.choose(compiled=False, platform="cpu"))
    size = most_candidates(sources.shape, 2, 2, 40)
    compiled = tf.function(lambda ids: search(ids, size, Execution.choose(compiled=True, platform="cpu")), jit_compile=True)
    xla = compiled(tf.constant(sources))
    lengths = np.sum(np.asarray(graph.tokens) != PAD_ID, axis=1)
    for row, length in enumerate(lengths):
        np.testing.assert_array_equal(np.asarray(xla.tokens)[row, :length], np.asarray(graph.tokens)[row, :length])
    np.testing.assert_allclose(xla.scores, graph.scores, rtol=1e-4)


def test_with_every_token_a_candidate_the_search_is_the_full_one(rng):
    model = _model(30, seed=23)
    sources = _sources(rng, [4, 6, 1], 30)
    vocabulary = np.arange(30, dtype="int32")
    settings = DecodingSettings(max_length_b=5)
    ours = search_over(vocabulary, decode, model, sources, settings)
    full = decode(model, sources, settings)
    np.testing.assert_array_equal(ours.tokens, full.tokens)
    np.testing.assert_array_equal(ours.scores, full.scores)
    draw = lambda m, ids, s, target_prefix: sample_search(m, ids, np.array([1, 2, 3]), s, num_samples=2)  # noqa: E731
    samples = search_over(vocabulary, draw, model, sources, settings)
    np.testing.assert_array_equal(samples.tokens, sample_search(model, sources, np.array([1, 2, 3]), settings,
                                                                num_samples=2).tokens)  # fmt: skip


def _ibm1_by_hand(pairs, iterations):
    """IBM Model 1 as Brown et al. (1993) state it, over dicts: t(f | e) for each target f and
    source e (with the empty word 0) of a sentence pair."""
    t = {(e, f): 1.0 for source, target in pairs for e in [0, *source] for f in target}
    for _ in range(iterations):
        count, total = {}, {}
        for source, target in pairs:
            for f in target:
                norm = sum(t[e, f] for e in [0, *source])
                for e in [0, *source]:
                    count[e, f] = count.get((e, f), 0.0) + t[e, f] / norm
                    total[e] = total.get(e, 0.0) + t[e, f] / norm
        t = {(e, f): value / total[e] for (e, f), value in count.items()}
    return t


def test_ibm_model_1_gives_the_probabilities_of_the_textbook_algorithm_and_ranks_the_translation_first(rng):
    from training import shortlist as lexical

    vocab, words = 40, list(range(4, 16))  # source word w translates to target word w + 20
    pairs = []
    for _ in range(300):
        source = rng.choice(words, size=rng.integers(2, 6), replace=False)
        pairs.append((source.astype(np.int64), (source[rng.permutation(len(source))] + 20).astype(np.int64)))
    keys, probabilities = lexical.ibm1(pairs, vocab, iterations=3)
    expected = _ibm1_by_hand([(s.tolist(), t.tolist()) for s, t in pairs], 3)
    assert sorted(expected) == [(int(k // vocab), int(k % vocab)) for k in keys]
    np.testing.assert_allclose(probabilities, [expected[int(k // vocab), int(k % vocab)] for k in keys], rtol=1e-5)
    table = lexical.lexical_table(keys, probabilities, vocab, candidates=2)
    assert all(table[w][0] == w + 20 for w in words)


def test_a_runs_table_maps_each_source_piece_to_the_target_pieces_it_translates_to(tmp_path, rng):
    """`learn` on a run folder of a hand-made corpus: eight source words, each translated by its
    own target word, in sentences of two to four words shuffled on the target side. Each source
    word's row is itself and then its translation (not the other way round: a target word's row
    is itself alone), and the always list is of target words."""
    import sentencepiece

    from training import shortlist as lexical
    from training.run_folder import RunFolder
    from training.tokenizer import Tokenizer, train_sentencepiece

    words = dict(zip(["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen"],
                     ["uno", "dos", "tres", "cuatro", "cinco", "seis", "siete", "ocho"]))  # fmt: skip
    pairs = []
    for _ in range(300):
        source = rng.choice(list(words), size=rng.integers(2, 5), replace=False)
        pairs.append((" ".join(source), " ".join(words[w] for w in rng.permutation(source))))
    data = tmp_path / "data"
    data.mkdir()
    for side, language in enumerate(("en", "xx")):
        (data / f"train.{language}").write_text("".join(pair[side] + "\n" for pair in pairs))
    run = RunFolder(str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    run.save_tokenizer(Tokenizer(train_sentencepiece([text for pair in pairs for text in pair], 80)))
    settings = {"dataset": str(data), "source_lang": "en", "target_lang": "xx", "pairs": "en-xx", "seed": 0,
                "dev_split": "dev", "test_split": "test"}  # fmt: skip
    run.record_segment(TransformerConfig.tiny(80), settings, 0)
    lexical.learn(run.path, candidates=3, always=4)
    pieces = sentencepiece.SentencePieceProcessor(model_file=run.tokenizer_path)
    table, always = lexical.read(run.shortlist_path, pieces)

    def row(word):
        return [pieces.id_to_piece(int(i)) for i in table[pieces.piece_to_id("\u2581" + word)] if i != PAD_ID]

    for source, target in words.items():
        assert row(source)[:2] == ["\u2581" + source, "\u2581" + target]
        assert row(target) == ["\u2581" + target]
    assert {pieces.id_to_piece(int(i)) for i in always} < {"\u2581" + target for target in words.values()}


def test_a_table_of_another_vocabulary_is_refused_with_its_file_and_line(tmp_path, synthetic_sentencepiece):
    import sentencepiece

    from training import shortlist as lexical

    pieces = sentencepiece.SentencePieceProcessor(model_file=None, model_proto=synthetic_sentencepiece)
    path = tmp_path / "shortlist.txt"
    path.write_text("\t▁der ▁die\n▁dog\t▁dog ▁Hund\n")
    table, always = lexical.read(str(path), pieces)
    assert always.tolist() == [pieces.piece_to_id("▁der"), pieces.piece_to_id("▁die")]
    assert table[pieces.piece_to_id("▁dog")].tolist() == [pieces.piece_to_id("▁dog"), pieces.piece_to_id("▁Hund")]
    path.write_text("\t▁der\n▁dog\t▁Hund ▁Zzyzx\n")
    with pytest.raises(ValueError, match=r"shortlist.txt, line 2: '▁Zzyzx' is not a piece of the run's vocabulary"):
        lexical.read(str(path), pieces)


@pytest.mark.slow
def test_an_export_with_a_shortlist_learns_the_runs_table_and_serves_the_librarys_shortlist_search(artifacts, tmp_path,
                                                                                                   capsys):  # fmt: skip
    """The suite's run, copied (the table is written into the run folder), exported with one
    search a request (a request's candidates are then its sentences' together) and XLA for one
    sentence of at most 24 pieces: larger requests run the graph."""
    import json
    import shutil

    import sentencepiece

    from conftest import assert_stock_cpu_graph, loaded_export
    from export import ctranslate2 as conversion
    from export.saved_model import export
    from export.xla import CompiledShapes
    from training import shortlist as lexical
    from training.run_folder import RunFolder

    run_dir = str(tmp_path / "run")
    shutil.copytree(artifacts.tf_run, run_dir)
    path = export(run_dir, str(tmp_path / "exports"), DecodingSettings(beam_size=4), searches=1, shortlist="run",
                  compiled_shapes=CompiledShapes(batch_sizes=(1,), source_lengths=(24,)))  # fmt: skip
    assert "has no shortlist yet: learning one from its training split" in capsys.readouterr().out
    assert_stock_cpu_graph(path, xla=True)  # TF Serving's stock binary runs its graph
    run = RunFolder(run_dir)
    with open(f"{path}/assets/metadata.json") as f:
        recorded = json.load(f)["shortlist"]
    assert recorded["file"] == run.shortlist_path and recorded["learned"]["pairs"] > 1000
    pieces = sentencepiece.SentencePieceProcessor(model_file=run.tokenizer_path)
    table, always = lexical.read(run.shortlist_path, pieces)
    assert len(always) == lexical.ALWAYS and table.shape == (pieces.get_piece_size(), lexical.CANDIDATES + 1)

    sentences = [source for source, _ in run.load_corpus().text_pairs("test", 12)]
    tokenizer, (model, _) = run.load_tokenizer(), run.load_model()
    ids = tokenizer.encode_source(tf.constant(sentences)).to_tensor()
    vocabulary = candidates(ids, table, always, minimum=8)
    expected = search_over(vocabulary, decode, model, ids, DecodingSettings(beam_size=4))
    loaded = tf.saved_model.load(path)
    served = loaded.translate(tf.constant(sentences))
    assert served["translation"].numpy().tolist() == tokenizer.target.detokenize(expected.tokens).numpy().tolist()
    np.testing.assert_allclose(served["score"], expected.scores, **SCORE_TOLERANCE)
    assert len(np.asarray(vocabulary)) < pieces.get_piece_size() / 2  # the test scores fewer tokens
    # Against the whole vocabulary's export on the test split, a sentence a request (its own
    # candidates alone): nearly always the same translation, and the same BLEU within a point.
    sources, references = (list(side) for side in zip(*run.load_corpus().text_pairs("test", 200)))
    full = loaded_export(artifacts.exports[4]).translate(tf.constant(sources))["translation"].numpy()
    shortlisted = [loaded.translate(tf.constant([source]))["translation"].numpy()[0] for source in sources]
    assert np.mean([a == b for a, b in zip(shortlisted, full)]) >= 0.9
    bleu = lambda translations: sacrebleu.corpus_bleu([t.decode() for t in translations], [references]).score  # noqa: E731
    assert abs(bleu(shortlisted) - bleu(full)) <= 1.0, (bleu(shortlisted), bleu(full))
    # bench.real_serving's count of a request's candidates: requests of 5 sentences, counted in sets.
    from bench.real_serving import mean_candidates

    counts = [len({0, 1, 2, 3, *always.tolist(), *table[np.asarray(ids[begin : begin + 5]).ravel()].ravel().tolist()})
              for begin in range(0, len(sentences), 5)]  # fmt: skip
    assert mean_candidates(run_dir, sentences, 5) == (pytest.approx(np.mean(counts)), pieces.get_piece_size())

    # A prefix of a piece that no candidate of the source is starts the output; score is the
    # full vocabulary's, as the export without a shortlist scores.
    outside = next(i for i in range(4, pieces.get_piece_size())
                   if i not in set(np.asarray(candidates(ids[:1], table, always)).tolist()) and pieces.id_to_piece(i).startswith("▁"))  # fmt: skip
    prefix = pieces.decode([outside])
    prefixed = loaded.prefix(text=tf.constant(sentences[:1]), prefix=tf.constant([prefix]))["translation"].numpy()[0]
    assert prefixed.decode().startswith(prefix)
    target = tf.constant(["Der Hund sieht die Katze."])
    full = loaded_export(artifacts.exports[4]).score(text=tf.constant(sentences[:1]), target=target)
    np.testing.assert_array_equal(loaded.score(text=tf.constant(sentences[:1]), target=target)["log_prob"], full["log_prob"])
    best = loaded.n_best(text=tf.constant(sentences[:2]), n=tf.constant([2, 2]))["translations"].numpy()
    assert best[:, 0].tolist() == served["translation"].numpy()[:2].tolist()

    # One sentence runs compiled, over as many candidates as a source of its compiled shape may
    # have, padded; it translates as the library's search does.
    one = ids[:1, : int(np.sum(np.asarray(ids[0]) != PAD_ID))]
    expected = search_over(candidates(one, table, always, minimum=8), decode, model, one, DecodingSettings(beam_size=4))
    served = loaded.translate(tf.constant(sentences[:1]))
    assert served["translation"].numpy().tolist() == tokenizer.target.detokenize(expected.tokens).numpy().tolist()
    np.testing.assert_allclose(served["score"], expected.scores, rtol=1e-4)

    # A table of another vocabulary is refused by its flag, file and line.
    bad = tmp_path / "bad.txt"
    bad.write_text("\t▁der\n▁dog\t▁Zzyzx\n")
    with pytest.raises(ValueError, match=r"--shortlist .*bad.txt, line 2: '▁Zzyzx' is not a piece"):
        export(run_dir, str(tmp_path / "exports"), shortlist=str(bad))

    # The CTranslate2 export carries the table as its vocabulary map.
    if conversion.available():
        import ctranslate2

        out = conversion.export(run_dir, str(tmp_path / "ct2"))
        with open(f"{out}/vmap.txt") as f, open(run.shortlist_path) as g:
            assert f.read() == g.read()
        translator = ctranslate2.Translator(out, device="cpu")
        results = translator.translate_batch(pieces.encode(sentences, out_type=str), beam_size=4, use_vmap=True)
        assert all(set(pieces.piece_to_id(p) for p in r.hypotheses[0]) <= set(np.asarray(vocabulary).tolist()) for r in results)
