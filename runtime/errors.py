"""One error family. Every CLI catches SpecedgeError once and exits 2 with its message; the API
raises the child that names what went wrong. Messages name the problem and the fix."""
from __future__ import annotations


class SpecedgeError(Exception):
    """Base of every error specedge raises on purpose."""


class ConfigError(SpecedgeError, ValueError):
    """A bad generation or sampling parameter, or a bad prompt; the message names it and the valid range."""


class BundleError(SpecedgeError, ValueError):
    """A bundle that cannot be used as it is."""


class EngineError(SpecedgeError, RuntimeError):
    """A graph that cannot be loaded or run."""


class ExportError(SpecedgeError, ValueError):
    """Bad input to spec-export."""


class BusyError(SpecedgeError, RuntimeError):
    """A decoder used while this thread's own request is still open: a decoder serves one request at
    a time, and a stream holds it until it ends or is closed."""
