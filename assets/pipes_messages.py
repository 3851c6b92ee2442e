"""A dagster-pipes message reader that never parses half a message.

`PipesSubprocessClient`'s default reader tails a temporary file with ``readline()`` and parses
every line it gets. When the reader catches up with the writer in the middle of a write (seen
on this machine under load: a training log line cut at character 169), ``readline()`` returns
the line's first part, ``json.loads`` fails, the reader thread dies, and every later message of
the run is lost: the trained model's metrics never reach the materialization, the "closed"
message neither (Dagster then warns that messages may have been discarded). This reader keeps a
partial line until its newline arrives. trained_model passes it to the client.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import dagster as dg
from dagster_pipes import PipesParams

__all__ = ["WholeLineMessageReader", "whole_lines"]


def whole_lines(path: str | os.PathLike, should_stop: Callable[[], bool], poll_s: float = 0.01) -> Iterator[str]:
    """Lines appended to `path` as they are completed (the newline written), until `should_stop()`
    is true once everything written so far has been read; a last line without a newline (a writer
    that died mid-line) is yielded then."""
    pending = ""
    with open(path, encoding="utf-8") as stream:
        while True:
            part = stream.readline()
            if part:
                pending += part
                if pending.endswith("\n"):
                    yield pending
                    pending = ""
            elif should_stop():
                if pending:
                    yield pending
                return
            else:
                time.sleep(poll_s)


class _WholeLineFileReader(dg.PipesFileMessageReader):
    def _reader_thread(self, handler, is_resource_complete) -> None:  # the one method that tails the file
        try:
            for line in whole_lines(self._path, is_resource_complete.is_set):
                handler.handle_message(json.loads(line))
        except:  # noqa: E722 (as Dagster's own reader: report anything, then re-raise)
            handler.report_pipes_framework_exception(f"{type(self).__name__} reader thread", sys.exc_info())
            raise


class WholeLineMessageReader(dg.PipesTempFileMessageReader):
    """`PipesTempFileMessageReader` (a file in a temporary folder) that parses whole lines only."""

    @contextmanager
    def read_messages(self, handler) -> Iterator[PipesParams]:
        with tempfile.TemporaryDirectory() as folder:
            reader = _WholeLineFileReader(
                os.path.join(folder, "messages"), include_stdio_in_messages=self._include_stdio_in_messages
            )
            with reader.read_messages(handler) as params:
                yield params
