"""The trainer as GPU users run it, on CPU: --precision (bf16 autocast on CPU, fp16 with a gradient scaler),
--channels-last, --compile (dynamo with the eager backend: inductor takes minutes here), torchvision models
by name through a stand-in module, the verdict's GPU decode advice, and the loader plan in the report."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

import trainer.accel as accel_mod
from trainer import runtime
from trainer.accel import Accel, accel_of
from trainer.config import Network, TrainConfig
from trainer.data import describe_loader
from trainer.models import build_model
from trainer.report import combine, summarize, verdict
from trainer.synthetic import MemoryLoader
from trainer.timing import StepRecord
from trainer.train import setup, train, wrap

CPU = torch.device("cpu")


def test_precision_resolves_per_device_and_scales_only_fp16():
    assert accel_of(Network(), CPU).precision == "fp32"  # auto: bf16 on CUDA only
    for name, dtype, scaled in (("bf16", torch.bfloat16, False), ("fp16", torch.float16, True),
                                ("fp32", torch.float32, False)):
        acc = accel_of(Network(precision=name), CPU)
        with acc.autocast():
            y = nn.Linear(4, 2)(torch.ones(1, 4))
        assert y.dtype == dtype and acc.scaler().is_enabled() == scaled
    assert accel_of(Network(precision="fp16"), CPU).describe() == "fp16 autocast + grad scaler"
    with pytest.raises(ValueError, match="--precision must be one of"):
        Network(precision="int8")


def test_no_autocast_on_the_device_is_refused_by_name(monkeypatch):
    import torch.amp.autocast_mode as modes

    monkeypatch.setattr(modes, "is_autocast_available", lambda device_type: False)
    with pytest.raises(ValueError, match="--precision bf16: this torch has no autocast on cpu; use --precision fp32"):
        accel_of(Network(precision="bf16"), CPU)


def test_channels_last_puts_weights_and_images_in_nhwc():
    acc = Accel(device_type="cpu", precision="fp32", channels_last=True)
    model = acc.model(build_model("resnet", num_classes=3, image_size=8))
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    images = acc.inputs(torch.zeros(2, 3, 8, 8))
    assert images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()
    rows = torch.zeros(2, 5)
    assert acc.inputs(rows) is rows  # table rows stay as they are


def _cfg(tmp_path, **flat) -> TrainConfig:
    base = dict(data="synthetic:?samples=64&classes=3", model="resnet", num_classes=3, batch_size=8, max_steps=3,
                image_size=8, out=str(tmp_path), resume="none", log_every=3, live=False)
    return TrainConfig.from_options(**{**base, **flat})


def _trained(cfg: TrainConfig):  # noqa: ANN202 - the Run
    rt = runtime.Runtime(rank=0, world_size=1, local_rank=0, device=CPU, distributed=False)
    images, labels = torch.randint(0, 255, (64, 3, 8, 8), dtype=torch.uint8), torch.arange(64) % 3
    run = setup(cfg, rt, loaders=(MemoryLoader(images, labels, batch_size=8, rank=0, world_size=1, seed=0), None))
    wrap(run)
    train(run)
    return run


@pytest.mark.slow  # torch.compile: seconds
@pytest.mark.timeout(240)
def test_a_run_in_bf16_channels_last_compiled_trains_and_reports_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(accel_mod, "COMPILE_BACKEND", "eager")  # dynamo's trace, without inductor's codegen
    run = _trained(_cfg(tmp_path, precision="bf16", channels_last=True, compile=True))
    assert run.step == 3 and type(run.net).__name__ == "OptimizedModule" and run.net._orig_mod is run.model
    assert all(torch.isfinite(p).all() for p in run.model.parameters())
    out = capsys.readouterr().out
    assert "model: bf16 autocast, channels-last, torch.compile (eager)" in out
    assert "loader: MemoryLoader (its plan is not described)" in out


@pytest.mark.timeout(120)
def test_fp16_steps_through_the_scaler_and_its_state_is_checkpointed(tmp_path):
    run = _trained(_cfg(tmp_path, precision="fp16"))
    assert run.step == 3 and run.scaler.is_enabled() and run.scaler.get_scale() > 0
    again = _trained(_cfg(tmp_path, precision="fp16", max_steps=4, resume="auto"))
    assert again.step == 4 and again.scaler.is_enabled()
    fp32 = _trained(_cfg(tmp_path, precision="fp32", max_steps=5, resume="auto"))  # an fp16 checkpoint resumes
    assert fp32.step == 5 and not fp32.scaler.is_enabled()


def test_describe_loader_uses_the_loaders_own_plan():
    class Planned:
        def describe(self) -> str:
            return "threads x2 | raw | first batch: main"

    assert describe_loader(Planned()) == "threads x2 | raw | first batch: main"  # type: ignore[arg-type]


@pytest.fixture
def torchvision_standin(monkeypatch):
    """A stand-in torchvision (it does not import here): list_models and get_model as torchvision has them."""
    built = []

    def get_model(name: str, *, weights: object, **kwargs: object) -> nn.Module:
        built.append((name, weights, kwargs))
        return nn.Sequential(nn.Flatten(), nn.LazyLinear(int(kwargs["num_classes"])))

    models = types.ModuleType("torchvision.models")
    models.list_models = lambda module=None: ["resnet50", "vit_b_16"]  # type: ignore[attr-defined]
    models.get_model = get_model  # type: ignore[attr-defined]
    package = types.ModuleType("torchvision")
    package.models = models  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchvision", package)
    monkeypatch.setitem(sys.modules, "torchvision.models", models)
    return built


def test_torchvision_models_by_name(torchvision_standin):
    model = build_model("resnet50", num_classes=7, image_size=32)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 7)
    build_model("vit_b_16", num_classes=7, image_size=64)
    assert torchvision_standin == [("resnet50", None, {"num_classes": 7}),
                                   ("vit_b_16", None, {"num_classes": 7, "image_size": 64})]
    with pytest.raises(ValueError, match=r"unknown model 'resnet5': use one of .* torchvision classification model "
                                         r"\(resnet50, vit_b_16, \.\.\.\)"):
        build_model("resnet5", num_classes=7, image_size=32)
    with pytest.raises(ValueError, match="takes images, not --features rows"):
        build_model("resnet50", num_classes=7, image_size=32, in_features=4)


def test_without_torchvision_a_torchvision_name_is_refused_saying_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import fails, as on this machine
    monkeypatch.setitem(sys.modules, "torchvision.models", None)
    with pytest.raises(ValueError, match="unknown model 'resnet50': .*torchvision.* does not import here"):
        build_model("resnet50", num_classes=7, image_size=32)


def _decode_bound(decode: str, gpu_decode: dict | None = None) -> dict:
    rec = StepRecord(step=1, epoch=0, start_s=0.0, step_s=0.4, wait_s=0.3, h2d_s=0.0, compute_s=0.1,
                     comm_exposed_s=0.0, comm_overlapped_s=0.0, opt_s=0.0, samples=8, read_s=0.05, decode_s=0.3)
    return combine([summarize([rec], rank=0)], num_workers=2, decode=decode, gpu_decode=gpu_decode)


def test_the_verdict_advises_gpu_decode_where_the_loader_offers_it():
    rep = _decode_bound("cpu")
    text = verdict(rep, num_workers=2, decode="cpu", has_gpu=True, offered=("cpu", "dali", "gpu", "auto"))
    assert "try --decode auto (the GPU decodes beside the CPU workers" in text
    assert "try --decode gpu (the GPU decodes every batch)" in verdict(rep, num_workers=2, decode="cpu", has_gpu=True,
                                                                      offered=("cpu", "gpu"))
    assert "try --decode dali" in verdict(rep, num_workers=2, decode="cpu", has_gpu=True, offered=("cpu", "dali"))
    assert "--decode auto" not in verdict(rep, num_workers=2, decode="cpu", has_gpu=False, offered=("cpu", "auto"))


def test_the_verdict_under_gpu_decode_quotes_the_measured_split():
    facts = {"codec": "nvImageCodec (hardware)", "device": "cuda:0", "device_samples": 900, "cpu_path_samples": 4,
             "gpu_share": 0.7, "gpu_samples_per_s": 2100.0, "cpu_samples_per_s": 900.0}
    rep = _decode_bound("auto", facts)
    assert rep["gpu_decode"] == facts
    assert ("--decode auto gives the GPU (nvImageCodec (hardware)) 70% of batches; measured 2,100 samples/s on the "
            "GPU and 900 on the 2 CPU workers (the GPU side is faster)") in rep["verdict"]
    gpu = _decode_bound("gpu", facts)["verdict"]
    assert "every batch is decoded on the GPU (nvImageCodec (hardware); 4 samples on its CPU path): try --decode auto" \
        in gpu
    twin = _decode_bound("gpu", {"codec": "CPU twin (PIL)", "device": "cpu"})["verdict"]
    assert "decoded with CPU twin (PIL), not on a GPU" in twin
