"""``personalized_test: whole``: personalized models (FedBN, SiloBN) scored on the whole test set,
averaged over clients (FedTAN's Table 1), beside the default own-split scores."""

import pytest

from fednorm.config import ExperimentConfig
from fednorm.engine.evaluation import evaluate
from fednorm.engine.personalized_eval import whole_test_scores
from fednorm.engine.simulator import Simulation
from fednorm.errors import ConfigError

QUICK = dict(dataset="digits", model="mlp", norm="bn", rounds=1, local_steps=2, batch_size=16, threads=1,
             checkpoint_every=0, eval_every=1, seed=0)


def _sim(**kw) -> Simulation:
    sim = Simulation(ExperimentConfig(**{**QUICK, **kw}))
    sim.step()
    return sim


@pytest.mark.parametrize("method", ["fedbn", "silobn"])
def test_one_client_whole_test_score_equals_its_own_split_score(method: str) -> None:
    """One client holding every class: its own test split is the whole test set."""
    sim = _sim(method=method, partition="iid", num_clients=1, personalized_test="whole")
    assert sim.method.personalized
    assert len(sim.data.client_test[0]) == len(sim.data.test_y)
    res = sim.evaluate()
    assert res["test_accuracy"] == res["mean_client_accuracy"] == res["client_accuracies_whole_test"][0]
    own = _sim(method=method, partition="iid", num_clients=1).evaluate()
    assert res["test_accuracy"] == own["test_accuracy"]
    assert res["test_loss"] == pytest.approx(own["test_loss"], rel=1e-9)


def test_several_clients_average_their_models_on_the_whole_test_set() -> None:
    kw = dict(method="fedbn", partition="classes", classes_per_client=2, num_clients=4)
    whole_sim, own_sim = _sim(personalized_test="whole", **kw), _sim(**kw)
    whole, own = whole_sim.evaluate(), own_sim.evaluate()
    state = whole_sim.method.evaluation_state(whole_sim)
    direct = [evaluate(whole_sim.client_model(c, state), whole_sim.data.test_x, whole_sim.data.test_y).accuracy
              for c in range(4)]
    assert whole["client_accuracies_whole_test"] == pytest.approx(direct, abs=0)
    assert whole["test_accuracy"] == pytest.approx(sum(direct) / 4, abs=1e-15)
    # training and the own-split scores are the same runs'; only test_accuracy/test_loss change meaning
    assert whole["client_accuracies"] == own["client_accuracies"]
    assert whole["mean_client_accuracy"] == own["mean_client_accuracy"]
    assert "client_accuracies_whole_test" not in own
    # two-class clients score about their share of a ten-class test set on it, not their own-split accuracy
    assert whole["test_accuracy"] < own["test_accuracy"]


def test_a_method_with_one_global_model_is_unchanged() -> None:
    kw = dict(method="fedavg", partition="classes", classes_per_client=2, num_clients=4)
    whole, own = _sim(personalized_test="whole", **kw).evaluate(), _sim(**kw).evaluate()
    assert whole["test_accuracy"] == own["test_accuracy"] and "client_accuracies_whole_test" not in whole


def test_clients_hosted_elsewhere_are_refused() -> None:
    class Elsewhere(Simulation):  # a runtime that answers client queries from other processes
        def query_clients(self, client_ids, query, state=None):
            return super().query_clients(client_ids, query, state)

    sim = Elsewhere(ExperimentConfig(**{**QUICK, "method": "fedbn", "partition": "iid", "num_clients": 2,
                                        "personalized_test": "whole"}))
    with pytest.raises(ConfigError, match="personalized_test: own"):
        whole_test_scores(sim, sim.method.evaluation_state(sim))


def test_unknown_value_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="personalized_test"):
        ExperimentConfig(**{**QUICK, "personalized_test": "global"})
