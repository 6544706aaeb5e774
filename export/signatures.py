"""The SavedModel's signatures, each declared once, in `SIGNATURES`: its inputs besides `text` (with
the defaults a request may leave out and the values of the warm-up requests), its outputs, and how
`python -m export.translate` asks for it and prints what it returns. The served module
(`export.serving.Translator`: the method behind each), the warm-up requests
(`export.saved_model`), export.translate and export/README.md's tables are made from them, so a
new signature is its method, its declaration here, and its test.
"""

import dataclasses
import json
import os
import sys

import numpy as np
import tensorflow as tf

from keras_transformer.search import OPTION, OPTIONS, SamplingSettings

# Samples a request may ask for each sentence: each is a search of its own, and memory grows with them.
MAX_SAMPLES = 100


@dataclasses.dataclass(frozen=True)
class Tensor:
    """An input or an output of a signature.

    Args:
        name: its key in requests and results.
        dtype: "string", "int32", "float32" or "bool".
        doc: what it holds, for export/README.md.
        rank: its axes, each of any size; the first is the sentence's (`shape` may name the others
            for the README).
        option: the decoding option (`OPTIONS`) it sets: a request that leaves it out gets the
            export's value, which the SavedModel records as the input's default.
        warmup: an input's value for every sentence of the warm-up requests (None: the request's text).
    """

    name: str
    dtype: str
    doc: str = ""
    rank: int = 1
    shape: str = ""
    option: object = None
    warmup: object = None

    @property
    def spec(self):
        return tf.TensorSpec([None] * self.rank, self.dtype, name=self.name)

    def row(self, kind):
        shape = self.shape or ("[None]" if self.rank == 1 else "[None, None]")
        return f"| {kind} | `{self.name}` | `tf.{self.dtype}` | `{shape}`{': ' + self.doc if self.doc else ''} |"


def option_input(option):
    """The `options` signature's input for a decoding option: a value per sentence of its kind's
    served form, the option's example in warm-ups."""
    default = "none" if option.default == () else str(option.default).lower()
    kind = option.kind
    return Tensor(option.name, kind.served_dtype, f"{option.help} (default {default}; {option.valid})",
                  rank=kind.served_rank, option=option, warmup=kind.served(option.example))  # fmt: skip


TEXT = Tensor("text", "string")
TRANSLATION = Tensor("translation", "string")
SCORE = Tensor("score", "float32", "log-probability / length penalty")


class Signature:
    """A signature: `name` (the SignatureDef's key), `method` (the `Translator` method behind it,
    also the loaded module's), `inputs` (`Tensor`s after `text`; those with an `option` last),
    `outputs`; and for export.translate, the methods below."""

    name = method = ""
    inputs = outputs = ()

    def specs(self):
        return [TEXT.spec, *(tensor.spec for tensor in self.inputs)]

    def warmup(self, text, settings):
        """The inputs besides `text` of a warm-up request of `text` (a NumPy array of strings) to
        an export of `settings`."""
        return {t.name: text if t.warmup is None else np.stack([t.warmup] * len(text)) for t in self.inputs}

    def table(self):
        """export/README.md's table of its inputs and outputs."""
        rows = ["| | name | dtype | shape |", "| --- | --- | --- | --- |"]
        rows += [t.row("input") for t in (TEXT, *self.inputs)] + [t.row("output") for t in self.outputs]
        return "\n".join(rows) + "\n"

    # export.translate: the flag that asks for it (its name and argparse keywords; `group` holds
    # the flags of which one may be given), whether the flags ask for it, the checks made before
    # the model is loaded (ValueError; what requests need is read into `args`), a batch's inputs
    # besides `text`, and the lines printed for a result (NumPy arrays).
    flag = None

    def add_flags(self, parser, group):
        if self.flag:
            group.add_argument(self.flag[0], **self.flag[1])

    def asked(self, args):
        return bool(self.flag) and getattr(args, self.flag[0][2:].replace("-", "_")) not in (None, False, "")

    def prepare(self, args, export_dir, sentences):
        pass

    def request(self, args, batch, start):
        return {}

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
    flag = ("--n-best", dict(type=int, help="print each sentence's N best translations, with their scores"))
    inputs = (Tensor("n", "int32", "for each sentence, 1 to the export's beam size", warmup=np.int32(1)),)
    outputs = (Tensor("translations", "string", "as many columns as the largest n", rank=2),
               Tensor("scores", "float32", rank=2))  # fmt: skip

    def prepare(self, args, export_dir, sentences):
        with open(os.path.join(export_dir, "assets", "metadata.json")) as f:
            beam_size = json.load(f)["beam_size"]
        if not 1 <= args.n_best <= beam_size:
            raise ValueError(f"--n-best {args.n_best}: {export_dir} searches with a beam of {beam_size}, so 1 to {beam_size}.")

    def request(self, args, batch, start):
        return {"n": _fill(batch, args.n_best)}

    def lines(self, result, start, args):
        return _lists(result, start)


class Alignments(Signature):
    name = method = "alignments"
    flag = ("--alignments", dict(action="store_true", help="print each translation's alignment to its source pieces"))
    outputs = (
        TRANSLATION, SCORE,
        Tensor("source_pieces", "string", "the SentencePiece pieces the model read, its end of sentence `</s>` last, "
               'padded with `""`', rank=2),
        Tensor("source_length", "int32"),
        Tensor("target_pieces", "string", 'the translation\'s pieces, padded with `""`', rank=2),
        Tensor("target_length", "int32"),
        Tensor("attention", "float32", "each target piece's row sums to 1 over the source pieces, 0 on padding", rank=3,
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
    flag = ("--prefix", dict(help="the start each translation must have"))
    inputs = (Tensor("prefix", "string", 'for each sentence, the start of its translation; `""` for none', warmup=b""),)
    outputs = (TRANSLATION, SCORE)

    def request(self, args, batch, start):
        return {"prefix": _fill(batch, args.prefix)}


class Sample(Signature):
    name = method = "sample"
    flag = ("--sample", dict(type=int, help="print N translations of each sentence drawn at random, with their scores"))
    inputs = (
        Tensor("samples", "int32", f"for each sentence, how many translations to draw, 1 to {MAX_SAMPLES}", warmup=np.int32(1)),
        Tensor("temperature", "float32", "> 0 and finite; the logits are divided by it (below 1: closer to greedy)", warmup=np.float32(1)),
        Tensor("top_k", "int32", "draw among the k most likely tokens; 0 for all (1 is greedy search)", warmup=np.int32(0)),
        Tensor("top_p", "float32", "draw among the most likely tokens that first hold p of the probability, in (0, 1]",
               warmup=np.float32(1)),
        Tensor("seed", "int32", warmup=np.int32(0)),
    )  # fmt: skip
    outputs = (Tensor("translations", "string", 'as many columns as the largest `samples`, padded with `""`', rank=2),
               Tensor("scores", "float32", "the model's own log-probability / length penalty of each, -1e9 on padding", rank=2))  # fmt: skip

    def add_flags(self, parser, group):
        super().add_flags(parser, group)
        sampling, defaults = parser.add_argument_group("sampling (with --sample)"), SamplingSettings()
        sampling.add_argument("--temperature", type=float, default=defaults.temperature)
        sampling.add_argument("--top-k", type=int, default=defaults.top_k, help="0: every token")
        sampling.add_argument("--top-p", type=float, default=defaults.top_p)
        sampling.add_argument("--seed", type=int, default=0, help="sentence i (from 0) draws with seed SEED + i")

    def prepare(self, args, export_dir, sentences):
        SamplingSettings(args.temperature, args.top_k, args.top_p)
        if not 1 <= args.sample <= MAX_SAMPLES:
            raise ValueError(f"--sample {args.sample}: 1 to {MAX_SAMPLES}.")

    def request(self, args, batch, start):
        return {"samples": _fill(batch, args.sample), "temperature": _fill(batch, args.temperature),
                "top_k": _fill(batch, args.top_k), "top_p": _fill(batch, args.top_p),
                "seed": args.seed + start + tf.range(tf.size(batch))}  # fmt: skip

    def lines(self, result, start, args):
        return _lists(result, start)


class Options(Signature):
    name = method = "options"
    inputs = tuple(option_input(option) for option in OPTIONS)
    outputs = (TRANSLATION, SCORE, Tensor("cut", "bool", "the source was cut (at `max_input_length` or the model's `max_length`)"))

    def warmup(self, text, settings):  # each option on, within the export's bounds
        inputs = super().warmup(text, settings)
        for option in OPTIONS:
            if option.export_bound:
                inputs[option.name] = np.minimum(inputs[option.name], getattr(settings, option.name))
        return inputs

    def add_flags(self, parser, group):
        from keras_transformer.search.flags import add_decoding_flags

        add_decoding_flags(parser, defaults=False)  # None: the export's

    def asked(self, args):
        return any(getattr(args, option.name) is not None for option in OPTIONS)

    def request(self, args, batch, start):  # one value for every sentence
        return {option.name: tf.constant([getattr(args, option.name)]) for option in OPTIONS
                if getattr(args, option.name) is not None}  # fmt: skip

    def lines(self, result, start, args):
        for row in np.flatnonzero(result["cut"]):
            print(f"sentence {start + row + 1}: its source was cut", file=sys.stderr)
        return super().lines(result, start, args)


class Score(Signature):
    name = method = "score"
    flag = ("--score", dict(metavar="FILE", help="score the translations in FILE, one a line, instead"))
    inputs = (Tensor("target", "string", "a translation of each sentence"),
              Tensor("alpha", "float32", "the length penalty's exponent; default the export's", option=OPTION["alpha"],
                     warmup=np.float32(OPTION["alpha"].default)))  # fmt: skip
    outputs = (
        Tensor("log_prob", "float32", "log P(target \\| text), its end of sentence included"),
        Tensor("score", "float32", "log_prob / length penalty, the score a search gives it"),
        Tensor("token_log_probs", "float32", "each target piece's and the end of sentence's, 0 on padding", rank=2),
        Tensor("length", "int32", "the target's pieces and the end of sentence"),
    )

    def prepare(self, args, export_dir, sentences):
        with open(args.score, encoding="utf-8", errors="replace") as f:
            args.targets = f.read().splitlines()
        if len(args.targets) != len(sentences):
            raise ValueError(f"--score {args.score} has {len(args.targets)} lines for {len(sentences)} sentences.")

    def request(self, args, batch, start):
        return {"target": tf.constant(args.targets[start : start + len(batch)])}

    def lines(self, result, start, args):
        for score, log_prob, tokens, length in zip(*(result[key] for key in ("score", "log_prob", "token_log_probs", "length"))):
            yield f"{score:.4f}\t{log_prob:.4f}\t{' '.join(f'{t:.4f}' for t in tokens[:length])}"


SIGNATURES = (Translate(), NBest(), Alignments(), Prefix(), Sample(), Options(), Score())
SIGNATURE = {signature.name: signature for signature in SIGNATURES}
