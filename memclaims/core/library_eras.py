"""Library eras: older releases of the libraries that move memory whose difference the sim can replay.

The sim runs the installed libraries' own code on fake tensors, so a prediction replays the installed releases of
torch, bitsandbytes, peft and transformers (``LIBRARIES``), except where its profile names an older torch (the
profiles ``article`` and ``torch-2.1``: torch's eras are profiles, ``memclaims.sim.profiles``) or an era of
``ERAS`` is asked for (``--era bitsandbytes=0.41``, ``--memclaims-era``). An era is here only where the
difference is known and sourced: a release range, what it changes in a prediction, where that is written, and
the import path of what replays it on the sim (a context manager, entered around the replay). A release no era
covers is refused with what is known, never replayed as the installed one in silence.

The profile of a prediction with eras is named ``BASE+ERA`` (``current+bitsandbytes=0.39.0-0.43.1``): the name
is its Record's probe and its baselines' environment (``sim-current-bitsandbytes-0.39.0-0.43.1``), so such
Records never meet the installed releases' baselines.

Data and parsing only: the option table (``memclaims.core.settings``) checks the words before torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from packaging.version import InvalidVersion, Version

from memclaims.core.errors import UsageError

# The libraries whose releases decide what a training step allocates, as a prediction states them.
LIBRARIES = ("torch", "bitsandbytes", "peft", "transformers")
SEPARATOR = "+"  # between a profile's name and its eras' names


@dataclass(frozen=True)
class LibraryEra:
    """Releases ``first`` to ``last`` of ``library``, which allocated differently from today's in one known way."""

    library: str
    first: str
    last: str
    changes: str  # what the era changes in a prediction, in a phrase
    reference: str  # the source in a few words, for a one-line refusal
    source: str  # where the difference is written (changelog, pull request, the code of a release before and after)
    replay: str  # "module:function", a context manager that makes the installed code allocate as the era did

    @property
    def name(self) -> str:
        return f"{self.library}={self.first}-{self.last}"

    def covers(self, release: Version) -> bool:
        return Version(self.first) <= release <= Version(self.last)

    def describe(self) -> str:
        """``bitsandbytes 0.39.0-0.43.1: <changes> (<reference>)``: in a profile's summary, a Record's first note."""
        return f"{self.library} {self.first}-{self.last}: {self.changes} ({self.reference})"


ERAS: tuple[LibraryEra, ...] = (
    LibraryEra(
        "bitsandbytes", "0.39.0", "0.43.1",
        changes="MatMul4Bit.forward keeps its input A (in the layer's compute dtype) on ctx for a backward that "
                "never reads it, in every Linear4bit whose input needs a gradient (with LoRA: the frozen 4-bit base "
                "layers), until the autograd graph is freed (the loop drops the loss), not at the layer's backward",
        reference="bitsandbytes PR #1270, released in 0.43.2",
        source="bitsandbytes PR #1270 'fix QLoRA mem bug: delete useless buffered activation', released in 0.43.2 "
               "(its CHANGELOG: 'QLoRA mem bug'); MatMul4Bit in bitsandbytes/autograd/_functions.py sets ctx.tensors "
               "= (A, B) from 0.39 (the first 4-bit release) to 0.43.1, (None, B) from 0.43.2",
        replay="memclaims.sim.library_eras:matmul4bit_keeps_input",
    ),
)
BY_NAME = {era.name: era for era in ERAS}


def known() -> str:
    """What can be asked for, in one phrase (the end of every refusal)."""
    return ("known eras: " + "; ".join(f"{era.library}={era.first} to {era.last} ({era.reference})" for era in ERAS)
            + "; torch's eras are sim profiles (--sim-profile article: the 2023-06 nightly, torch-2.1: the 2.1.0 "
              "release)")


def era_of(word: str) -> LibraryEra:
    """The era ``LIBRARY=RELEASE`` asks for (``bitsandbytes=0.41``); UsageError, in one line with what is known,
    for anything else: another shape, a library the sim does not replay, a release no era covers."""
    library, sep, release = word.strip().partition("=")
    library, release = library.strip().lower(), release.strip()
    if not sep or not library or not release:
        raise UsageError(f"expected LIBRARY=RELEASE (e.g. bitsandbytes=0.41), got {word!r}; {known()}")
    if library not in LIBRARIES:
        raise UsageError(f"{library!r} is not a library whose memory the sim replays ({', '.join(LIBRARIES)}); "
                         f"{known()}")
    if library == "torch":
        raise UsageError(f"torch={release}: torch's eras are sim profiles, not --era; {known()}")
    try:
        version = Version(release)
    except InvalidVersion:
        raise UsageError(f"{library}={release}: {release!r} is not a release number; {known()}") from None
    for era in ERAS:
        if era.library == library and era.covers(version):
            return era
    raise UsageError(f"{library}={release}: no difference from the installed {library} is known in what the sim "
                     f"replays; {known()}")


def profile_name(base: str, asked: tuple[str, ...] = ()) -> str:
    """The name of profile ``base`` with the eras ``asked`` (``LIBRARY=RELEASE`` words, or several separated by
    commas): ``base`` alone when none is asked; one era per library (two for one library is a UsageError)."""
    eras = [era_of(word) for text in asked for word in text.split(",") if word.strip()]
    libraries = [era.library for era in eras]
    for library in LIBRARIES:
        if libraries.count(library) > 1:
            raise UsageError(f"{library} is named {libraries.count(library)} times; one era per library")
    return SEPARATOR.join([base, *sorted({era.name for era in eras})])


def split(name: str) -> tuple[str, tuple[LibraryEra, ...]]:
    """(base profile, eras) of a profile's name (``profile_name``'s inverse); UsageError for an unknown era."""
    base, *names = name.split(SEPARATOR)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise UsageError(f"sim profile {name!r}: unknown era {unknown[0]!r}; {known()}")
    return base, tuple(BY_NAME[n] for n in names)


def installed(library: str) -> str | None:
    """The installed release of ``library``, or None where it is not installed."""
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return None


def releases(torch_era: str, eras: tuple[LibraryEra, ...]) -> dict[str, str]:
    """The release of each of ``LIBRARIES`` a prediction replays: ``torch_era`` for torch (a profile's; its
    ``installed`` is the installed torch), an era's range where one is asked, else the installed release."""
    replayed = {era.library: f"{era.first}-{era.last}" for era in eras}
    out: dict[str, str] = {}
    for library in LIBRARIES:
        if library == "torch" and torch_era != "installed":
            out[library] = torch_era
        elif library in replayed:
            out[library] = replayed[library]
        else:
            out[library] = f"{installed(library) or 'not installed'} (installed)"
    return out
