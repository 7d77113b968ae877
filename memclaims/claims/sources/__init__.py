"""The checks of each claim source, one module per file of ``memclaims/resources/sources/`` (``article.py`` for
``article.json``, ``pytorch_docs.py`` for ``pytorch-docs.json``): each holds its ``DOCUMENT`` name and the
``CHECKS`` of its claims, by claim id, with the constants and relations they read. ``memclaims.claims.catalogue``
joins them to the catalogue's entries.

May import what ``memclaims.claims`` may (``core``, ``workloads``, ``recipes``, ``baselines``, ``techniques``' contract
and registry) and the shared machinery of ``memclaims.claims``; never a particular technique module: what a
technique observed is read from the Record (its ``by_technique`` part)."""
