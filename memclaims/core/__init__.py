"""The facts every other part builds on: errors, the technique registry, precisions, the Record and
its memory categories, the machine and environment, the published numbers and the packaged data.
A class by its import path, imported when asked for (``targets.py``: a stack's driver).

Imports nothing from memclaims outside ``core`` (and torch only lazily, where a fact needs it)."""
