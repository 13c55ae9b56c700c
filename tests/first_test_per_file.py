"""A pytest plugin (``-p tests.first_test_per_file``) that keeps only the first selected
test of each file: the strict-mode self-test runs one test per e2e file in one process."""

from __future__ import annotations

import pathlib

import pytest


@pytest.hookimpl(trylast=True)  # after ``-m`` has deselected what it deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselects every item but the first of its file."""
    seen: set[pathlib.Path] = set()
    kept, dropped = [], []
    for item in items:
        (dropped if item.path in seen else kept).append(item)
        seen.add(item.path)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
