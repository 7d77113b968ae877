"""Workloads: a model and its data at a named scale (the ViTs, the text models, ``hf:`` models, the
user's own), and the offline data they train on.

May import ``core``."""
