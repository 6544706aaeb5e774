"""The figures evaluation reports: sacreBLEU's, computed as the field does."""

import sacrebleu

from training.evaluate import prefixed, score

HYPOTHESES = ["The cat sat on the Mat.", "A dog runs in the Park!", "Zwei Männer spielen Fußball."]
REFERENCES = ["the cat sat on the mat.", "A dog runs through the park.", "Zwei Männer spielen Fussball."]


def test_lowercase_bleu_is_sacrebleus_lowercased_13a_bleu():
    metrics = score(HYPOTHESES, REFERENCES)
    expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES], lowercase=True, tokenize="13a")
    assert metrics["bleu_lowercase"] == round(expected.score, 2)
    # The same as cased BLEU on lowercased text, and above cased BLEU where only case differs.
    lowered = sacrebleu.corpus_bleu([h.lower() for h in HYPOTHESES], [[r.lower() for r in REFERENCES]])
    assert metrics["bleu_lowercase"] == round(lowered.score, 2) > metrics["bleu"]
    assert metrics["bleu"] == round(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score, 2)
    assert "case:lc" in metrics["bleu_lowercase_signature"] and "tok:13a" in metrics["bleu_lowercase_signature"]
    assert "case:mixed" in metrics["signature"]


def test_dev_figures_are_named_for_their_split():
    assert prefixed({"bleu": 30.1, "split": "dev", "signature": "s"}, "dev") == {"dev_bleu": 30.1, "dev_signature": "s"}
