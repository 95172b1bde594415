"""Errors a user can cause (bad file, unsupported op, shape that does not fit).

The CLIs print these as one line and exit non-zero; anything else is a bug."""


class RkcError(Exception):
    """A user-facing error: its message is the one line the CLI prints."""


class OptionError(RkcError):
    """A command-line option that does not apply to this model or precision, or a bad value."""


class FormatError(RkcError):
    """A file is truncated, corrupt or not of the expected kind."""


class UnsupportedError(RkcError):
    """The model uses something rkc cannot compile or run."""


class VerifyError(RkcError):
    """A graph or program is inconsistent (dangling tensor, cycle, shape mismatch...)."""


class RegisterError(RkcError):
    """A register write names an unknown register/field or a value that does not fit."""
