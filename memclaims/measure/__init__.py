"""Measuring a real run: the one pipeline (seed, data, load, optimizer, the training loop, accuracy,
the Record) over its engines (Fabric on one device, CPU ranks over gloo, CUDA ranks through
Lightning's FSDP), the probes that read memory per phase, the one Record builder (``record_builder``,
the sim's too), and the checks of what a run observed (techniques at work, a steady state, a
diagnosis of a memory failure).

May import ``core``, ``workloads``, ``techniques`` and ``recipes``. Callers go through ``memclaims.run.run_recipe``."""
