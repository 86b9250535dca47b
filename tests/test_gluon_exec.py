"""Converted Gluon scripts train on CPU in the MXNet environment (#19).

bfloat16 AMP runs on CPU; float16 needs CuDNN. So the float16 conversion (loss scaling,
`amp.init_trainer`, `amp.unscale`) is run with its `amp.init()` switched to bfloat16: the scaling
machinery is the same, only the cast target differs. Each converted run is compared with the
fp32 run of the same script, step by step."""
from pathlib import Path

import pytest

from ampify.convert import convert_source
from ampify.findings import FileStatus
from ampify.options import Options
from mxnet_environment import mxnet_bfloat16_python, run_mxnet

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gluon"
#: bfloat16 keeps 8 bits of mantissa: per-step losses within this relative distance of fp32
TOLERANCE = 0.03


@pytest.fixture(scope="module")
def python():
    return mxnet_bfloat16_python()


def _converted(tmp_path: Path, script: str, dtype: str, on_cpu: bool = True) -> Path:
    conversion = convert_source((FIXTURES / script).read_bytes(), Options(dtype=dtype), filename=script)
    assert conversion.status is FileStatus.CHANGED, (conversion.reason, conversion.findings)
    text = conversion.converted.decode()
    if dtype == "float16":
        assert "amp.init()\n" in text and "amp.init_trainer(" in text and "amp.scale_loss(" in text
        if on_cpu:
            text = text.replace("amp.init()\n", 'amp.init(target_dtype="bfloat16")\n', 1)
    else:
        assert 'amp.init(target_dtype="bfloat16")' in text and "scale_loss" not in text
    path = tmp_path / script
    path.write_text(text)
    return path


def _close(converted, original) -> None:
    assert len(converted) == len(original)
    for step, (ours, theirs) in enumerate(zip(converted, original)):
        for a, b in zip(ours, theirs):
            assert abs(a - b) <= TOLERANCE * abs(b) + 1e-3, (step, ours, theirs)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_converted_mlp_with_clipping_trains_like_fp32(tmp_path, python, dtype):
    original = run_mxnet(FIXTURES / "exec_mlp_clipping.py", python)
    assert original["output_dtype"] == ["float32"] and original["loss_scale"] == ["none"]
    seen = run_mxnet(_converted(tmp_path, "exec_mlp_clipping.py", dtype), python)
    assert seen["output_dtype"] == ["bfloat16"]  # the network really computes in reduced precision
    assert seen["loss_scale"] == (["65536.0"] if dtype == "float16" else ["none"])
    _close(seen["loss"], original["loss"])
    assert seen["loss"][-1][0] < seen["loss"][0][0]  # it learns


def test_without_unscale_the_clipped_step_would_not_train_like_fp32(tmp_path, python):
    """The test above could fail: the same conversion without `amp.unscale` clips the scaled
    gradients, and its losses leave fp32's."""
    path = _converted(tmp_path, "exec_mlp_clipping.py", "float16")
    text = path.read_text()
    assert text.count("amp.unscale(trainer)\n") == 1
    path.write_text(text.replace("amp.unscale(trainer)\n", ""))
    original = run_mxnet(FIXTURES / "exec_mlp_clipping.py", python)
    seen = run_mxnet(path, python)
    with pytest.raises(AssertionError):
        _close(seen["loss"], original["loss"])


def test_converted_gan_scales_each_trainer_on_its_own(tmp_path, python):
    original = run_mxnet(FIXTURES / "exec_gan_two_trainers.py", python)
    seen = run_mxnet(_converted(tmp_path, "exec_gan_two_trainers.py", "float16"), python)
    assert seen["loss_scale_G"] == ["65536.0"] and seen["loss_scale_D"] == ["65536.0"]
    _close(seen["loss"], original["loss"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_converted_multi_context_loss_list_trains_like_fp32(tmp_path, python, dtype):
    original = run_mxnet(FIXTURES / "exec_multi_context.py", python)
    seen = run_mxnet(_converted(tmp_path, "exec_multi_context.py", dtype), python)
    _close(seen["loss"], original["loss"])
    assert seen["loss"][-1][0] < seen["loss"][0][0]


def test_the_float16_conversion_as_written_compiles_and_needs_cuda_to_run(tmp_path):
    """float16 MXNet operators need CuDNN, so the float16 output itself is checked by compiling it
    (the goldens hold it whole); its run on CPU is the bfloat16-switched one above."""
    for script in ("exec_mlp_clipping.py", "exec_gan_two_trainers.py", "exec_multi_context.py"):
        path = _converted(tmp_path, script, "float16", on_cpu=False)
        compile(path.read_text(), str(path), "exec")
