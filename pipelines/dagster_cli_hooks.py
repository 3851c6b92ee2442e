"""What gnnflow adds to Dagster's own command line (`dagster asset materialize`, `dagster job
execute`, `dagster-daemon`) when it loads `pipelines.definitions`: the last lines say what went
wrong (a missing DAGSTER_HOME, a dataset that is not a registered partition, each failed step's
one-line cause), and two notices about Dagster's internals are filtered. `gnnflow launch` and
`gnnflow backfills` print the same causes.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

DAGSTER_HOME_MISSING = (
    "DAGSTER_HOME is not set, so Dagster uses a throw-away instance that knows no dataset partitions "
    "and keeps no run history; export DAGSTER_HOME=$PWD/.dagster_home (the one the Makefile, make demo and "
    "make ui use) and run `gnnflow datasets sync` before the dagster command"
)
DATASETS_SYNC_HINT = "run `gnnflow datasets sync` to register the landing folders as dataset partitions"


def failure_causes(instance, runs) -> list[str]:
    """One line per failed step of `runs`: the step, the dataset and the cause (a
    `dagster.Failure`'s description, which names the file and column for bad input; else the
    innermost error's first line)."""
    import dagster as dg

    lines = []
    for run in runs:
        where = f" ({run.tags['dagster/partition']})" if "dagster/partition" in run.tags else ""
        for record in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
            event = record.dagster_event
            lines.append(f"{event.step_key}{where} failed: {_cause(event.step_failure_data)}")
    return lines


def _cause(data) -> str:
    if data.user_failure_data is not None and data.user_failure_data.description:
        return data.user_failure_data.description
    err = data.error
    while err is not None and err.cause is not None:
        err = err.cause
    return err.message.strip().splitlines()[0] if err is not None else "unknown error"


def warn_if_dagster_home_missing() -> None:
    """In the `dagster` CLI: say what is wrong as the last line the user sees, when DAGSTER_HOME
    is not set (Dagster then runs against a throw-away instance and fails with a partition error
    that does not mention it) or when the `--partition` given is not a registered dataset
    partition (a forgotten `gnnflow datasets sync`; Dagster's own error is a long traceback)."""
    if Path(sys.argv[0]).name not in ("dagster", "dagster-daemon"):
        return
    if not os.environ.get("DAGSTER_HOME"):
        atexit.register(lambda: print(f"gnnflow: {DAGSTER_HOME_MISSING}", file=sys.stderr))
        return
    args = sys.argv[1:]
    if "--partition" in args[:-1]:
        atexit.register(_hint_unregistered, args[args.index("--partition") + 1])


def _hint_unregistered(partition: str) -> None:
    import dagster as dg

    from assets.common import dataset_partitions  # lazy: all of assets/ and Dagster, +1.8 s

    try:
        with dg.DagsterInstance.get() as instance:
            known = instance.get_dynamic_partitions(dataset_partitions.name)
    except Exception:  # never mask Dagster's own exit with ours
        return
    if partition not in known:
        print(
            f"gnnflow: dataset {partition[:80]!r} is not a registered partition; {DATASETS_SYNC_HINT}", file=sys.stderr
        )


def quiet_dagster_notices() -> None:
    """Ignore two notices about Dagster's own internals that a gnnflow user can do nothing about.

    Filtered by their message, not their category, so every other beta / preview warning still
    shows. Called when `pipelines.definitions` loads, i.e. in the `dagster` CLI before it parses
    `--select`, and in every step worker:
    - `--select '*'` resolves through ``AssetSelection.all(include_sources=...)``, a beta parameter;
    - trained_model's pipes session reads ``PipesMessageReader.expected_writer_count``, a preview
      property.
    (`dagster asset materialize` itself is "superseded" by `dg launch` of the separate dagster-dg-cli
    package; that notice comes before any project code loads, so the Makefile's demo target filters it.)
    """
    import warnings

    import dagster as dg

    warnings.filterwarnings("ignore", r"Parameter `include_sources` of function `AssetSelection\.all`", dg.BetaWarning)
    warnings.filterwarnings("ignore", r"Function `PipesMessageReader\.expected_writer_count`", dg.PreviewWarning)


def summarize_failures_at_exit() -> None:
    """In `dagster asset materialize` / `dagster job execute`: after Dagster's "Materialization
    failed" and its tracebacks, print each failed step's one-line cause as the last lines."""
    if Path(sys.argv[0]).name != "dagster" or not os.environ.get("DAGSTER_HOME"):
        return
    if not ({"materialize", "execute"} & set(sys.argv[1:3])):
        return
    since = time.time()

    def report() -> None:
        import dagster as dg

        try:
            with dg.DagsterInstance.get() as instance:
                after = datetime.fromtimestamp(since, tz=timezone.utc)
                runs = instance.get_runs(
                    filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], created_after=after)
                )
                lines = failure_causes(instance, runs)
        except Exception:  # never mask Dagster's own exit with ours
            return
        for line in lines:
            print(f"gnnflow: {line}", file=sys.stderr)

    atexit.register(report)
