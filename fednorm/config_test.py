import pytest

from fednorm.config import ExperimentConfig, load_config
from fednorm.errors import ConfigError


def test_defaults_are_valid_and_round_trip_through_yaml(tmp_path):
    cfg = ExperimentConfig()
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path) == cfg


def test_overrides_win_over_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rounds: 7\nlr: 0.2\n")
    cfg = load_config(path, {"lr": 0.5})
    assert (cfg.rounds, cfg.lr) == (7, 0.5)


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"alpha": 0}, "alpha"),
        ({"alpha": -1.0}, "alpha"),
        ({"lr": float("nan")}, "lr"),
        ({"rounds": 0}, "rounds"),
        ({"num_clients": 4, "clients_per_round": 5}, "clients_per_round=5 exceeds num_clients=4"),
        ({"gamma": 1.5}, "gamma"),
        ({"batch_sise": 3}, "batch_sise: unknown field"),
        ({"rounds": "many"}, "rounds"),
        ({"executor": "gpu-magic"}, "executor"),
    ],
)
def test_invalid_fields_are_named(fields, needle):
    with pytest.raises(ConfigError) as info:
        load_config(None, fields)
    assert needle in str(info.value)


def test_bad_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(p)
    p.write_text("rounds: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)


def test_lr_schedule_exponential_and_steps():
    cfg = ExperimentConfig(lr=0.1, lr_decay=0.5, lr_milestones=[3], lr_gamma=0.1)
    assert cfg.lr_at(1) == pytest.approx(0.1)
    assert cfg.lr_at(2) == pytest.approx(0.05)
    assert cfg.lr_at(3) == pytest.approx(0.1 * 0.25 * 0.1)


def test_names_are_normalised():
    cfg = ExperimentConfig(method="FedAvg", norm="BN", model="simple-cnn")
    assert (cfg.method, cfg.norm, cfg.model) == ("fedavg", "bn", "simple_cnn")


def test_eval_last_rounds_adds_the_final_rounds_to_the_cadence() -> None:
    from fednorm import api

    res = api.run(dict(dataset="digits", num_clients=3, rounds=12, eval_every=5, eval_last_rounds=3, batch_size=32),
                  write=False, progress=False)
    assert [h["round"] for h in res.history] == [5, 10, 11, 12]


def test_lr_values_give_each_phase_its_own_learning_rate() -> None:
    cfg = ExperimentConfig(lr=0.1, lr_milestones=[1001, 2001], lr_values=[0.05, 0.033])
    assert [cfg.lr_at(r) for r in (1, 1000, 1001, 2000, 2001, 3000)] == [0.1, 0.1, 0.05, 0.05, 0.033, 0.033]
    decayed = ExperimentConfig(lr=0.1, lr_decay=0.5, lr_milestones=[3], lr_values=[0.02])
    assert decayed.lr_at(4) == 0.02 * 0.5**3  # the per-round decay still applies
    plain = ExperimentConfig(lr=0.1, lr_milestones=[3], lr_gamma=0.5)
    assert plain.lr_at(3) == 0.05
    with pytest.raises(ValueError, match="milestone"):
        ExperimentConfig(lr_milestones=[3], lr_values=[0.1, 0.2])
    with pytest.raises(ValueError, match="positive"):
        ExperimentConfig(lr_milestones=[3], lr_values=[-0.1])
