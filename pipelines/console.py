"""The console logger of every gnnflow run: Dagster's line format, each error on one line.

A failed step's event carries the error's stack trace and the chain of its causes; the
event log (the UI's run page) keeps all of it. In the terminal this logger prints the
error's first line (a `dagster.Failure` from gnnflow names the file, column or setting
and what to do) and leaves out the stack unless its `stack_traces` setting is on (`gnnflow
launch --verbose`). The run-failure event repeats the failed step's error; it is cut the
same way. Dagster uses a job's loggers only for runs whose run config names them
(`loggers: {console: {config: {...}}}`, which `gnnflow launch` passes); other runs print
Dagster's default console lines.
"""

from __future__ import annotations

import logging
import sys

import dagster as dg

STACK_MARKER = "\nStack Trace:"
FORMAT = "%(asctime)s - %(name)s - %(levelname)s - %(message)s"


def without_stack(message: str) -> str:
    """The message up to its first stack trace, blank lines dropped."""
    head = message.split(STACK_MARKER, 1)[0]
    return "\n".join(line for line in head.splitlines() if line.strip())


class OneLineErrors(logging.Filter):
    """Cuts each record's message at its first stack trace (the event log keeps the whole error)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if STACK_MARKER in message:
            record.msg, record.args = without_stack(message), None
        return True


@dg.logger(
    {
        "log_level": dg.Field(str, is_required=False, default_value="INFO", description="The logger's threshold."),
        "name": dg.Field(str, is_required=False, default_value="dagster", description="The logger's name."),
        "stack_traces": dg.Field(
            bool, is_required=False, default_value=False, description="Print errors with their stack traces."
        ),
    },
    description="Dagster's console lines, each error on one line unless stack_traces is on.",
)
def console_logger(init_context) -> logging.Logger:
    logger = logging.Logger(init_context.logger_config["name"], level=init_context.logger_config["log_level"].upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT, "%Y-%m-%d %H:%M:%S %z"))
    if not init_context.logger_config["stack_traces"]:
        handler.addFilter(OneLineErrors())
    logger.addHandler(handler)
    return logger
