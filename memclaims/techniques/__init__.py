"""The techniques: each one module, ``<name>.py``, owning its registry entry and what it does to a run.

(The full account of the hooks and of where the line to the recipe's core fields lies is written below,
once the techniques have moved.)
"""
