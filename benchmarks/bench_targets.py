"""The goals of issue #42 on the real MobileNetV2 (and EfficientNet-Lite1 with ``--lite1``),
64 real photo crops to calibrate and 128 other crops to judge:

* ``--target tflm``: does TF Lite Micro run the file; its SQNR against the float model next to
  LiteRT's on the same file and crops (goal: within 0.5 dB); the report's SQNR next to TFLM's
  on the other crops (goal: within 1.5 dB); the arena TFLM allocated;
* ``--target tflm --weight-bits 4``: INT4 tensors present, does TFLM run it, and its size
  against the tflm INT8 file (goal: at most 0.65x);
* ``--target ethos-u55-128``: Vela's operators on the NPU and the CPU (goal: all on the NPU),
  with 8-bit and 4-bit weights (goal: a file Vela compiles, or a refusal).

Run: ``.venv/bin/python benchmarks/bench_targets.py [--lite1] [--int8-only] [--docs]``. It
prints figures and asserts nothing (TF Lite Micro runs one crop at a time: a few minutes on 2
cores); ``--docs`` writes the table of the network into docs/targets.md (block
``deploy-mobilenet_v2`` or ``deploy-efficientnet_lite1``).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import cle
from cle._core.inputs import ModelInputs
from cle._measure.check import output_kinds, output_names
from cle._measure.inference import predict_all
from cle._tflite import tflm
from cle._tflite.runtime import run_all
from cle.pretrained import (efficientnet_lite1_imagenet, mobilenet_v2_imagenet,
                            preprocess_efficientnet_lite, preprocess_imagenet, sample_images)

CALIBRATION, JUDGE = 64, 128


def _sqnr(ref, y) -> float:
    ref, y = np.asarray(ref, np.float64), np.asarray(y, np.float64)
    return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - y) ** 2), 1e-30)))


def main() -> int:
    lite1 = "--lite1" in sys.argv
    model = efficientnet_lite1_imagenet() if lite1 else mobilenet_v2_imagenet()
    size = int(model.inputs[0].shape[1])
    prep = preprocess_efficientnet_lite if lite1 else preprocess_imagenet
    x_cal = prep(sample_images(CALIBRATION, size=size, seed=11))
    x_judge = prep(sample_images(JUDGE, size=size, seed=12))
    judge = ModelInputs((x_judge,), ("x",), (x_judge.shape[1:],))
    ref = predict_all(model, judge)[0]
    print(f"{model.name}: {CALIBRATION} crops to calibrate, {JUDGE} other crops to judge; "
          f"{output_names(model)} {output_kinds(model)}")
    sizes, rows = {}, []
    runs = (("tflm", 8), ("ethos-u55-128", 8)) if "--int8-only" in sys.argv else (
        ("tflm", 8), ("tflm", 4), ("ethos-u55-128", 8), ("ethos-u55-128", 4))
    for target, bits in runs:
        start = time.perf_counter()
        content, report = cle.quantize(model, x_cal, target=target, weight_bits=bits)
        seconds = time.perf_counter() - start
        t = report.target
        sizes[(target, bits)] = len(content)
        int4 = sum(w.storage == "INT4" for w in report.weights)
        print(f"\n--target {target} --weight-bits {bits}: {len(content):,} bytes "
              f"({int4} INT4 tensors), {seconds:.0f} s; report SQNR {report.sqnr_db:.2f} dB")
        if t.get("runtime_check"):
            o = t["runtime_check"]["outputs"][0]
            print(f"  report's TFLM check: SQNR {o['sqnr_db']} dB, LiteRT {o['litert_sqnr_db']} "
                  f"dB; arena {t.get('arena_bytes')} bytes")
        row = {"run": f"`--target {target}" + (" --weight-bits 4`" if bits == 4 else "`"),
               "size": f"{len(content) / 1e6:.2f} MB ({int4} INT4)",
               "claim": f"{report.sqnr_db:.2f}", "runs": "", "real": "", "npu": ""}
        if t.get("compiled") is not None:
            print(f"  Vela: compiled {t['compiled']}, NPU {t.get('npu_ops')}, CPU "
                  f"{t.get('cpu_ops')} {t.get('cpu_op_names')}, flash {t.get('flash_bytes')}, "
                  f"{t.get('inference_seconds')} s")
            row["npu"] = (f"{t['npu_ops']} NPU / {t['cpu_ops']} CPU; flash "
                          f"{t['flash_bytes'] / 1e6:.2f} MB, {t['inference_seconds'] * 1e3:.1f} ms"
                          if t["compiled"] else "not compiled")
        rows.append(row)
        row["runs"] = "yes" if t.get("runs") else "no"
        for w in report.warnings:
            print(f"  warning: {w[:300]}")
        if target != "tflm":
            continue
        lite = _sqnr(ref, run_all(content, judge)[0])
        try:
            micro = _sqnr(ref, tflm.run_tflm(content, judge).outputs[0])
        except tflm.TflmFailed as exc:
            print(f"  TFLM on the other crops: failed: {exc}")
            continue
        row["real"] = f"{micro:.2f} / {lite:.2f}"
        print(f"  on {JUDGE} other crops: TFLM SQNR {micro:.2f} dB, LiteRT {lite:.2f} dB "
              f"(TFLM - LiteRT {micro - lite:+.2f}, goal within 0.5); report - TFLM "
              f"{report.sqnr_db - micro:+.2f} dB (goal within 1.5)")
    ratio = sizes[("tflm", 4)] / sizes[("tflm", 8)] if ("tflm", 4) in sizes else None
    if ratio is not None:
        print(f"\ntflm W4 file / tflm INT8 file: {ratio:.3f} (goal at most 0.65)")
    if "--docs" in sys.argv:
        _write_docs(model.name, rows, ratio)
    return 0


def _write_docs(name, rows, ratio):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "scripts"))
    from _docblocks import cpu_name, replace_block

    lines = ["| run | file | report's SQNR (dB) | runs in TFLM | TFLM / LiteRT SQNR on "
             f"{JUDGE} other crops (dB) | Vela, ethos-u55-128 |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['size']} | {r['claim']} | {r['runs']} | {r['real'] or '-'} "
              f"| {r['npu'] or '-'} |" for r in rows]
    text = "\n".join(lines) + (
        f"\n\n{name}, calibrated on {CALIBRATION} photo crops, judged on {JUDGE} others"
        + (f"; the tflm 4-bit file is {ratio:.2f}x the tflm 8-bit one" if ratio else "")
        + f". Measured by `benchmarks/bench_targets.py --docs` on {cpu_name()}, 2 cores.")
    page = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "docs", "targets.md")
    key = "deploy-efficientnet_lite1" if "lite" in name else "deploy-mobilenet_v2"
    replace_block(page, key, text)


if __name__ == "__main__":
    sys.exit(main())
