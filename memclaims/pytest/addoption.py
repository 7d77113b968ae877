"""The command-line and ini options of memclaims' pytest plugin, registered from the one table of
options (``memclaims.core.settings.OPTIONS``) that the ``memclaims`` command line reads too.

Imports nothing but pytest and that table (data only): the plugin registers them before its
environment preflight has looked at the stack, so that with a broken install a command line naming
them still reaches the preflight's one line instead of an "unrecognized arguments" error.

No ``choices`` or ``type`` here: pytest's argparse would answer a bad value with its usage text;
``memclaims.pytest.plugin`` checks every value once, in pytest_configure, and a bad one is one line.
"""

from __future__ import annotations

import pytest

from memclaims.core.settings import MATRICES, OPTIONS, help_for, metavar_for, text_default

SELECTIONS = MATRICES  # the names --memclaims-matrix takes


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memclaims", "memclaims: memory-claim regression cases")
    for option in OPTIONS:
        if option.pytest:
            kwargs: dict[str, object] = {"dest": option.pytest_dest,
                                      "help": help_for(option, "pytest").replace("%", "%%")}
            if option.kind != "flag":
                kwargs.update(default=None, metavar=metavar_for(option))
            elif option.in_ini:  # unset on the command line: the ini file decides
                kwargs.update(default=None, action="store_const", const="true")
            else:
                kwargs.update(default=False, action="store_true")
            try:
                group.addoption(option.pytest_option, *option.pytest_aliases, **kwargs)
            except ValueError:  # an alias the other plugin registers itself (pytest-regressions installed): its own
                group.addoption(option.pytest_option, **kwargs)
        if option.in_ini and option.kind == "lines":
            parser.addini(option.ini_name, help_for(option, "ini"), type="linelist", default=text_default(option))
        elif option.in_ini:
            parser.addini(option.ini_name, help_for(option, "ini"), default=text_default(option))
