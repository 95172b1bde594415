"""What both CLIs share: user errors become one line on stderr and a non-zero
exit; a traceback only with --debug."""

from __future__ import annotations

import sys
import traceback

import click

from rkc.ir.errors import RkcError

EXIT_USER_ERROR = 1
EXIT_INTERNAL_ERROR = 70


class _ErrorReporting:
    """Mixin for click commands/groups: report errors in one line.

    The command must take the ``--debug`` flag (debug_option); with it,
    tracebacks are shown."""

    def invoke(self, ctx: click.Context):  # noqa: D401 - click API
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            sys.exit(0)
        except RkcError as exc:
            _report(ctx, f"error: {exc}", EXIT_USER_ERROR)
        except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            _report(ctx, f"error: {exc.strerror}: {exc.filename}", EXIT_USER_ERROR)
        except Exception as exc:  # a bug: still one line unless --debug
            _report(ctx, f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
                    EXIT_INTERNAL_ERROR)


class ErrorReportingGroup(_ErrorReporting, click.Group):
    pass


class ErrorReportingCommand(_ErrorReporting, click.Command):
    pass


def _report(ctx: click.Context, line: str, code: int) -> None:
    if ctx.obj and ctx.obj.get("debug"):
        traceback.print_exc()
    click.echo(line.splitlines()[0] if line else "error", err=True)
    sys.exit(code)


def debug_option(f):
    """--debug: store the flag where ErrorReportingGroup finds it."""

    def store(ctx: click.Context, _param, value: bool) -> bool:
        ctx.ensure_object(dict)["debug"] = value
        return value

    return click.option("--debug", is_flag=True, expose_value=False, is_eager=True,
                        callback=store, help="Show tracebacks for errors.")(f)
