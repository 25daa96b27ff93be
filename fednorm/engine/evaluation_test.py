import torch

from fednorm.engine.evaluation import evaluate
from fednorm.models import get_model


def test_channels_last_evaluation_equals_nchw_and_a_direct_forward() -> None:
    torch.manual_seed(0)
    model = get_model("simple_cnn", num_classes=10, norm="bn").double()
    model.train()
    with torch.no_grad():  # non-trivial running statistics
        model(torch.randn(64, 3, 32, 32, dtype=torch.float64) * 2 + 0.5)
    x = torch.randn(300, 3, 32, 32, dtype=torch.float64)
    y = torch.randint(0, 10, (300,))
    model.eval()
    with torch.no_grad():
        logits = model(x)
    want_loss = torch.nn.functional.cross_entropy(logits, y).item()
    model.train()
    for channels_last in (False, True):
        res = evaluate(model, x, y, batch_size=128, channels_last=channels_last)
        assert model.training  # the caller's mode is restored
        assert torch.equal(res.correct, logits.argmax(1) == y)
        assert abs(res.loss - want_loss) < 1e-12
        assert res.num_samples == 300


def test_a_padded_fixed_shape_forward_and_bf16_autocast() -> None:
    """``pad_last`` hands the forward one shape only and drops the padded rows; autocast runs
    the forward in bfloat16 (accuracy within a few samples of float32 here)."""
    torch.manual_seed(1)
    model = get_model("simple_cnn", num_classes=10, norm="bn").eval()
    x, y = torch.randn(300, 3, 32, 32), torch.randint(0, 10, (300,))
    want = evaluate(model, x, y, batch_size=128)
    shapes = []

    def forward(xb: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(xb.shape))
        return model(xb)

    got = evaluate(model, x, y, batch_size=128, forward=forward, pad_last=True)
    assert set(shapes) == {(128, 3, 32, 32)} and len(shapes) == 3
    assert torch.equal(got.correct, want.correct) and abs(got.loss - want.loss) < 1e-5
    bf16 = evaluate(model, x, y, batch_size=128, autocast=torch.bfloat16)
    assert bf16.num_samples == 300 and abs(bf16.accuracy - want.accuracy) <= 0.05


def test_eval_compile_runs_through_torch_compile(monkeypatch) -> None:
    """The simulator evaluates through ``torch.compile`` when asked (the eager backend here, so
    the test does not wait for code generation) and gets the eager accuracy."""
    from fednorm.config import ExperimentConfig
    from fednorm.engine.simulator import Simulation

    calls = []
    real = torch.compile

    def spy(model, **kw):
        calls.append(kw)
        return real(model, backend="eager", **kw)

    monkeypatch.setattr(torch, "compile", spy)
    base = dict(dataset="digits", num_clients=3, rounds=1, batch_size=32, checkpoint_every=0, out=None, threads=1)
    eager = Simulation(ExperimentConfig(**base))
    compiled = Simulation(ExperimentConfig(**base, eval_compile=True, eval_batch_size=100))
    eager.step(), compiled.step()
    assert calls == [{"dynamic": False}]
    a, b = eager.history[-1], compiled.history[-1]
    assert b["test_accuracy"] == a["test_accuracy"] and abs(b["test_loss"] - a["test_loss"]) < 1e-6
    assert compiled.summary()["eval_compile_seconds"] is not None and eager.summary()["eval_compile_seconds"] is None
