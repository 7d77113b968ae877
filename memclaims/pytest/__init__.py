"""The pytest side: the plugin (entry point ``memclaims``), its options, the environment preflight,
the fixtures (record cache, baseline check, claim recorder), the technique matrix's test, and the
helpers for testing a project built on it. The only subpackage that imports pytest.

May import every other subpackage."""
