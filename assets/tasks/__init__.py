"""The built-in tasks (a dataset's gnnflow.yaml ``task:``), one module each: its traits and its
part of the stages that differ by task. `assets.task_registry` imports every module here on its
first lookup, so a new task is a new module in this folder."""
