"""Console output and user-facing errors for the deepinfer tool.

Every message a user sees goes through :data:`console` (stdout) or :data:`err_console`
(stderr). Failures a user can act on are raised as :class:`DeepinferError`; the CLI prints
them with their hint and exits non-zero without a traceback.
"""
from __future__ import annotations

from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


class DeepinferError(Exception):
    """An error the user can act on.

    ``message`` says what went wrong; ``hint`` (optional) says what to do about it;
    ``details`` (optional) is a list of lines printed between the two (for example one line
    per failing patch).
    """

    def __init__(self, message: str, hint: str | None = None,
                 details: list[str] | None = None, exit_code: int = 1):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = list(details or [])
        self.exit_code = exit_code

    def __str__(self) -> str:
        parts = [self.message, *self.details]
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n".join(parts)


def report_error(exc: DeepinferError) -> None:
    """Print a :class:`DeepinferError` to stderr in the tool's format."""
    console.file.flush()
    err_console.print(f"[bold red]error:[/] {exc.message}", soft_wrap=True)
    for line in exc.details:
        err_console.print(line, soft_wrap=True, markup=False)
    if exc.hint:
        err_console.print(f"[yellow]hint:[/] {exc.hint}", soft_wrap=True)


def info(msg: str) -> None:
    console.print(msg, soft_wrap=True)


def warn(msg: str) -> None:
    console.file.flush()
    err_console.print(f"[yellow]warning:[/] {msg}", soft_wrap=True)
