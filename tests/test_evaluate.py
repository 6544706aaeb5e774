"""The figures evaluation reports: sacreBLEU's, computed as the field does; the translator's
graph."""

import sacrebleu

from keras_transformer import Transformer, TransformerConfig
from keras_transformer.search import DecodingSettings
from training.data import bucket_lengths
from training.evaluate import make_translator, prefixed, score

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


def test_a_translator_without_xla_traces_its_search_once_for_every_batch_and_bucket(synthetic_tokenizer, monkeypatch):
    config = TransformerConfig.tiny(synthetic_tokenizer.target.vocab_size, num_layers=1, d_model=32, num_heads=2, d_ff=64, max_length=24)
    model, traces = Transformer(config), []
    step = model.decode_step
    monkeypatch.setattr(model, "decode_step", lambda *args: traces.append(args) or step(*args))
    sources = ["Hello.", "The small dog sees the red car in the old park near the school.", "I think so.", "A cat."] * 2
    widths = {next(n for n in bucket_lengths(24) if n >= len(synthetic_tokenizer.source.tokenize(s)) + 1) for s in sources}
    assert len(widths) > 1
    translate = make_translator(model, synthetic_tokenizer, DecodingSettings(beam_size=2, max_length_b=2), batch_size=3,
                                jit_compile=False)  # fmt: skip
    translations, _ = translate(sources)
    assert len(translations) == len(sources) and len(traces) == 1
