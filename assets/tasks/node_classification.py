"""task: node_classification (the default): a class per node, learned from the labelled training
nodes. The shards' minibatches grow around the training nodes (every one once per epoch), the
model is trained by torchrun DDP (`assets.trained_model.train_node_classification`), evaluated on
the labelled test nodes against the promoted model (`assets.evaluation.evaluate_node_classification`),
promoted when it passes, and scores every node (the predictions asset)."""

from assets.evaluation import decide_node_promotion, evaluate_node_classification
from assets.task_registry import Task, TaskTraits, register_task
from assets.trained_model import train_node_classification
from graphs.formats.shard_manifest import NODE_CLASSIFICATION
from graphs.sampling import write_minibatch_shards


@register_task
class NodeClassification(Task):
    name = NODE_CLASSIFICATION
    traits = TaskTraits(holds_out_edges=False, needs_labels=True, seeds="nodes")
    typed_defaults = {"model.conv": "rgcn"}  # a typed graph trains R-GCN over its relations

    @classmethod
    def write_shards(cls, inputs, out, cfg, *, canonical, log):
        return write_minibatch_shards(inputs, out, cfg, log=log)

    @classmethod
    def train(cls, context, config, storage, dataset, config_metadata):
        return train_node_classification(context, config, storage, dataset, config_metadata)

    @classmethod
    def evaluate(cls, context, storage, dataset):
        return evaluate_node_classification(context, storage, dataset)

    @classmethod
    def decide_promotion(cls, storage, dataset, record, cfg):
        return decide_node_promotion(storage, dataset, record, cfg)
