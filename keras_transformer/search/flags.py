"""The decoding options of `OPTIONS` as command-line flags, for every command that decodes
(`training.train`, `training.evaluate`, `python -m export`, `export.translate`)."""

from keras_transformer.search.settings import OPTIONS, STOPPING_RULES, DecodingSettings


def flag_of(name):
    """The command-line flag of a setting: `--no-repeat-ngram-size` for `no_repeat_ngram_size`."""
    return "--" + name.replace("_", "-")


def add_decoding_flags(parser, defaults=True):
    """A flag per decoding option of `OPTIONS` (--beam-size, --alpha, --no-repeat-ngram-size, ...)
    with its default (the paper's decoding), and --stopping; `decoding_settings(args)` reads them.
    Without `defaults` every flag defaults to None (export.translate: the export's value)."""
    group = parser.add_argument_group("decoding options")
    for option in OPTIONS:
        default = option.default if defaults else None
        option.kind.add_flag(group, flag_of(option.name), default, f"{option.help} ({option.valid})")
    if defaults:
        group.add_argument("--stopping", choices=STOPPING_RULES, default=DecodingSettings.stopping,
                           help="when beam search is done with a sentence: exact (no alive hypothesis can beat the "
                           "best ended one) or first_k (beam-size hypotheses have ended: faster, as CTranslate2)")  # fmt: skip


def needs_tokenizer(args):
    """Whether `add_decoding_flags`' flags in `args` hold text for `decoding_settings`' tokenizer."""
    return any(option.kind.needs_tokenizer(getattr(args, option.name)) for option in OPTIONS)


def decoding_settings(args, tokenizer=None, **more):
    """The `DecodingSettings` of `add_decoding_flags`' flags (token sequences cut into pieces by
    `tokenizer`, the target side's, which `needs_tokenizer` says they need), and `more` fields."""
    values = {}
    for option in OPTIONS:
        try:
            values[option.name] = option.kind.from_flag(getattr(args, option.name), tokenizer)
        except ValueError as error:
            raise ValueError(f"{flag_of(option.name)}: {error}") from None
    return DecodingSettings(**values, stopping=args.stopping, **more)
