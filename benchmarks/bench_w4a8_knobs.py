"""The two knobs of the 4-bit rounding with data, swept on the real ImageNet MobileNetV2 and
EfficientNet-Lite1 of ``cle.pretrained``: the file budget within which the noisiest kernels stay
8-bit (``cle._quantize.weight_stages.WIDE_SIZE_RATIO``; none: every kernel 4-bit) and the
rounding's ridge below 8 bits (``DATA_DAMP_LOW_BITS``), for the default rounding or another
(``--rounding``).

Run it directly (one network per process; a few minutes per network on 2 cores)::

    .venv/bin/python benchmarks/bench_w4a8_knobs.py --net efficientnet_lite1 --json knobs.jsonl
    .venv/bin/python scripts/gen_w4a8_results.py --knobs knobs.jsonl     # the docs' table

Each row is ``cle.quantize(model, x64, weight_bits=4, rounding=...)`` with the two module
constants set as the row says (``--rows K...``: only the rows of these indices of ``ROWS``),
judged as ``benchmarks/bench_w4a8.py`` judges (LiteRT on 256 other crops against the float
Keras model: top-1 agreement and SQNR). It prints figures and asserts nothing.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import cle  # noqa: E402
from cle import pretrained as P  # noqa: E402
from cle import quantization as Q  # noqa: E402
from cle._quantize import weight_stages  # noqa: E402

from bench_w4a8 import NETS, _cpu, machine  # noqa: E402

#: (file budget or None, ridge) of each row: the defaults first, then one knob at a time.
ROWS = [(0.595, 0.3), (None, 0.01), (0.595, 0.01), (0.595, 0.03), (0.595, 0.1), (0.595, 1.0)]


def measure(net, json_path=None, rounding="auto", rows=None):
    load, size, prep, _ = NETS[net]
    model = load()
    x_cal = prep(P.sample_images(64, size, seed=1))
    x_eval = prep(P.sample_images(256, size, seed=7))
    reference = model.predict(x_eval, batch_size=32, verbose=0)
    saved = weight_stages.WIDE_SIZE_RATIO, weight_stages.DATA_DAMP_LOW_BITS
    try:
        for ratio, damp in (ROWS if rows is None else [ROWS[k] for k in rows]):
            weight_stages.WIDE_SIZE_RATIO, weight_stages.DATA_DAMP_LOW_BITS = ratio, damp
            start = time.perf_counter()
            content, report = cle.quantize(model, x_cal, weight_bits=4, rounding=rounding)
            seconds = time.perf_counter() - start
            y = Q.run_tflite(content, x_eval, batch_size=32)
            r = {"net": net, "rounding": report.target["rounding"], "size_ratio": ratio,
                 "damp": damp,
                 "top1": Q.top1_agreement(reference, y), "sqnr_db": Q.sqnr_db(reference, y),
                 "bytes": len(content), "bytes_int8": report.size_int8,
                 "kernels_8bit": sum(1 for x in report.rounding.layers if x.bits == 8),
                 "seconds": seconds, "load": os.getloadavg()[0], "cpu": _cpu(),
                 "cores": os.cpu_count()}
            print(f"{net:18s} {r['rounding']:9s} budget {ratio!s:>5} ridge {damp:<5g} "
                  f"top-1 {r['top1']:.3f}  "
                  f"SQNR {r['sqnr_db']:6.2f} dB  {r['bytes'] / r['bytes_int8']:.3f}x  "
                  f"{r['kernels_8bit']} kernels 8-bit  {seconds:4.0f} s", flush=True)
            if json_path:
                with open(json_path, "a") as f:
                    f.write(json.dumps(r) + "\n")
    finally:
        weight_stages.WIDE_SIZE_RATIO, weight_stages.DATA_DAMP_LOW_BITS = saved


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(NETS), required=True)
    parser.add_argument("--json", help="append every row to this JSON-lines file")
    parser.add_argument("--rounding", default="auto", choices=("auto", "gptq", "adaround"),
                        help="the rounding of every row (default: auto, the default's)")
    parser.add_argument("--rows", type=int, nargs="*",
                        help=f"only these rows (indices of ROWS, 0 to {len(ROWS) - 1})")
    args = parser.parse_args(argv)
    print(machine(), flush=True)
    measure(args.net, args.json, args.rounding, args.rows)


if __name__ == "__main__":
    main()
