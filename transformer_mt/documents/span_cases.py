"""The documents report's seeded lines with one thing to copy: a span of each kind (numbers, prices,
times, years, e-mail addresses, URLs, codes, file paths) or a first name, put into English sentences
made from templates. Half the lines also hold a held-out test sentence before or after the template's,
so that copying is measured inside paragraphs too.

Everything is drawn from the report's seed and the kind's name, never from global random state: one
`random.Random` per kind, and a Faker generator of each locale seeded from it before every value
(Faker where it has an apt generator; numbers and codes with the Random or Faker's patterns). The same
seed and Faker version give the same lines.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass

from faker import Faker

# Locales with Latin script, for first names: the names a user of an en->xx model may well write.
NAME_LOCALES = ("en_US", "en_GB", "fr_FR", "de_DE", "es_ES", "it_IT", "pt_BR", "nl_NL", "pl_PL", "sv_SE",
                "fi_FI", "cs_CZ", "hu_HU", "ro_RO", "tr_TR", "id_ID")
# Locales whose phone numbers are digits, spaces, +, - and brackets (en_US adds extensions like x302).
PHONE_LOCALES = ("en_GB", "fr_FR", "it_IT", "pl_PL", "cs_CZ", "fi_FI", "es_ES", "nl_NL", "sv_SE")
CODE_PATTERNS = ("??-####", "?#?#?#", "???-###-??", "#??####", "??##?#")  # ? a letter, # a digit
CODE_LETTERS = "".join(c for c in string.ascii_uppercase if c not in "IO")  # never read as 1 and 0
_PARAGRAPH = 2  # every second line of a kind also holds a test sentence


@dataclass(frozen=True)
class Case:
    """A line to translate and the value that must come through it verbatim."""

    kind: str
    line: str
    value: str


class _Draw:
    """A kind's generators: its Random, and Faker of any locale seeded from that Random at each use."""

    def __init__(self, seed: int, kind: str, fakers: dict[str, Faker]) -> None:
        self.rng = random.Random(f"documents:{seed}:{kind}")
        self._fakers = fakers

    def fake(self, locale: str = "en_US") -> Faker:
        """Faker of `locale`, seeded from this kind's Random (so the order of kinds changes nothing)."""
        if locale not in self._fakers:
            self._fakers[locale] = Faker(locale)
        faker = self._fakers[locale]
        faker.seed_instance(self.rng.getrandbits(64))
        return faker


@dataclass(frozen=True)
class _Form:
    """One way of writing a kind's value, and sentences it fits in ({} is the value)."""

    draw: Callable[[_Draw], str]
    templates: tuple[str, ...]


def _integer(d: _Draw) -> str:
    return str(d.rng.randint(2, 9999))


def _thousands(d: _Draw) -> str:
    return f"{d.rng.randint(1000, 9_999_999):,}"


def _decimal(d: _Draw) -> str:
    return f"{d.rng.randint(0, 99)}.{d.rng.randint(1, 99):02d}"


def _phone(d: _Draw) -> str:
    return d.fake(d.rng.choice(PHONE_LOCALES)).phone_number()


def _price(d: _Draw) -> str:
    return d.rng.choice("$€£") + d.fake().pricetag().removeprefix("$")  # Faker's amounts, 3 currencies


def _time(d: _Draw) -> str:
    clock = d.fake().time(pattern="%H:%M")
    return clock[1:] if clock[0] == "0" and clock[1] != "0" and d.rng.random() < 0.5 else clock  # 7:05


def _year(d: _Draw) -> str:
    return d.fake().year()  # 1970 to now


def _old_year(d: _Draw) -> str:
    return str(d.rng.randint(1100, 1969))


def _email(d: _Draw) -> str:
    fake = d.fake(d.rng.choice(("en_US", "en_GB", "fr_FR", "de_DE")))
    return d.rng.choice((fake.ascii_email, fake.ascii_free_email, fake.ascii_company_email))()


def _url(d: _Draw) -> str:
    fake = d.fake()
    return d.rng.choice((fake.url, fake.uri))()


def _code(d: _Draw) -> str:
    return d.fake().bothify(d.rng.choice(CODE_PATTERNS), letters=CODE_LETTERS)


def _posix_path(d: _Draw) -> str:
    return d.fake().file_path(depth=d.rng.randint(1, 3))


def _windows_path(d: _Draw) -> str:
    return d.fake().file_path(depth=d.rng.randint(1, 3), file_system_rule="windows")


FORMS: dict[str, tuple[_Form, ...]] = {
    "number": (
        _Form(_integer, ("There are {} books in the library.", "She has already read {} pages.",
                         "The village has {} inhabitants.", "We planted {} trees last spring.")),
        _Form(_thousands, ("The city has {} inhabitants.", "The company sold {} cars last year.",
                           "More than {} people signed the petition.",
                           "The museum had {} visitors last year.")),
        _Form(_decimal, ("The package weighs {} kilograms.", "The lake is {} meters deep here.",
                         "The average score was {}.", "He ran the last lap in {} seconds.")),
        _Form(_phone, ("My phone number is {}.", "Call me at {} after six.",
                       "You can reach the office at {}.", "Her new number is {}.")),
    ),
    # Faker's amounts run from cents to tens of thousands: sentences that fit any of them
    "price": (_Form(_price, ("The total comes to {}.", "The invoice amounts to {}.", "I paid {} for it.",
                             "The price is {}, tax included.", "We still owe the bank {}.")),),
    "time": (_Form(_time, ("The train leaves at {}.", "The meeting starts at {} tomorrow.",
                           "Please be here by {}.", "The shop closes at {} on Sundays.",
                           "I woke up at {} this morning.")),),
    "year": tuple(_Form(draw, ("The bridge was built in {}.", "They moved to Paris in {}.",
                               "This house dates from {}.", "The company was founded in {}."))
                  for draw in (_year, _old_year)),
    "email": (_Form(_email, ("Send the report to {} tomorrow.", "My e-mail address is {}.",
                             "Please write to {} if you have any questions.",
                             "I forwarded your message to {}.")),),
    "url": (_Form(_url, ("You can find the timetable at {}.", "Visit {} for more details.",
                         "The form is on {}.", "I read about it on {} last week.")),),
    "code": (_Form(_code, ("Your order number is {}.", "Please enter the code {} to continue.",
                           "The reference on the invoice is {}.", "My booking code is {}.",
                           "The part {} is out of stock.")),),
    "path": tuple(_Form(draw, ("The report is saved as {}.", "Open {} and change the first line.",
                               "The error is written to {}.", "Please delete {} before you leave."))
                  for draw in (_posix_path, _windows_path)),
}
KINDS = tuple(FORMS)
NAME_TEMPLATES = ("{} is waiting for you at the station.", "I met {} yesterday.", "Have you seen {} today?",
                  "{} lives next door to my sister.", "Tell {} that dinner is ready.",
                  "My best friend is called {}.", "{} bought a new car last week.",
                  "We invited {} to the party.")


def _line(i: int, sentence: str, d: _Draw, paragraphs: list[str]) -> str:
    """The template's sentence alone, or (every second case) with a test sentence before or after it."""
    if i % _PARAGRAPH == 0 or not paragraphs:
        return sentence
    other = d.rng.choice(paragraphs)
    return f"{other} {sentence}" if d.rng.random() < 0.5 else f"{sentence} {other}"


def span_cases(seed: int, cases: int, paragraphs: list[str]) -> list[Case]:
    """`cases` lines of each kind of span (KINDS), its forms taken in turn, each in one of its templates;
    `paragraphs` are the sentences put beside half of them."""
    fakers: dict[str, Faker] = {}
    out = []
    for kind, forms in FORMS.items():
        d = _Draw(seed, kind, fakers)
        for i in range(cases):
            form = forms[i % len(forms)]
            value = form.draw(d)
            out.append(Case(kind, _line(i, d.rng.choice(form.templates).format(value), d, paragraphs), value))
    return out


def name_cases(seed: int, cases: int, paragraphs: list[str], seen: Callable[[str], bool]) -> list[Case]:
    """Up to `cases` lines with a first name each, from Faker's names of NAME_LOCALES: distinct names for
    which `seen` is False (words the training data does not hold), each in one of NAME_TEMPLATES;
    fewer when the draws run out (a hundred a case)."""
    d = _Draw(seed, "name", {})
    names: list[str] = []
    for _ in range(100 * cases):
        if len(names) == cases:
            break
        name = d.fake(d.rng.choice(NAME_LOCALES)).first_name()
        if name not in names and not seen(name):
            names.append(name)
    return [Case("name", _line(i, d.rng.choice(NAME_TEMPLATES).format(name), d, paragraphs), name)
            for i, name in enumerate(names)]
