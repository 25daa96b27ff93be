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
