import collections
import re

import sacrebleu

from training.synthetic import NOUNS, VERBS, generate_splits


def test_deterministic_for_a_seed():
    assert generate_splits(seed=3, train=50, dev=5, test=5) == generate_splits(seed=3, train=50, dev=5, test=5)
    assert generate_splits(seed=3, train=50, dev=5, test=5) != generate_splits(seed=4, train=50, dev=5, test=5)


def test_splits_are_disjoint_and_sized():
    splits = generate_splits(seed=0, train=2000, dev=100, test=200)
    assert [len(splits[name]) for name in ("train", "dev", "test")] == [2000, 100, 200]
    sources = [{pair[0] for pair in splits[name]} for name in ("train", "dev", "test")]
    assert not (sources[0] & sources[1] or sources[0] & sources[2] or sources[1] & sources[2])


def test_copying_the_source_scores_under_10_bleu():
    test = generate_splits(seed=0, train=10, dev=10, test=1000)["test"]
    sources, references = zip(*test)
    assert sacrebleu.corpus_bleu(list(sources), [list(references)]).score < 10


def test_the_grammar_reorders_and_inflects():
    pairs = [pair for split in generate_splits(seed=0, train=8000, dev=0, test=0).values() for pair in split]
    past_forms = {form for verb in VERBS for form in verb[5:7]}
    # A fronted adverb puts the verb second.
    fronted = [de.split() for en, de in pairs if en.startswith("Yesterday ")]
    assert len(fronted) > 100 and all(words[0] == "Gestern" and words[1] in past_forms for words in fronted)
    # A subordinate clause puts it last.
    subordinate = [de for en, de in pairs if en.startswith("I think that") and " sees " in en]
    assert len(subordinate) > 10 and all(de.startswith("Ich denke, dass") and de.endswith(" sieht.") for de in subordinate)
    # "helfen" takes the dative: "dem" for a masculine or neuter singular noun.
    nouns = collections.defaultdict(str, {en: de for en, _, de, _, _, gender in NOUNS if gender != "f"})
    dative = [(nouns[en.split()[-1][:-1]], de) for en, de in pairs if re.fullmatch(r"\w+ \w+ helps the \w+\.", en)]
    dative = [(noun, de) for noun, de in dative if noun]
    assert len(dative) >= 3 and all(de.endswith(f" hilft dem {noun}.") for noun, de in dative)
