"""``memclaims.core.library_eras``: the release words users type, the refusals, a profile's name with eras, the
releases a prediction states; and the option that takes them (``--era``, ``--memclaims-era``)."""

from __future__ import annotations

import pytest

from memclaims.core import library_eras
from memclaims.core.errors import UsageError
from memclaims.core.settings import OPTIONS, BadValue, parse, text_default

BNB_OLD = "bitsandbytes=0.39.0-0.43.1"
ERA_OPTION = next(option for option in OPTIONS if option.name == "era")


@pytest.mark.parametrize("word", ["bitsandbytes=0.41", "bitsandbytes=0.39", "bitsandbytes=0.43.1", "bitsandbytes=v0.42.0",
                                  " BitsAndBytes = 0.40.2 "])
def test_a_release_the_era_covers_is_that_era(word: str) -> None:
    assert library_eras.era_of(word).name == BNB_OLD


@pytest.mark.parametrize(("word", "says"), [
    ("bitsandbytes=0.43.2", "no difference from the installed bitsandbytes is known"),  # the fix's release
    ("bitsandbytes=0.38", "no difference from the installed bitsandbytes is known"),  # before 4-bit existed
    ("peft=0.10", "no difference from the installed peft is known"),
    ("accelerate=0.20", "'accelerate' is not a library whose memory the sim replays"),
    ("torch=2.1", "torch's eras are sim profiles"),
    ("bitsandbytes=new", "'new' is not a release number"),
    ("bitsandbytes", "expected LIBRARY=RELEASE"),
])
def test_anything_else_is_refused_in_one_line_that_lists_what_is_known(word: str, says: str) -> None:
    with pytest.raises(UsageError) as refused:
        library_eras.era_of(word)
    message = str(refused.value)
    assert says in message and "\n" not in message
    assert "known eras: bitsandbytes=0.39.0 to 0.43.1 (bitsandbytes PR #1270" in message


def test_a_profiles_name_carries_its_eras_and_splits_back() -> None:
    assert library_eras.profile_name("current") == "current"
    name = library_eras.profile_name("current", ("bitsandbytes=0.41",))
    assert name == f"current+{BNB_OLD}"
    assert library_eras.split(name) == ("current", (library_eras.BY_NAME[BNB_OLD],))
    with pytest.raises(UsageError, match="bitsandbytes is named 2 times"):
        library_eras.profile_name("current", ("bitsandbytes=0.41,bitsandbytes=0.42",))
    with pytest.raises(UsageError, match="unknown era 'peft=1-2'"):
        library_eras.split("current+peft=1-2")


def test_the_releases_stated_are_the_installed_ones_but_where_an_era_or_the_profile_says() -> None:
    today = library_eras.releases("installed", ())
    assert list(today) == ["torch", "bitsandbytes", "peft", "transformers"]
    assert today["peft"] == f"{library_eras.installed('peft')} (installed)"
    old = library_eras.releases("2.1.0 nightly 2023-06-23", (library_eras.BY_NAME[BNB_OLD],))
    assert old["torch"] == "2.1.0 nightly 2023-06-23" and old["bitsandbytes"] == "0.39.0-0.43.1"
    assert old["transformers"] == today["transformers"]


def test_the_option_takes_commas_or_repeats_and_refuses_in_the_tables_terms() -> None:
    assert parse(ERA_OPTION, "bitsandbytes=0.41") == ("bitsandbytes=0.41",)  # pytest's option, given once
    assert parse(ERA_OPTION, ["bitsandbytes=0.41"]) == ("bitsandbytes=0.41",)  # the command line's repeats
    assert parse(ERA_OPTION, text_default(ERA_OPTION)) == ()  # the ini file's default reads back as none
    with pytest.raises(BadValue, match="no difference from the installed bitsandbytes"):
        parse(ERA_OPTION, "bitsandbytes=0.44")
