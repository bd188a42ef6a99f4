"""Browser end-to-end tests (a package, so its conftest and modules never shadow tests/ ones)."""
