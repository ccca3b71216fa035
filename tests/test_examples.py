"""The example scripts run, exit 0 and print what they promise.

Each example runs as a subprocess (``sys.executable examples/<name>.py``), with small arguments
where it takes them. Besides the exit code, the exact steps (ReLU6 bounding, BN folding,
cross-layer scaling) must leave the logits unchanged up to float32 round-off.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
from conftest import require_mobilenet_weights

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
EXACT = 1e-5  # max|y - y0| / max|y0| for a rewrite that does not change the function


def run_example(name, *args, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"{name} exited with {proc.returncode}\n--- stdout\n{proc.stdout}\n"
        f"--- stderr (last 3000 chars)\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def step_differences(out):
    """{step number: difference} from the lines following '<n>. ...' in the stepwise examples."""
    diffs, step = {}, None
    for line in out.splitlines():
        m = re.match(r"(\d)\. ", line)
        if m:
            step = int(m.group(1))
        m = re.match(r"\s+difference ([0-9.e+-]+)", line)
        if m and step is not None:
            diffs[step] = float(m.group(1))
    return diffs


def test_stepwise_automatic():
    out = run_example("stepwise_automatic.py", "--batch", "2")
    assert "1. replace_relu6_with_clipped_relu: 35 ReLU6 -> ClippedReLU" in out
    assert "2. fold_all_batch_norms: 52 folded (52 backward, 0 forward), 0 skipped" in out
    assert "3. CrossLayerScaling.scale_model: 20 sets (3 pairs, 17 triplets)" in out
    assert re.search(r"4\. HighBiasFold\.bias_fold: 37 pairs considered, \d+ absorbed", out)
    diffs = step_differences(out)
    assert set(diffs) == {1, 2, 3, 4}, out
    for step in (1, 2, 3):
        assert diffs[step] <= EXACT, (step, out)
    m = re.search(r"replace_relu6_with_relu alone: difference ([0-9.e+-]+)", out)
    assert m and float(m.group(1)) > EXACT, out  # ReLU6 -> ReLU does change the function


def test_stepwise_manual_resnet50():
    blocks = ("conv2_block1", "conv2_block2")
    out = run_example("stepwise_manual_resnet50.py", "--blocks", *blocks)
    # Expected counts follow from ResNet50's bottleneck block: three conv -> BN pairs (1_conv
    # 1x1, 2_conv 3x3 'same', 3_conv 1x1); sets (1_conv, 2_conv) and (2_conv, 3_conv) (3_conv
    # feeds the residual Add); high-bias absorption only into the unpadded 1x1 3_conv; stage 2
    # has 64 filters in 1_conv (keras.applications.ResNet50: stack_residual_blocks_v1(x, 64,
    # ..., name="conv2")).
    n_sets = 2 * len(blocks)
    assert f"1. fold_given_batch_norms: {3 * len(blocks)} pairs folded" in out
    assert f"2. CrossLayerScaling.scale_cls_sets: {n_sets} sets scaled in place" in out
    assert "conv2_block1_1_conv -> conv2_block1_2_conv: 64 factors" in out
    assert f"3. HighBiasFold.bias_fold: {len(blocks)} of {n_sets} pairs absorbed" in out
    assert "conv2_block1_1_conv -> conv2_block1_2_conv: skipped, 'conv2_block1_2_conv' " \
           "zero-pads its input" in out
    assert "refused as expected: Cannot scale cls_sets[0]=('conv2_block1_3_conv', " \
           "'conv2_block2_1_conv')" in out
    diffs = step_differences(out)
    assert set(diffs) == {1, 2, 3}, out
    assert diffs[1] <= EXACT and diffs[2] <= EXACT, out


def _table(out):
    """{(relu6, high_bias_fold): (sets, absorbed, top-1 agreement %, SQNR dB)}."""
    rows = {}
    for line in out.splitlines():
        m = re.match(r"(bound|replace|keep)\s+(none|unpadded|all)\s+(\d+)\s+(\d+)\s+"
                     r"([0-9.]+)%\s+([0-9.]+|inf)\s", line)
        if m:
            rows[m.group(1), m.group(2)] = (int(m.group(3)), int(m.group(4)),
                                            float(m.group(5)), float(m.group(6)))
    return rows


@pytest.mark.slow
def test_equalize_mobilenet_v2_real_weights():
    require_mobilenet_weights()
    pytest.importorskip("skimage")
    pytest.importorskip("sklearn")
    out = run_example("equalize_mobilenet_v2.py", "--images", "8")
    assert "batch norms folded: 52, skipped: 0" in out
    assert "scaled sets: 20 (3 pairs, 17 triplets; objective 'weights')" in out
    rows = _table(out)
    assert len(rows) == 9, out
    # Exact rewrites: same top-1 on every photo, SQNR at float32 round-off level.
    for key in (("bound", "none"), ("keep", "none")):
        sets, absorbed, agree, sqnr = rows[key]
        assert agree == 100.0 and sqnr > 80.0, (key, out)
    assert rows["bound", "none"][0] == 20 and rows["bound", "none"][1] == 0
    m = re.search(r"after BN folding\s+max/median\s+([0-9.]+).*\n.*after equalize_model\s+"
                  r"max/median\s+([0-9.]+)", out)
    assert m and float(m.group(2)) < float(m.group(1)), out
