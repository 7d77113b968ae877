"""Every technique, the article's chain and a pairwise cover, as its own case on each tier.

The test is the library's (``memclaims.pytest.cases.test_case``), imported as a user project
imports it; the plugin parametrizes it (``--memclaims-matrix``, ``--memclaims-workload``).
"""

from memclaims.pytest.cases import test_case  # noqa: F401
