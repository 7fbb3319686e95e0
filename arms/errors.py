"""The few error classes of offload-tuner.

Every message carries the offending value and the fix, on one line, so the CLI can print
``str(err)`` to stderr and exit with ``err.exit_code``.

    TunerError
     ├── ConfigError        bad input found before anything starts (exit 2)
     ├── HostError          the container host refused or failed (exit 1)
     └── MeasurementError   an engine could not be measured (exit 1)
"""
from __future__ import annotations


class TunerError(Exception):
    exit_code = 1


class ConfigError(TunerError):
    """Bad input: YAML, unknown lever or key, wrong type, floating tag, missing path."""

    exit_code = 2


class HostError(TunerError):
    """The container host (podman service, systemd) refused or failed an operation."""


class MeasurementError(TunerError):
    """An engine answered in a way that cannot be measured."""
