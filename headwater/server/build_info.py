"""What this server is: the installed distribution's version, for SERVER_INFO, the status page,
/metrics and `headwater --version` (one answer everywhere, also when running from a checkout that
was never installed)."""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    """pyproject.toml's version once installed; "unknown (not installed)" from a bare checkout."""
    try:
        return metadata.version("headwater")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"
