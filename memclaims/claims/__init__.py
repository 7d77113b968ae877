"""The claims of every source as relations over Records: the catalogue (``catalogue``), each source's checks
(``sources``, one module per source file) and their shared machinery (``check``, ``ratio``, ``figures``), what a check
looks up (``lookup``: Records by key, measured by the caller through ``memclaims.run.run_recipe``), the
"keeps accuracy" pairs and their mutations, the published accuracies, and the verdicts of the last run.

May import ``core``, ``workloads``, ``techniques``, ``recipes`` and ``baselines``; never an engine (``memclaims.run``,
``memclaims.sim``, ``memclaims.measure``): a check reads Records, it runs nothing."""
