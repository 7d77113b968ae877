"""Recipes: a workload at a scale with its techniques, resolved and validated; the named recipes of the
documents; what a measurement is asked for besides the recipe (``RunOptions``); what a case needs
from the machine.

May import ``core``, ``workloads`` and ``techniques``."""
