"""Your ClientApp: your model, data and training loop, with a fednorm method's client side.

``MethodClient`` loads the model with what the server sent and this node's own tensors (FedBN's
BatchNorm stays here), runs the method's code around your loop (HBN's statistics pass, FBN's
statistics), and builds the reply. The method and its options come from the server's messages.
"""

from __future__ import annotations

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fednorm.flower import MethodClient

from .task import load_data, make_model, test, train

app = ClientApp()
client = MethodClient()  # no method given: build the one the server names, with its options


def _data(context: Context):
    return load_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))


@app.train()
def train_handler(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    model = make_model(client.method_name(msg))
    (x, y), _ = _data(context)
    round_ = client.begin(msg, context, model, x, y)  # model loaded; HBN's statistics pass runs here
    seed = 1000 * int(config["server-round"]) + int(context.node_config["partition-id"])
    loss = train(model, x, y, epochs=int(config["local-epochs"]), lr=float(config["lr"]),
                 batch_size=int(config["batch-size"]), seed=seed, loss_hook=round_.loss)
    return round_.reply(metrics={"train-loss": loss})  # shared tensors and uploads; local ones stay here


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    model = client.load(msg, context, make_model(client.method_name(msg)))  # FedBN: with this node's own BatchNorm
    _, (x, y) = _data(context)
    loss, accuracy = test(model, x, y)
    metrics = MetricRecord({"eval-loss": loss, "eval-accuracy": accuracy, "num-examples": len(y)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


@app.query("fednorm")
def query_handler(msg: Message, context: Context) -> Message:
    """The method's statistics queries (HBN's initial pass, re-sync and round T+1; FBN's initial pass)."""
    (x, y), _ = _data(context)
    return client.answer(msg, context, make_model(client.method_name(msg)), x, y)
