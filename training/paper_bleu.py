"""The paper's BLEU: how section 6.1's 27.3 (base) and 28.4 (big) on WMT14 EN-DE were scored.

They are tokenized BLEU with compound splitting, tensor2tensor's `get_ende_bleu.sh`, not
sacreBLEU's BLEU of detokenized text (`training.evaluate.score`, this project's figure). That
script, step by step, as here:

1. the hypothesis' punctuation normalised (Moses' `replace-unicode-punctuation.perl`);
2. hypothesis and reference Moses-tokenized (`tokenizer.perl -l de`: hyphens stay inside words,
   `&`, `"`, `'`, `<`, `>`, `[`, `]` and `|` escaped as HTML entities);
3. hyphenated compounds split in both (`s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`), so that
   "Fußball-Spiel" counts as three tokens;
4. `multi-bleu.perl`: case-sensitive BLEU over whitespace tokens, no smoothing.

The Moses steps are sacremoses' port of the Perl scripts; step 4 is sacreBLEU's BLEU with no
tokenizer and no smoothing, which counts what multi-bleu.perl counts. On WMT14 EN-DE this
reads 0.7-1.8 BLEU above cased sacreBLEU (Post 2018; fairseq issues #435 and #2009).
"""

import re

import sacrebleu

# Target languages whose paper figures were scored this way (get_ende_bleu.sh is German's).
LANGUAGES = ("de",)

_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(tokenized):
    """Step 3: `a-b` -> `a ##AT##-##AT## b`, left to right without overlap, as Perl's `s///g`
    (so `a-b-c` -> `a ##AT##-##AT## b-c`, as in the script)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


class PaperBleu:
    """`get_ende_bleu.sh`'s BLEU for one target language (`LANGUAGES`).

    Example:
    >>> PaperBleu("de").score(["Ein Fußball-Spiel."], ["Ein Fußball-Spiel."])
    100.0
    """

    def __init__(self, language="de"):
        if language not in LANGUAGES:
            raise ValueError(f"The paper's BLEU is defined for targets in {LANGUAGES}, not {language!r}.")
        self.language = language
        import sacremoses  # here: its import compiles its regexes, a quarter second each process would pay

        self._normalizer = sacremoses.MosesPunctNormalizer(lang=language)
        self._tokenizer = sacremoses.MosesTokenizer(lang=language)
        self._bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
        # What the figure is, in the manner of sacreBLEU's signatures.
        self.signature = (f"nrefs:1|case:mixed|eff:no|tok:moses-{language}+compound-split|hyp:replace-unicode-punct|"
                          f"smooth:none|sacremoses:{sacremoses.__version__}|sacrebleu:{sacrebleu.__version__}|"
                          "t2t:get_ende_bleu.sh")  # fmt: skip

    def tokenize(self, line, hypothesis=False):
        """Steps 1 (for a hypothesis) to 3 on one line: the tokens multi-bleu.perl counts, joined
        by spaces."""
        if hypothesis:
            line = self._normalizer.replace_unicode_punct(line)
        return split_compounds(self._tokenizer.tokenize(line, return_str=True, escape=True))

    def score(self, translations, references):
        """Corpus BLEU of detokenized `translations` against `references` (one each), rounded
        to 2 decimals as sacreBLEU's figures here."""
        hypotheses = [self.tokenize(line, hypothesis=True) for line in translations]
        tokenized_references = [self.tokenize(line) for line in references]
        return round(self._bleu.corpus_score(hypotheses, [tokenized_references]).score, 2)
