"""The facts every other part builds on: errors, precisions, the Record and its memory categories, the names of
the contract, the machine and environment, the published numbers and the packaged data, the option table,
progress bars and "did you mean"; a class by its import path, imported when asked for (``targets.py``: a stack's
driver). (The technique registry is ``memclaims.techniques.technique_registry``'s.)

May import nothing of memclaims outside ``core`` (torch only lazily, where a fact needs it)."""
