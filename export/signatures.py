"""The SavedModel's signatures and the inputs a request may set, each declared once.

`INPUTS` is the table of request inputs: the text, `n`, the sampling inputs, `prefix`, `target`,
`target_language` and the decoding options (`OPTIONS`), a row each, with its kind (dtype and
rank), its check, its bound in an export, its default and its warm-up value. `SIGNATURES`
declares each signature: its inputs (rows of `INPUTS`), its outputs, and how `python -m
export.translate` asks for it and prints what it returns. The served module
(`export.serving.Translator`: the method behind each, the inputs' checks and defaults), the
warm-up requests (`export.saved_model`), export.translate and export/README.md's tables
(`python -m export.signatures`) are made from them, so a new signature is its method, its
declaration here, and its test.
"""

import dataclasses
import os
import re
import sys

from keras_transformer.quiet import quiet_tensorflow

quiet_tensorflow()  # `python -m export.signatures` is a command

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from export.layout import TARGET_LANGUAGES, read_metadata  # noqa: E402
from keras_transformer.search import OPTIONS, SAMPLING_OPTIONS  # noqa: E402
from keras_transformer.search.flags import flag_of  # noqa: E402
from keras_transformer.search.settings import INT32, Kind  # noqa: E402

# Samples a request may ask for each sentence: each is a search of its own, and memory grows with them.
MAX_SAMPLES = 100
STRING = Kind(str, "string")


@dataclasses.dataclass(frozen=True)
class Input:
    """An input a request may set: one row of `INPUTS`.

    Args:
        name: its key in requests.
        kind: a `Kind` (keras_transformer/search/settings.py): its dtype and rank as served.
        doc: what it holds, for export/README.md.
        valid: the values allowed, in words, for errors and export/README.md ("": any).
        check: values -> bool, elementwise, for NumPy arrays and tensors alike (None: any value).
        bound: the field of the export's `DecodingSettings` that is its most (n: `beam_size`).
        option: the decoding option it sets (`OPTIONS`): a request that leaves it out gets the
            export's value, which the SignatureDef records as its default, and one value may
            stand for every sentence. Without one, the input is a value for each sentence.
        choices: for an input that picks one of the export's values, the key of metadata.json
            that lists them. The first is its default, one value may stand for every sentence,
            one not among them is refused, and warm-up requests ask for each in turn. An export
            of one value does not take it, so that its SignatureDefs are those of before the input
            existed (TF's signature functions in Python and Keras' TFSMLayer pass every input,
            defaults or not).
        warmup: its value for each sentence of a warm-up request (None: the request's text).
    """

    name: str
    kind: Kind
    doc: str = ""
    valid: str = ""
    check: object = None
    bound: str = ""
    option: object = None
    choices: str = ""
    warmup: object = None

    @property
    def has_default(self):
        """A request may leave it out (and give one value for all sentences)."""
        return self.option is not None or bool(self.choices)

    def served_by(self, choices):
        """Whether an export of `choices` ({metadata.json key: its values}) takes it."""
        return not self.choices or len(choices[self.choices]) > 1

    @property
    def spec(self):
        return tf.TensorSpec([None] * self.kind.served_rank, self.kind.served_dtype, name=self.name)

    def check_value(self, value, name, most=None):
        """Raises ValueError naming `name` (a flag) unless `value` is valid, and at most `most`."""
        if self.check is not None and not (np.all(self.check(np.asarray(value))) and (most is None or value <= most)):
            raise ValueError(f"{name} must be {self.valid_text(most)}; got {value!r}.")

    def valid_text(self, most=None):
        return self.valid if most is None else f"{self.valid}: at most {most} in this export"

    def row(self):
        shape = "[None]" if self.kind.served_rank == 1 else "[None, None]"
        doc = self.doc
        if self.option is not None:
            default = "none" if self.option.default == () else str(self.option.default).lower()
            doc += f" (default {default}; {self.valid})"
        elif self.choices:
            doc += f" (default the export's first; one of metadata.json's `{self.choices}`)"
        elif self.valid:
            doc += f" ({self.valid})"
        return f"| input | `{self.name}` | `tf.{self.kind.served_dtype}` | `{shape}`{': ' + doc if doc else ''} |"


def option_input(option, exported=True):
    """The input of a decoding (or sampling) option: its check and help, its example in warm-ups;
    with `exported`, the export's value when a request leaves it out."""
    return Input(option.name, option.kind, option.help, option.valid, option.check,
                 bound=option.name if option.export_bound else "", option=option if exported else None,
                 warmup=option.kind.served(option.example))  # fmt: skip


INPUTS = (
    Input("text", STRING),
    Input("n", INT32, "for each sentence, how many of its best translations", "1 to the beam size", lambda v: v >= 1,
          bound="beam_size", warmup=np.int32(1)),
    Input("samples", INT32, "for each sentence, how many translations to draw", f"1 to {MAX_SAMPLES}",
          lambda v: (v >= 1) & (v <= MAX_SAMPLES), warmup=np.int32(1)),
    *(option_input(option, exported=False) for option in SAMPLING_OPTIONS),
    Input("seed", INT32, "for each sentence, the seed its samples are a function of", warmup=np.int32(0)),
    Input("prefix", STRING, 'for each sentence, the start of its translation; `""` for none', warmup=b""),
    Input("target", STRING, "a translation of each sentence"),
    Input("target_language", STRING, "in an export of several target languages, the language to write for each "
          "sentence", choices=TARGET_LANGUAGES),  # fmt: skip
    *(option_input(option) for option in OPTIONS),
)  # fmt: skip
INPUT = {row.name: row for row in INPUTS}


@dataclasses.dataclass(frozen=True)
class Output:
    """An output of a signature: its key in results, dtype ("string", "int32", "float32" or
    "bool"), what it holds (for export/README.md) and its axes (the first is the sentence's;
    `shape` may name the others for the README)."""

    name: str
    dtype: str
    doc: str = ""
    rank: int = 1
    shape: str = ""

    def row(self):
        shape = self.shape or "[" + ", ".join(["None"] * self.rank) + "]"
        return f"| output | `{self.name}` | `tf.{self.dtype}` | `{shape}`{': ' + self.doc if self.doc else ''} |"


TRANSLATION = Output("translation", "string")
SCORE = Output("score", "float32", "log-probability / length penalty")


class Signature:
    """A signature: `name` (the SignatureDef's key), `method` (the `Translator` method behind it,
    also the loaded module's), `inputs` (rows of `INPUTS`, in the method's order: the first
    gives the batch, those with a default last), `outputs`; and for export.translate, the
    methods below."""

    name = method = ""
    inputs = (INPUT["text"], INPUT["target_language"])
    outputs = ()

    def served_inputs(self, choices):
        """Its inputs in an export of `choices` ({metadata.json key: its values}, `Input.choices`)."""
        return tuple(row for row in self.inputs if row.served_by(choices))

    def warmup(self, text, settings, choices):
        """The inputs of a warm-up request of `text` (a NumPy array of strings) to an export of
        `settings` and `choices`: each row's warm-up value, within the export's bounds."""
        inputs = {}
        for row in self.served_inputs(choices):
            if row.choices:
                value = np.resize(np.array([choice.encode() for choice in choices[row.choices]], object), len(text))
            else:
                value = text if row.warmup is None else np.stack([row.warmup] * len(text))
            inputs[row.name] = np.minimum(value, getattr(settings, row.bound)) if row.bound else value
        return inputs

    def table(self):
        """export/README.md's table of its inputs and outputs."""
        rows = ["| | name | dtype | shape |", "| --- | --- | --- | --- |"]
        rows += [row.row() for row in (*self.inputs, *self.outputs)]
        return "\n".join(rows) + "\n"

    # export.translate: the setting that asks for it (its name in `args`, whose flag is `flag_of`
    # it, and argparse keywords; `group` holds the flags of which one may be given), whether the
    # flags ask for it, the checks made before the model is loaded (ValueError; what requests
    # need is read into `args`), a batch's inputs, and the lines printed for a result (NumPy
    # arrays).
    setting = None

    @property
    def flag(self):
        return flag_of(self.setting[0]) if self.setting else None

    def add_flags(self, parser, group):
        if self.setting:
            group.add_argument(self.flag, **self.setting[1])

    def asked(self, args):
        return bool(self.setting) and getattr(args, self.setting[0]) not in (None, False, "")

    def prepare(self, args, export_dir, sentences):
        pass

    def request(self, args, batch, start):
        return {"text": batch}

    def lines(self, result, start, args):
        for translation, score in zip(result["translation"], result["score"]):
            line = translation.decode("utf-8")
            yield f"{score:.4f}\t{line}" if args.scores else line


def _lists(result, start):
    """Each sentence's translations, a line each: its number (from 1), rank, score, translation."""
    for row, (translations, scores) in enumerate(zip(result["translations"], result["scores"])):
        for rank, (translation, score) in enumerate(zip(translations, scores), 1):
            yield f"{start + row + 1}\t{rank}\t{score:.4f}\t{translation.decode('utf-8')}"


def _fill(batch, value):
    return tf.fill(tf.shape(batch), value)


class Translate(Signature):
    name, method = "serving_default", "translate"
    outputs = (TRANSLATION, SCORE)


class NBest(Signature):
    name = method = "n_best"
    setting = ("n_best", dict(type=int, help="print each sentence's N best translations, with their scores"))
    inputs = (INPUT["text"], INPUT["n"], INPUT["target_language"])
    outputs = (Output("translations", "string", "as many columns as the largest n", rank=2),
               Output("scores", "float32", rank=2))  # fmt: skip

    def prepare(self, args, export_dir, sentences):
        INPUT["n"].check_value(args.n_best, self.flag, most=read_metadata(export_dir)["beam_size"])

    def request(self, args, batch, start):
        return {"text": batch, "n": _fill(batch, args.n_best)}

    def lines(self, result, start, args):
        return _lists(result, start)


class Alignments(Signature):
    name = method = "alignments"
    setting = ("alignments", dict(action="store_true", help="print each translation's alignment to its source pieces"))
    outputs = (
        TRANSLATION, SCORE,
        Output("source_pieces", "string", "the SentencePiece pieces the model read, its end of sentence `</s>` last, "
               'padded with `""`', rank=2),
        Output("source_length", "int32"),
        Output("target_pieces", "string", 'the translation\'s pieces, padded with `""`', rank=2),
        Output("target_length", "int32"),
        Output("attention", "float32", "each target piece's row sums to 1 over the source pieces, 0 on padding", rank=3,
               shape="[None, target, source]"),
    )  # fmt: skip

    def lines(self, result, start, args):
        for translation, attention, source_length, target_length in zip(
            *(result[key] for key in ("translation", "attention", "source_length", "target_length"))
        ):
            sources = attention[:target_length, :source_length].argmax(axis=-1)
            yield translation.decode("utf-8") + "\t" + " ".join(f"{i}-{j}" for j, i in enumerate(sources))


class Prefix(Signature):
    name = method = "prefix"
    setting = ("prefix", dict(help="the start each translation must have"))
    inputs = (INPUT["text"], INPUT["prefix"], INPUT["target_language"])
    outputs = (TRANSLATION, SCORE)

    def request(self, args, batch, start):
        return {"text": batch, "prefix": _fill(batch, args.prefix)}


class Sample(Signature):
    name = method = "sample"
    setting = ("sample", dict(type=int, help="print N translations of each sentence drawn at random, with their scores"))
    inputs = (INPUT["text"], INPUT["samples"], *(INPUT[option.name] for option in SAMPLING_OPTIONS), INPUT["seed"],
              INPUT["target_language"])  # fmt: skip
    outputs = (Output("translations", "string", 'as many columns as the largest `samples`, padded with `""`', rank=2),
               Output("scores", "float32", "the model's own log-probability / length penalty of each, -1e9 on padding", rank=2))  # fmt: skip

    def add_flags(self, parser, group):
        super().add_flags(parser, group)
        sampling = parser.add_argument_group("sampling (with --sample)")
        for option in SAMPLING_OPTIONS:
            option.kind.add_flag(sampling, flag_of(option.name), option.default, f"{option.help} ({option.valid})")
        sampling.add_argument("--seed", type=int, default=0, help="sentence i (from 0) draws with seed SEED + i")

    def prepare(self, args, export_dir, sentences):
        INPUT["samples"].check_value(args.sample, self.flag)
        for option in SAMPLING_OPTIONS:
            INPUT[option.name].check_value(getattr(args, option.name), flag_of(option.name))

    def request(self, args, batch, start):
        return {"text": batch, "samples": _fill(batch, args.sample),
                **{option.name: _fill(batch, getattr(args, option.name)) for option in SAMPLING_OPTIONS},
                "seed": args.seed + start + tf.range(tf.size(batch))}  # fmt: skip

    def lines(self, result, start, args):
        return _lists(result, start)


class Options(Signature):
    name = method = "options"
    inputs = (INPUT["text"], INPUT["target_language"], *(INPUT[option.name] for option in OPTIONS))
    outputs = (TRANSLATION, SCORE, Output("cut", "bool", "the source was cut (at `max_input_length` or the model's `max_length`)"))

    def add_flags(self, parser, group):
        from keras_transformer.search.flags import add_decoding_flags

        add_decoding_flags(parser, defaults=False)  # None: the export's

    def asked(self, args):
        return any(getattr(args, option.name) is not None for option in OPTIONS)

    def request(self, args, batch, start):  # one value for every sentence
        return {"text": batch, **{option.name: tf.constant([getattr(args, option.name)]) for option in OPTIONS
                                  if getattr(args, option.name) is not None}}  # fmt: skip

    def lines(self, result, start, args):
        for row in np.flatnonzero(result["cut"]):
            print(f"sentence {start + row + 1}: its source was cut", file=sys.stderr)
        return super().lines(result, start, args)


class Score(Signature):
    name = method = "score"
    setting = ("score", dict(metavar="FILE", help="score the translations in FILE, one a line, instead"))
    inputs = (INPUT["text"], INPUT["target"], INPUT["target_language"], INPUT["alpha"])
    outputs = (
        Output("log_prob", "float32", "log P(target \\| text), its end of sentence included"),
        Output("score", "float32", "log_prob / length penalty, the score a search gives it"),
        Output("token_log_probs", "float32", "each target piece's and the end of sentence's, 0 on padding", rank=2),
        Output("length", "int32", "the target's pieces and the end of sentence"),
    )

    def prepare(self, args, export_dir, sentences):
        with open(args.score, encoding="utf-8", errors="replace") as f:
            args.targets = f.read().splitlines()
        if len(args.targets) != len(sentences):
            raise ValueError(f"{self.flag} {args.score} has {len(args.targets)} lines for {len(sentences)} sentences.")

    def request(self, args, batch, start):
        return {"text": batch, "target": tf.constant(args.targets[start : start + len(batch)])}

    def lines(self, result, start, args):
        for score, log_prob, tokens, length in zip(*(result[key] for key in ("score", "log_prob", "token_log_probs", "length"))):
            yield f"{score:.4f}\t{log_prob:.4f}\t{' '.join(f'{t:.4f}' for t in tokens[:length])}"


SIGNATURES = (Translate(), NBest(), Alignments(), Prefix(), Sample(), Options(), Score())
SIGNATURE = {signature.name: signature for signature in SIGNATURES}


# export/README.md's tables, each between a line `<!-- signature NAME -->` and the next blank line.
README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")


# export/README.md's section for the signatures that have no prose of their own: written whole.
OTHERS = ("<!-- signatures without a section of their own -->\n", "<!-- end of signatures without a section -->\n")


def readme_with_tables(readme):
    """`readme` (export/README.md's text) with each signature's table as `SIGNATURES` declares it:
    after its line `<!-- signature NAME -->`, or, for one without that line, between the lines
    of OTHERS, under its name and its class's docstring."""
    others = ""
    for signature in SIGNATURES:
        marker = f"<!-- signature {signature.name} -->\n"
        if marker in readme:
            readme = re.sub(re.escape(marker) + r"(\|.*\n)*", lambda _: marker + signature.table(), readme)
        else:
            doc = " ".join((type(signature).__doc__ or "").split())
            others += f"\n`{signature.name}` (`loaded.{signature.method}`){', ' + doc if doc else ''}:\n\n{signature.table()}\n"
    begin, end = OTHERS
    if begin not in readme or end not in readme.partition(begin)[2]:
        raise ValueError(f"{README} has no lines {begin.strip()!r} and then {end.strip()!r}.")
    before, _, rest = readme.partition(begin)
    return before + begin + others + end + rest.partition(end)[2]


if __name__ == "__main__":  # python -m export.signatures: writes export/README.md's tables
    with open(README, encoding="utf-8") as f:
        text = readme_with_tables(f.read())
    with open(README, "w", encoding="utf-8") as f:
        f.write(text)
