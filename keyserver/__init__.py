"""Strongroom's key server."""

from __future__ import annotations


def product_version() -> str:
    """The installed release (pyproject's version): the OpenAPI document's version and
    the one a backup's manifest names."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("strongroom")
    except PackageNotFoundError:
        return "unknown"
