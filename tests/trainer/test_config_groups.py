"""The trainer's config: groups by concern, the loader's options passed (never re-spelled) as one flag
per LoaderConfig field, and --model refused in one sentence on a dataset of the other kind."""

from __future__ import annotations

import dataclasses

import pytest

from dataio.loader.config import DECODES
from dataio.storage.store import Store
from tests.dataio.shardgen import write_tar_dataset
from tests.dataio.tokengen import write_token_dataset
from trainer import data
from trainer.config import FLAT, GROUPS, TrainConfig, config_dict
from trainer.flags import build_parser, parse_config
from trainer.loader_options import DERIVED, OPTIONS, TRAINER_DEFAULTS, loader_config, loader_fields, scalar_of

BASE = ["--data", "runs/x"]


def test_every_loader_option_is_one_flag_or_set_by_the_trainer():
    names = [name for name, _, _ in loader_fields()]
    assert "batch_size" in names and "decode" in names and len(set(names)) == len(names)
    flags = {o.name: o for o in OPTIONS}
    assert set(flags) | set(DERIVED) == set(names) and not set(flags) & set(DERIVED)
    defaults = {name: default for name, default, _ in loader_fields()}
    for name, option in flags.items():  # the loader's default, unless the trainer says why not
        assert option.default == TRAINER_DEFAULTS.get(name, defaults[name]), name
        assert f"--{name.replace('_', '-')}" in build_parser().format_help()
    assert scalar_of(int | None) == (int, True) and scalar_of(bool) == (bool, False)
    assert scalar_of(tuple[str, ...] | None)[0] is None  # no flag carries it: DERIVED


def test_a_loader_flag_reaches_make_loader_as_given():
    cfg = parse_config([*BASE, "--shuffle-window", "7", "--no-verify-checksums", "--prefetch-bytes", "4096",
                        "--worker-mode", "threads", "--num-workers", "3"])
    assert cfg.loader.shuffle_window == 7 and cfg.shuffle_window == 7  # the group, and the flat view
    options = data.loader_options(cfg, data.SAMPLES, mixed=False, train=False, storage=data.storage_options(cfg),
                                  label_space="same")
    assert {k: options[k] for k in ("shuffle_window", "verify_checksums", "prefetch_bytes", "worker_mode",
                                    "num_workers")} == {"shuffle_window": 7, "verify_checksums": False,
                                                        "prefetch_bytes": 4096, "worker_mode": "threads",
                                                        "num_workers": 3}
    assert (options["tail"], options["shuffle"], options["train"], options["seq_len"]) == ("pad", False, False, None)
    loader_config(**{k: v for k, v in options.items() if k != "num_workers"})  # every key an option, every value valid


@pytest.mark.parametrize("decode", [d for d in DECODES if d is not None])
def test_decode_takes_what_the_loader_takes(decode):
    assert parse_config([*BASE, "--decode", decode]).decode == decode  # gpu and auto where the loader has them


def test_the_loader_refuses_its_own_bad_values():
    with pytest.raises(ValueError, match="^--decode must be one of"):
        parse_config([*BASE, "--decode", "fpga"])
    with pytest.raises(ValueError, match="^--shuffle-window must be an int >= 1"):
        parse_config([*BASE, "--shuffle-window", "0"])
    with pytest.raises(ValueError, match="^--worker-mode must be one of"):
        parse_config([*BASE, "--worker-mode", "fibres"])


def test_groups_by_concern_with_one_flat_name_each(tmp_path):
    assert len(FLAT) == sum(len(dataclasses.fields(g)) for g in GROUPS.values())  # no name in two groups
    cfg = parse_config([*BASE, "--lr", "0.5", "--keep-checkpoints", "2", "--precision", "bf16"])
    assert (cfg.optim.lr, cfg.checkpoints.keep_checkpoints, cfg.network.precision) == (0.5, 2, "bf16")
    assert set(config_dict(cfg)) == set(FLAT)
    with pytest.raises(ValueError, match="--epoch-samples sets a mixture's epoch"):
        parse_config(["--data", "a=1", "--data", "b=1", "--epoch-samples", "0"])
    with pytest.raises(TypeError, match="did you mean 'lr'"):
        TrainConfig.from_options(data="x", lrr=1.0)
    conf = tmp_path / "t.toml"
    conf.write_text('data = "x"\nshuffle_window = 9\nchannels_last = true\n')
    cfg = parse_config(["--config", str(conf)])
    assert (cfg.loader.shuffle_window, cfg.network.channels_last) == (9, True)
    conf.write_text('data = "x"\nshuffle_window = "many"\n')
    with pytest.raises(ValueError, match="'shuffle_window' .* must be int"):
        parse_config(["--config", str(conf)])


@pytest.fixture(scope="module")
def two_kinds(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("kinds")
    write_tar_dataset(Store(str(root / "photos")), [4, 4], real_images=True)
    write_token_dataset(Store(str(root / "tokens")), [[30, 4, 61], [17, 90, 2, 2], [45], [70, 12, 9]])
    return str(root / "photos"), str(root / "tokens")


def _open(args: list[str]):  # noqa: ANN202 - a loader or the error
    cfg = parse_config([*args, "--num-workers", "0", "--seq-len", "4", "--image-size", "8", "--batch-size", "2"])
    return data.open_loader(cfg, cfg.data, rank=0, world_size=1, train=True)


def test_a_model_on_the_other_kind_of_dataset_is_refused_in_one_sentence(two_kinds):
    photos, tokens = two_kinds
    with pytest.raises(ValueError, match=rf"^--model gpt trains on token datasets; {photos} holds images \(tar "):
        _open(["--data", photos, "--model", "gpt"])
    with pytest.raises(ValueError, match=rf"^--model resnet is a classifier of samples; {tokens} holds tokens "):
        _open(["--data", tokens, "--model", "resnet"])
    with pytest.raises(ValueError, match="^--model gpt trains on token datasets; synthetic:"):
        _open(["--data", "synthetic:?samples=16", "--model", "gpt"])
    with pytest.raises(ValueError, match="mixes token datasets and datasets of samples"):
        _open(["--data", photos, "--data", tokens, "--model", "gpt"])


def test_the_manifest_decides_the_kind_of_batches(two_kinds):
    photos, tokens = two_kinds
    for args, field in ((["--data", tokens, "--model", "gpt"], "input_ids"), (["--data", photos], "image")):
        loader = _open(args)
        try:
            loader.set_epoch(0)
            assert field in next(iter(loader))
        finally:
            loader.close()
