"""The ``cle`` commands (``fold``, ``equalize``, ``inspect``, ``demo``; ``quantize`` and
``analyze`` are in :mod:`cle._cli.quantize`): each ``cmd_*`` takes the parsed arguments of
:func:`cle.cli.build_parser`, runs, prints its summary and returns the exit status. Standard
library only at import, like :mod:`cle.cli`."""

from __future__ import annotations

import sys

from cle._cli.common import (
    EXIT_OK, CliError, Session, check_graph, check_output_path, check_parent_dir,
    data_use, format_table, json_bytes, model_bytes, one_line, write_outputs,
)
from cle._cli.quantize import cmd_quantize, read_calibration  # noqa: F401  (cle.cli's)


def _fold_dict(pairs, skipped):
    return {
        "folded": [
            {"layer": p.layer.name, "bn": p.bn.name, "bn_after": p.bn_after} for p in pairs
        ],
        "fold_skipped": [{"bn": s.bn.name, "reason": s.reason} for s in skipped],
    }


def cmd_fold(args) -> int:
    check_output_path(args.output)
    if args.report:
        check_parent_dir(args.report, "--report")
    with Session(args) as session:
        model = session.load()
        check_graph(args.model, model)
        import cle

        pairs, folded = cle.fold_all_batch_norms(model)
        outputs = [(args.output, model_bytes(folded, args.output))]
        if args.report:
            outputs.append((args.report, json_bytes(_fold_dict(pairs, pairs.skipped))))
        write_outputs(outputs)
    backward = sum(p.bn_after for p in pairs)
    print(f"{args.model}: {len(pairs)} batch norms folded ({backward} backward, "
          f"{len(pairs) - backward} forward), {len(pairs.skipped)} skipped")
    from cle._transforms.report import group_reasons as _group_reasons

    from cle._core.keras_internals import sublayers

    names = [model.name] + [layer.name for layer in sublayers(model)]
    for what, reason, count, example in _group_reasons(
            [("bn skip", s.bn.name, s.reason) for s in pairs.skipped], names):
        print(f"  {what} ×{count}: {reason} (e.g. '{example}')")
    for path, _ in outputs:
        print(f"wrote {path}")
    return EXIT_OK


def _equalize(args, model, calibration=None):
    import cle

    check_graph(args.model, model)
    mode = getattr(args, "bias_correction", "none")
    ranges = getattr(args, "activation_ranges", "bn")
    uses = data_use(args)
    if uses:
        from cle._core.backend import channels_first_problem

        problem = channels_first_problem(model)
        if problem is not None:
            raise CliError(f"{args.model}: {uses[0]} runs the model, but {problem}")
    return cle.equalize_model(
        model, relu6=args.relu6, high_bias_fold=args.high_bias_fold, margin=args.margin,
        return_report=True, bias_correction=mode, calibration_data=calibration,
        objective=args.objective, per_channel_weights=args.per_channel,
        weight_bits=args.weight_bits, activation_bits=args.activation_bits,
        activation_ranges=ranges,
        progress=_progress if mode == "empirical" else None,
    )


def _progress(message):
    """Empirical bias correction's per-layer progress, on stderr (stdout keeps the summary)."""
    print(f"cle: bias correction {message}", file=sys.stderr, flush=True)


def _summary_lines(report):
    """The counts of ``str(report)``, then one line per distinct reason a BN or a set was left
    (the reason lines of ``report.summary()``, with counts and an example)."""
    lines = str(report).splitlines()
    lines = lines[:5] if len(lines) > 4 and lines[4].startswith("bias correction:") else lines[:4]
    return lines + report.summary().splitlines()[2:]


def _options_text(args) -> str:
    """The ``cle equalize`` options of ``args``, every one spelled out (defaults included)."""
    parts = [f"--relu6 {args.relu6}", f"--high-bias-fold {args.high_bias_fold}",
             f"--margin {args.margin:g}", f"--objective {args.objective}"]
    if not args.per_channel:
        parts.append("--per-tensor")
    parts += [f"--weight-bits {args.weight_bits}", f"--activation-bits {args.activation_bits}",
              f"--activation-ranges {args.activation_ranges}",
              f"--bias-correction {args.bias_correction}"]
    if args.calibration:
        parts.append(f"--calibration {args.calibration}")
    if getattr(args, "preprocessing", None):
        parts.append(f"--preprocessing {args.preprocessing}")
    return " ".join(parts)


def cmd_equalize(args) -> int:
    check_output_path(args.output)
    if args.report:
        check_parent_dir(args.report, "--report")
    with Session(args) as session:
        model = session.load()
        equalized, report = _equalize(args, model, read_calibration(args, model))
        outputs = [(args.output, model_bytes(equalized, args.output))]
        if args.report:
            outputs.append((args.report, json_bytes(report.to_dict())))
        write_outputs(outputs)
    print(f"{args.model}: {_options_text(args)}")
    for line in _summary_lines(report):
        print("  " + line)
    for path, _ in outputs:
        print(f"wrote {path}")
    return EXIT_OK


def _range(a):
    import numpy as np

    a = np.asarray(a)
    if a.size == 0:
        return "-"
    return f"{float(a.min()):.3g} .. {float(a.max()):.3g}"


def inspect_lines(report, model, args) -> list[str]:
    """The text of ``cle inspect`` for an :class:`cle.EqualizationReport`."""
    n_params = model.count_params()
    lines = [
        f"{args.model}: model '{model.name}' ({type(model).__name__}), {len(model.layers)} "
        f"layers, {n_params:,} parameters",
        f"dry run of: cle equalize {_options_text(args)}   (nothing is written)",
    ]
    lines += ["  " + line for line in _summary_lines(report)]

    def section(title, count, body):
        lines.append("")
        lines.append(f"{title} ({count})" if count is not None else title)
        lines.extend(body)

    section("Batch-norm folds", len(report.folded), format_table(
        ["layer", "batch norm", "direction"],
        [[p.layer.name, p.bn.name,
          "backward (BN after the layer)" if p.bn_after else "forward (BN before the layer)"]
         for p in report.folded],
    ))
    section("Batch norms not folded", len(report.fold_skipped), format_table(
        ["batch norm", "reason"], [[s.bn.name, s.reason] for s in report.fold_skipped], wrap=1,
    ))
    rows = []
    for i, info in enumerate(report.sets, 1):
        pairs = info.cls_pair_info_list
        names = [p.layer1.name for p in pairs] + [pairs[-1].layer2.name]
        rows.append([
            str(i),
            "pair" if len(pairs) == 1 else "triplet",
            "\n".join(names),
            "\n".join(_range(p.scale_factor) for p in pairs),
            "\n".join("yes" if p.relu_activation_between_layers else "no" for p in pairs),
        ])
    kept = [d for d in report.scaling if not d.scaled]
    body = format_table(
        ["#", "kind", "layers (in order)", "scale factors to next", "ReLU between"], rows)
    if not rows and kept:
        body = [f"  (none: {len(kept)} found, left as they are; see below)"]
    section("Scaling sets", len(report.sets), body)
    if kept:
        section(f"Sets left as they are (objective '{report.objective}')", len(kept),
                format_table(["layers (in order)", "reason"],
                             [["\n".join(d.layers), d.reason] for d in kept], wrap=1))
    section("Chain ends (scalable layers where no set starts)", len(report.set_ends),
            format_table(["layer", "reason"], [[n, r] for n, r in report.set_ends], wrap=1))
    if report.relu6 == "keep":
        body = ["  (relu6='keep': every ReLU6 stays and ends its chain)"]
    else:
        rows = []
        for name in report.relu6_changed:
            fused = name.endswith(" (fused activation)")
            layer = name[: -len(" (fused activation)")] if fused else name
            if report.relu6 == "replace":
                change = ("fused relu6 -> relu" if fused
                          else "ReLU6 -> ReLU (changes what the model computes)")
            else:
                change = (f"fused relu6 -> linear + ClippedReLU '{layer}_relu6'" if fused
                          else "ReLU6 -> ClippedReLU (per-channel caps, same output)")
            rows.append([layer + (" (fused)" if fused else ""), change])
        body = format_table(["activation", "change"], rows)
    section(f"ReLU6 changes (relu6='{report.relu6}')", len(report.relu6_changed), body)
    if args.high_bias_fold == "none":
        body = ["  (high_bias_fold='none': not run)"]
    else:
        body = format_table(
            ["layer1", "layer2", "decision"],
            [[r.layer1, r.layer2,
              f"absorbed: {r.channels} channels, max shift {r.max_shift:.3g}" if r.absorbed
              else f"skipped: {r.reason}"]
             for r in report.bias_absorptions],
            wrap=2,
        )
    section(f"High-bias folding (high_bias_fold='{args.high_bias_fold}', margin "
            f"{args.margin:g})", len(report.bias_absorptions), body)
    return lines


def targets_table(installed=True) -> list[str]:
    """The lines of ``cle targets``: one row per :data:`cle._tflite.targets.TARGETS` entry
    (``installed``: with a column saying whether its tools are installed here)."""
    from cle._tflite.targets import EXTRA, TARGETS

    rows = []
    for t in TARGETS.values():
        int4 = "; ".join(op + ("" if len(g) == 2 else f" ({g[0]} only)")
                         for op, g in t.int4.items())
        checked = ("Vela + " if t.accelerator else "") + (
            "TF Lite Micro" if t.runtime == "tflm" else "LiteRT")
        rows.append([t.name, "int8" if t.integer_io else "float32", checked]
                    + (["yes" if not t.missing() else "no"] if installed else [])
                    + [int4 or "none (4-bit grids stored as INT8)"])
    head = ["target", "I/O", "checked by"] + (["installed"] if installed else [])
    return format_table(head + ["INT4 weights for"], rows, wrap=len(head), indent="",
                        width=100) + [
        f"tflm and ethos-u targets need `pip install {EXTRA}` (tflite-micro, ethos-u-vela); "
        "--integer-io/--float-io override the I/O"]


def cmd_targets(args) -> int:
    """``cle targets``: the table of :data:`cle._tflite.targets.TARGETS`."""
    print("\n".join(targets_table()))
    return EXIT_OK


def cmd_inspect(args) -> int:
    with Session(args) as session:
        model = session.load()
        _, report = _equalize(args, model, read_calibration(args, model))
        lines = inspect_lines(report, model, args)
    print("\n".join(lines))
    return EXIT_OK


def cmd_demo(args) -> int:
    from cle._cli import demo
    from cle._pretrained import networks

    def warn(message):
        print(f"cle: warning: {message}", file=sys.stderr, flush=True)

    try:
        say = lambda *a: print(*a, flush=True)  # noqa: E731
        if args.equalization:
            from cle._cli import demo_equalization

            demo_equalization.run_equalization_demo(
                images=args.images, out_dir=args.out, tflite=args.tflite, print_fn=say,
                warn_fn=warn)
        else:
            demo.run_demo(images=args.images, out_dir=args.out, print_fn=say, warn_fn=warn)
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        if isinstance(exc, FileNotFoundError) and networks.WEIGHTS_PACKAGE not in str(exc):
            raise
        if isinstance(exc, ModuleNotFoundError) and exc.name != networks.WEIGHTS_PACKAGE:
            raise
        raise CliError(one_line(exc)) from exc  # the message has the pip command
    except ImportError as exc:
        if "pip install" not in str(exc):
            raise
        raise CliError(one_line(exc)) from exc  # e.g. scikit-image missing, with its hint
    return EXIT_OK
