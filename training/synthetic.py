"""The embedded default corpus: English sentences and their German translations, generated.

A small grammar that needs what translation needs: German puts the verb second after a fronted
adverb ("Yesterday the dog saw ..." -> "Gestern sah der Hund ..."), last in a subordinate clause
("..., dass der Hund die Katze sah"), and inflects articles, possessives and adjectives for
gender, number and case (nominative subject, accusative object, dative after "helfen", "folgen",
"geben" and "in"). Each English sentence has exactly one German translation, so a model can
reach a BLEU near 100; copying the source scores near 0.

The pairs are a deterministic function of the seed; the splits hold distinct English sentences.
For tests of one model that writes several languages, `TARGETS` adds a second target language
made from the German: no real language, under ISO 639-2's code for local use.
"""

import random

# English singular, English plural, German singular, German plural, German dative plural, gender.
NOUNS = [
    ("dog", "dogs", "Hund", "Hunde", "Hunden", "m"),
    ("cat", "cats", "Katze", "Katzen", "Katzen", "f"),
    ("car", "cars", "Auto", "Autos", "Autos", "n"),
    ("child", "children", "Kind", "Kinder", "Kindern", "n"),
    ("woman", "women", "Frau", "Frauen", "Frauen", "f"),
    ("man", "men", "Mann", "Männer", "Männern", "m"),
    ("book", "books", "Buch", "Bücher", "Büchern", "n"),
    ("teacher", "teachers", "Lehrer", "Lehrer", "Lehrern", "m"),
    ("bird", "birds", "Vogel", "Vögel", "Vögeln", "m"),
    ("apple", "apples", "Apfel", "Äpfel", "Äpfeln", "m"),
    ("flower", "flowers", "Blume", "Blumen", "Blumen", "f"),
    ("friend", "friends", "Freund", "Freunde", "Freunden", "m"),
    ("letter", "letters", "Brief", "Briefe", "Briefen", "m"),
    ("picture", "pictures", "Bild", "Bilder", "Bildern", "n"),
    ("horse", "horses", "Pferd", "Pferde", "Pferden", "n"),
    ("doctor", "doctors", "Ärztin", "Ärztinnen", "Ärztinnen", "f"),
]
ADJECTIVES = [
    ("small", "klein"), ("big", "groß"), ("red", "rot"), ("old", "alt"), ("new", "neu"),
    ("green", "grün"), ("young", "jung"), ("beautiful", "schön"), ("blue", "blau"), ("happy", "glücklich"),
]  # fmt: skip
NUMBERS = [
    ("two", "zwei"), ("three", "drei"), ("four", "vier"), ("five", "fünf"), ("six", "sechs"),
    ("seven", "sieben"), ("eight", "acht"), ("nine", "neun"), ("ten", "zehn"), ("twelve", "zwölf"),
]  # fmt: skip
# English: 3rd singular present, plural present, past. German: singular present, plural present,
# singular past, plural past. Then the German case of the object ("dat+acc": two objects).
VERBS = [
    ("sees", "see", "saw", "sieht", "sehen", "sah", "sahen", "acc"),
    ("likes", "like", "liked", "mag", "mögen", "mochte", "mochten", "acc"),
    ("finds", "find", "found", "findet", "finden", "fand", "fanden", "acc"),
    ("buys", "buy", "bought", "kauft", "kaufen", "kaufte", "kauften", "acc"),
    ("draws", "draw", "drew", "zeichnet", "zeichnen", "zeichnete", "zeichneten", "acc"),
    ("visits", "visit", "visited", "besucht", "besuchen", "besuchte", "besuchten", "acc"),
    ("helps", "help", "helped", "hilft", "helfen", "half", "halfen", "dat"),
    ("follows", "follow", "followed", "folgt", "folgen", "folgte", "folgten", "dat"),
    ("gives", "give", "gave", "gibt", "geben", "gab", "gaben", "dat+acc"),
    ("shows", "show", "showed", "zeigt", "zeigen", "zeigte", "zeigten", "dat+acc"),
]
# English, German with the dative article ("in dem" contracts to "im").
PLACES = [
    ("in the garden", "im Garten"), ("in the house", "im Haus"), ("in the city", "in der Stadt"),
    ("in the park", "im Park"), ("in the school", "in der Schule"), ("in the forest", "im Wald"),
]  # fmt: skip
# Fronted adverbs and the tense they need.
ADVERBS = [("yesterday", "gestern", "past"), ("today", "heute", "present"), ("now", "jetzt", "present")]
MATRIX_CLAUSES = [
    ("I think that", "ich denke , dass"), ("she says that", "sie sagt , dass"),
    ("we know that", "wir wissen , dass"), ("he believes that", "er glaubt , dass"),
    ("they hope that", "sie hoffen , dass"),
]  # fmt: skip

DEFINITE = {
    "nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
    "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
    "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"},
}
INDEFINITE = {  # also the stem endings of "mein" and "sein"
    "nom": {"m": "", "f": "e", "n": ""},
    "acc": {"m": "en", "f": "e", "n": ""},
    "dat": {"m": "em", "f": "er", "n": "em"},
}
POSSESSIVE_PLURAL = {"nom": "e", "acc": "e", "dat": "en"}
# Adjective endings after "der" (weak) and after "ein"/"mein" (mixed); plural after an article
# is always -en, plural after a number (strong) -e, or -en in the dative.
WEAK = {"nom": {"m": "e", "f": "e", "n": "e"}, "acc": {"m": "en", "f": "e", "n": "e"}, "dat": "en"}
MIXED = {"nom": {"m": "er", "f": "e", "n": "es"}, "acc": {"m": "en", "f": "e", "n": "es"}, "dat": "en"}


def _ending(table, case, gender):
    row = table[case]
    return row if isinstance(row, str) else row[gender]


def _noun_phrase(rng):
    """A random noun phrase: (English words, {case: German words}, is plural)."""
    en_sg, en_pl, de_sg, de_pl, de_dat_pl, gender = rng.choice(NOUNS)
    adjective = rng.choice(ADJECTIVES) if rng.random() < 0.5 else None
    kind = rng.choice(["the", "the", "a", "my", "his", "the_plural", "number", "my_plural"])
    plural = kind in ("the_plural", "number", "my_plural")
    number = rng.choice(NUMBERS) if kind == "number" else None

    first = number[0] if number else {"the_plural": "the", "my_plural": "my"}.get(kind, kind)
    english = [first] + ([adjective[0]] if adjective else []) + [en_pl if plural else en_sg]
    if kind == "a" and english[1][0] in "aeiou":
        english[0] = "an"

    german = {}
    for case in ("nom", "acc", "dat"):
        if kind in ("the", "the_plural"):
            determiner = DEFINITE[case]["pl" if plural else gender]
            ending = "en" if plural else _ending(WEAK, case, gender)
        elif kind == "my_plural":
            determiner, ending = "mein" + POSSESSIVE_PLURAL[case], "en"
        elif kind == "number":
            determiner, ending = number[1], "en" if case == "dat" else "e"
        else:
            determiner = {"a": "ein", "my": "mein", "his": "sein"}[kind] + INDEFINITE[case][gender]
            ending = _ending(MIXED, case, gender)
        noun = (de_dat_pl if case == "dat" else de_pl) if plural else de_sg
        german[case] = [determiner] + ([adjective[1] + ending] if adjective else []) + [noun]
    return english, german, plural


def sentence_pair(rng):
    """One random (English, German) pair."""
    subject_en, subject_de, subject_plural = _noun_phrase(rng)
    verb = rng.choice(VERBS)
    form = rng.choice(["plain", "adverb", "subordinate"])
    adverb = rng.choice(ADVERBS) if form == "adverb" else None
    tense = adverb[2] if adverb else rng.choice(["present", "past"])
    verb_en = verb[2] if tense == "past" else verb[1 if subject_plural else 0]
    verb_de = verb[3 + (2 if tense == "past" else 0) + (1 if subject_plural else 0)]

    objects_en, objects_de = [], []
    for case in verb[7].split("+"):
        object_en, object_de, _ = _noun_phrase(rng)
        objects_en += object_en
        objects_de += object_de[case]
    place = rng.choice(PLACES) if rng.random() < 0.3 else ("", "")

    english = subject_en + [verb_en] + objects_en + place[0].split()
    if form == "plain":
        german = subject_de["nom"] + [verb_de] + objects_de + place[1].split()
    elif form == "adverb":
        english = [adverb[0]] + english
        german = [adverb[1], verb_de] + subject_de["nom"] + objects_de + place[1].split()
    else:
        matrix_en, matrix_de = rng.choice(MATRIX_CLAUSES)
        english = matrix_en.split() + english
        german = matrix_de.split() + subject_de["nom"] + objects_de + place[1].split() + [verb_de]
    return _sentence(english), _sentence(german)


def _sentence(words):
    text = " ".join(words).replace(" ,", ",")
    return text[0].upper() + text[1:] + "."


# The target languages of the corpus: German, and "qaa", the German in capital letters (other
# pieces of the shared vocabulary, and a translation that shows which language was asked for).
TARGETS = {"de": lambda german: german, "qaa": str.upper}


def generate_splits(seed=0, train=20000, dev=500, test=1000, target="de"):
    """Deterministic, disjoint splits: {"train": [(en, de), ...], "dev": [...], "test": [...]};
    the English sentences are the same for each of `TARGETS`."""
    rng, write = random.Random(seed), TARGETS[target]
    seen, pairs = set(), []
    while len(pairs) < train + dev + test:
        english, german = sentence_pair(rng)
        if english not in seen:
            seen.add(english)
            pairs.append((english, write(german)))
    return {"test": pairs[:test], "dev": pairs[test : test + dev], "train": pairs[test + dev :]}
