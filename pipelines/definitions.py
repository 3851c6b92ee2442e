"""The gnnflow code location: `dagster dev` (see workspace.yaml) and
`dagster asset materialize -m pipelines.definitions --select ... --partition NAME` load `defs`.
"""

import dagster as dg

from assets.canonical_graph import canonical_graph
from assets.common import GnnflowStorage
from assets.compressed_graph import compressed_graph
from assets.distdgl_model import distdgl_model
from assets.evaluation import evaluation, promotion
from assets.metis_partitions import metis_partitions
from assets.minibatch_shards import minibatch_shards
from assets.normalized_adjacency import normalized_adjacency
from assets.predictions import predictions
from assets.trained_model import trained_model
from pipelines.console import console_logger
from pipelines.dagster_cli_hooks import quiet_dagster_notices, summarize_failures_at_exit, warn_if_dagster_home_missing
from pipelines.schedules import make_retrain_schedule
from pipelines.sensors import make_landing_sensor

warn_if_dagster_home_missing()
summarize_failures_at_exit()

quiet_dagster_notices()

ALL_ASSETS = [
    canonical_graph,
    normalized_adjacency,
    metis_partitions,
    compressed_graph,
    minibatch_shards,
    trained_model,
    evaluation,
    promotion,
    predictions,
]

pipeline_job = dg.define_asset_job(
    "gnnflow_pipeline",
    selection=dg.AssetSelection.assets(*ALL_ASSETS),
    description="Every stage for one dataset partition, ending with predictions from the model promotion decided on.",
)

ingest_job = dg.define_asset_job(
    "ingest",
    selection=dg.AssetSelection.groups("ingest"),
    description="Validate and relabel a dataset's raw edge lists (canonical_graph).",
)

train_job = dg.define_asset_job(
    "train",
    selection=dg.AssetSelection.groups("training") | dg.AssetSelection.assets(predictions),
    description="Train the GNN from a dataset's minibatch shards, evaluate it, promote it when not worse, score "
    "the dataset with the promoted model (trained_model, evaluation, promotion, predictions).",
)

preprocess_job = dg.define_asset_job(
    "preprocess",
    selection=dg.AssetSelection.assets(minibatch_shards).upstream(),
    description="Everything before training: canonical_graph through minibatch_shards.",
)

retrain_job = dg.define_asset_job(
    "retrain",
    # predictions waits for promotion (its dependency), so it scores with the model just decided on
    selection=dg.AssetSelection.assets(minibatch_shards).downstream(),
    description="New samples onwards: minibatch_shards, trained_model, evaluation, promotion, predictions "
    "(what the retraining schedule runs).",
)

predict_job = dg.define_asset_job(
    "predict",
    selection=dg.AssetSelection.assets(predictions),
    description="Score a dataset's current landing files with its promoted (else latest) trained model, "
    "without retraining and without replacing the published canonical_graph (see assets.predictions).",
)

distdgl_job = dg.define_asset_job(
    "distdgl_training",
    selection=dg.AssetSelection.assets(distdgl_model),
    description="Train with DistDGL on one machine per METIS part (distdgl_model; its run config names the "
    "machines), from the dataset's metis_partitions.",
)

defs = dg.Definitions(
    assets=[*ALL_ASSETS, distdgl_model],
    jobs=[pipeline_job, ingest_job, train_job, preprocess_job, retrain_job, predict_job, distdgl_job],
    schedules=[make_retrain_schedule(retrain_job)],
    sensors=[make_landing_sensor(ALL_ASSETS)],
    resources={"storage": GnnflowStorage.from_env()},
    loggers={"console": console_logger},  # errors on one line in the terminal (pipelines.console)
    # each step is forked from a server that imported this code location once: a spawned process
    # per step re-imported torch, DGL and Dagster (~4.5 s each; Cora's whole pipeline 86 s -> 42 s),
    # and unlike the in-process executor a step's memory still goes back when it ends (measured at
    # 10M edge rows: one process for every step peaked at 5.5 GiB, the largest single step 3.3 GiB);
    # matplotlib too, which the plotting steps (canonical_graph, metis_partitions, evaluation)
    # would each import again (~0.3-0.5 s; `graphs.infra.plotting` picks the Agg backend on first use)
    executor=dg.multiprocess_executor.configured(
        {"start_method": {"forkserver": {"preload_modules": ["pipelines.definitions", "matplotlib.pyplot"]}}}
    ),
)
