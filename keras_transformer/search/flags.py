"""The decoding options of `OPTIONS` as command-line flags, for every command that decodes
(`training.train`, `training.evaluate`, `python -m export`, `export.translate`)."""

import argparse

from keras_transformer.search.settings import OPTIONS, STOPPING_RULES, DecodingSettings


def add_decoding_flags(parser, defaults=True):
    """A flag per decoding option of `OPTIONS` (--beam-size, --alpha, --no-repeat-ngram-size, ...)
    with its default (the paper's decoding), and --stopping; `decoding_settings(args)` reads them.
    Without `defaults` every flag defaults to None (export.translate: the export's value)."""
    group = parser.add_argument_group("decoding options")
    for option in OPTIONS:
        flag, default = "--" + option.name.replace("_", "-"), option.default if defaults else None
        help = f"{option.help} ({option.valid})"
        if option.dtype == "bool":
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help)
        elif option.dtype == "string":
            group.add_argument(flag, action="append", default=None, metavar="TEXT",
                               help=f"{option.help}: a phrase, cut into pieces (repeat the flag for more)")  # fmt: skip
        else:
            group.add_argument(flag, type=int if option.dtype == "int32" else float, default=default, help=help)
    if defaults:
        group.add_argument("--stopping", choices=STOPPING_RULES, default=DecodingSettings.stopping,
                           help="when beam search is done with a sentence: exact (no alive hypothesis can beat the "
                           "best ended one) or first_k (beam-size hypotheses have ended: faster, as CTranslate2)")  # fmt: skip


def decoding_settings(args, tokenizer=None, **more):
    """The `DecodingSettings` of `add_decoding_flags`' flags (token sequences cut into pieces by
    `tokenizer`), and `more` fields."""
    values = {option.name: getattr(args, option.name) for option in OPTIONS if option.dtype != "string"}
    for option in OPTIONS:
        phrases = getattr(args, option.name) if option.dtype == "string" else None
        if phrases:
            if tokenizer is None:
                raise ValueError(f"--{option.name.replace('_', '-')} needs the run's tokenizer.")
            values[option.name] = tuple(tuple(tokenizer.tokenize(phrase).numpy().tolist()) for phrase in phrases)
    return DecodingSettings(**values, stopping=args.stopping, **more)
