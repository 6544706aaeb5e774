"""The paper's BLEU (training/paper_bleu.py): get_ende_bleu.sh's steps, checked by hand."""

import math

import pytest
import sacrebleu

from training.evaluate import score
from training.paper_bleu import PaperBleu, split_compounds

HYPOTHESES = ["Das Fußball-Spiel war gut.", "Er sagte “ja”."]
REFERENCES = ["Das Fußball-Spiel war sehr gut.", 'Er sagte "ja".']


def test_each_line_is_normalised_tokenized_and_split_as_the_script_does():
    paper = PaperBleu("de")
    # The hypothesis' curly quotes become straight ones (replace-unicode-punctuation.perl), then
    # every quote is escaped and the full stop split off (tokenizer.perl), the compound split.
    assert [paper.tokenize(line, hypothesis=True) for line in HYPOTHESES] == [
        "Das Fußball ##AT##-##AT## Spiel war gut .",
        "Er sagte &quot; ja &quot; .",
    ]
    assert [paper.tokenize(line) for line in REFERENCES] == [
        "Das Fußball ##AT##-##AT## Spiel war sehr gut .",
        "Er sagte &quot; ja &quot; .",
    ]
    # Perl's s///g does not overlap: the second hyphen of a-b-c has lost its left neighbour.
    assert split_compounds("a-b-c x-y -z") == "a ##AT##-##AT## b-c x ##AT##-##AT## y -z"


def test_the_score_is_bleu_of_the_hand_counted_ngrams():
    # Matched / total n-grams over both lines of the tokens above (7 + 6 hypothesis tokens,
    # 8 + 6 reference tokens):
    #   1-grams: 7 + 6 of 7 + 6;
    #   2-grams: 5 of 6 ("war gut" is not in the reference) + 5 of 5;
    #   3-grams: 3 of 5 + 4 of 4;  4-grams: 2 of 4 + 3 of 3.
    precisions = [13 / 13, 10 / 11, 7 / 9, 5 / 7]
    brevity = math.exp(1 - 14 / 13)
    expected = 100 * brevity * math.exp(sum(math.log(p) for p in precisions) / 4)
    assert PaperBleu("de").score(HYPOTHESES, REFERENCES) == round(expected, 2) == 78.06
    # sacreBLEU's 13a tokenization keeps the compound whole and the curly quotes apart: less.
    assert sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score < 70


def test_on_pretokenized_text_without_hyphens_it_is_sacrebleus_bleu_without_tokenizer():
    hypotheses = ["ein Mann fährt mit dem Fahrrad .", "zwei Hunde spielen im Schnee ."]
    references = ["ein Mann fährt Fahrrad auf der Straße .", "zwei Hunde spielen im tiefen Schnee ."]
    expected = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none").score
    assert 0 < expected < 100
    assert PaperBleu("de").score(hypotheses, references) == round(expected, 2)


def test_evaluation_reports_it_beside_sacrebleu_for_a_german_target_only():
    german = score(HYPOTHESES, REFERENCES, "de")
    assert german["bleu_paper"] == 78.06 and german["bleu"] == score(HYPOTHESES, REFERENCES)["bleu"]
    assert "tok:moses-de+compound-split" in german["bleu_paper_signature"]
    assert "bleu_paper" not in score(HYPOTHESES, REFERENCES, "en")
    with pytest.raises(ValueError, match="'fr'"):
        PaperBleu("fr")


def test_an_ngram_order_without_a_match_scores_zero_as_multi_bleu_does():
    # 1-, 2- and 3-grams match, no 4-gram does. multi-bleu.perl has no smoothing: a zero
    # precision makes BLEU 0.0.
    hypotheses, references = ["Das Spiel war sehr gut"], ["Das Spiel war nicht gut"]
    assert PaperBleu("de").score(hypotheses, references) == 0.0
    assert sacrebleu.corpus_bleu(hypotheses, [references]).score > 0  # sacreBLEU smooths (exp) by default
