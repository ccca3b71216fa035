"""Prototype (issue #44, not part of the library): BRECQ-style block reconstruction for
cle.quantize(weight_bits=4), measured against cle's layer-wise AdaRound on MobileNetV2 with the
protocol of benchmarks/bench_w4a8.py. Measured once: it did not beat layer-wise AdaRound on the
held-out crops, at several times its rounding time (the figures are in issue #44's notes). Kept
so the next try (a Fisher-weighted loss, random activation quantization during the
reconstruction, augmented crops) starts from working code, not from scratch. It wraps private
functions of cle, so it may need mending before it runs again::

    .venv/bin/python benchmarks/proto_block_rounding.py --variants 0,200 --json rows.jsonl

cle's own pipeline runs unchanged except its rounding stage: ``weight_stages.round_model`` is
wrapped. The wrapper
  1. runs cle's own round_model (layer-wise AdaRound) -> the report, the LayerWeights entries
     (grid bits per kernel, i.e. which kernels cle keeps 8-bit, and each kernel's steps);
  2. (mode != adaround) gives every layer its float kernel/bias back, then walks the graph once
     with two streams (float, quantized) and
       * for every block the graph can cut (one input tensor, one output tensor; MobileNetV2's
         inverted residuals, by name prefix), optimizes the rounding variables V of all its
         kernels jointly (plus a float offset on each bias) with TF GradientTape so the block's
         output on the quantized stream's input matches the float block's output on the float
         stream's input; same grid (cle's steps and bits), h(V) initialised to the fractional
         part; AdaRound's rectified sigmoid & regularizer, beta 20->2 after warm-up; Adam; then
         hard rounding and a short bias-only phase;
       * for every other kernel (stem conv, head conv, classifier) cle's layer-wise
         ``_round_call`` (AdaRound on the stream it is given, cle's damp).
     The entries are updated (kernel, bias, scales) so cle's store stage writes exactly these.
Everything else (equalization, percentile ranges, converter, store, check) stays cle's.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse
import json
import re
import resource
import sys
import time

import numpy as np
import tensorflow as tf
import keras

import cle
from cle import pretrained as P
from cle import quantization as Q
from cle._core.graph import graph_view, run_call
from cle._math import rounding as R
from cle._quantize import rounding as RND
from cle._quantize import weight_stages as WS
from cle._quantize.layer_parts import parts

ZETA, GAMMA = R.ZETA, R.GAMMA
CFG = {}
LOG = []


def say(msg):
    print(msg, flush=True)


# ----------------------------------------------------------------------------- blocks

def block_key(name):
    m = re.match(r"^(block_\d+|expanded_conv|block\d+[a-z])_", name)  # MNV2; EfficientNet-ish
    return m.group(1) if m else None


def find_blocks(view, target_ids):
    """[(calls of the block)] for groups of consecutive calls sharing a block key, keeping
    only those with one external input tensor and one output tensor used outside, and
    holding at least two target kernels."""
    groups, cur, key = [], [], None
    for c in view.calls:
        k = block_key(c.layer.name) if c.is_layer else None
        if k is not None and k == key:
            cur.append(c)
        else:
            if cur:
                groups.append(cur)
            cur, key = ([c], k) if k is not None else ([], None)
    if cur:
        groups.append(cur)
    blocks = []
    for g in groups:
        ids = {id(c) for c in g}
        ext_in = {id(t): t for c in g for t in c.inputs if t.producer is None or id(t.producer) not in ids}
        ext_out = [t for c in g for t in c.outputs
                   if t.is_model_output or any(id(u) not in ids for u in t.consumers)]
        n_t = sum(id(c) in target_ids for c in g)
        if len(ext_in) == 1 and len(ext_out) == 1 and n_t >= 2:
            blocks.append((g, list(ext_in.values())[0], ext_out[0]))
    return blocks


# ----------------------------------------------------------------------------- helpers

def _scales_shaped(layer, kernel, scales):
    s = np.asarray(scales, np.float64).reshape(-1)
    if s.size == 1:
        return np.full(kernel.shape[-1:] if not isinstance(layer, keras.layers.DepthwiseConv2D)
                       else kernel.shape[-2:], s[0])
    if isinstance(layer, keras.layers.DepthwiseConv2D):
        return s.reshape(kernel.shape[-2:])  # (C, m): output channel c*m + j
    return s.reshape(kernel.shape[-1:])


def run_block(block, x, subst=None):
    """Run the block's calls on x (the block's one input); subst: {id(layer): (kernel, bias)}
    substituted through stateless_call. Returns the block output and {id(call): output}."""
    calls, t_in, t_out = block
    vals = {id(t_in): x}
    outs = {}
    for c in calls:
        args = [vals[id(t)] for t in c.inputs]
        if subst is not None and id(c.layer) in subst:
            k, b = subst[id(c.layer)]
            tv = []
            for v in c.layer.trainable_variables:
                if v is c.layer.kernel:
                    tv.append(k)
                elif getattr(c.layer, "bias", None) is not None and v is c.layer.bias:
                    tv.append(b)
                else:
                    tv.append(v.value)
            ntv = [v.value for v in c.layer.non_trainable_variables]
            y, _ = c.layer.stateless_call(tv, ntv, args[0])
            y = [y]
        else:
            y = run_call(c, args)
        for t, v in zip(c.outputs, y):
            vals[id(t)] = v
        outs[id(c)] = y[0]
    return vals[id(t_out)], outs


def batched(fn, x, bs=16):
    return tf.concat([fn(x[i:i + bs]) for i in range(0, len(x), bs)], 0)


# ----------------------------------------------------------------------------- reconstruction

def reconstruct_block(block, xq, yf, infos, cfg, rng):
    """Optimize the rounding of the block's kernels. infos: list of dict per target layer
    with layer, W (float kernel), b0 (float bias or None), s (shaped steps), qmin, qmax."""
    iters, bs, lr, lam = cfg["iters"], cfg["batch"], cfg["lr"], cfg["lam"]
    warm = cfg["warmup"]
    b_hi, b_lo = 20.0, 2.0
    n = len(xq)
    Vs, Ds, consts = [], [], []
    n_w = 0
    for inf in infos:
        Wn = inf["W"] / inf["s"]
        base = np.floor(Wn)
        if cfg.get("init") == "adaround" and inf.get("Qada") is not None:
            k = np.round(inf["Qada"] / inf["s"])
            frac = np.where(k > base, 0.9, 0.1)  # start near AdaRound's choice
            frac = np.where((k > base + 1) | (k < base), np.clip(Wn - base, 0.01, 0.99), frac)
        else:
            frac = np.clip(Wn - base, 0.01, 0.99)
        V = -np.log((ZETA - GAMMA) / (frac - GAMMA) - 1)
        Vs.append(tf.Variable(V.astype(np.float32)))
        nb = 0 if inf["b0"] is None else inf["b0"].shape[0]
        Ds.append(tf.Variable(np.zeros(max(nb, 1), np.float32)))
        consts.append((tf.constant(base, tf.float32), tf.constant(inf["s"], tf.float32),
                       float(inf["qmin"]), float(inf["qmax"]),
                       None if inf["b0"] is None else tf.constant(inf["b0"], tf.float32),
                       tf.constant(inf["bscale"], tf.float32)))
        n_w += V.size
    params = Vs + Ds

    def kernels(hard=False):
        sub = {}
        for inf, V, D, (base, s, lo, hi, b0, bsc) in zip(infos, Vs, Ds, consts):
            hr = tf.sigmoid(V) * (ZETA - GAMMA) + GAMMA
            h = tf.cast(hr >= 0.5, tf.float32) if hard else tf.clip_by_value(hr, 0.0, 1.0)
            k = s * tf.clip_by_value(base + h, lo, hi)
            b = None if b0 is None else b0 + D * bsc
            sub[id(inf["layer"])] = (k, b)
        return sub

    def float_sub():
        return {id(inf["layer"]): (tf.constant(inf["W"], tf.float32),
                                    None if inf["b0"] is None else tf.constant(inf["b0"], tf.float32))
                for inf in infos}

    def mse(sub, xb, yb):
        y, _ = run_block(block, xb, sub)
        return tf.reduce_mean(tf.square(y - yb))

    # Normalization: the rounding's share of the error at nearest, to N/12 (cle's AdaRound scale)
    idx = rng.choice(n, min(n, 2 * bs), replace=False)
    xb, yb = tf.gather(xq, idx), tf.gather(yf, idx)
    near = {}
    for inf, (base, s, lo, hi, b0, bsc) in zip(infos, consts):
        near[id(inf["layer"])] = (s * tf.clip_by_value(tf.round(tf.constant(inf["W"], tf.float32) / s), lo, hi), b0)
    l_near, l_float = float(mse(near, xb, yb)), float(mse(float_sub(), xb, yb))
    e_round = max(l_near - l_float, 1e-3 * l_near, 1e-30)
    scale = (n_w / 12.0) / e_round

    m_s = [tf.Variable(tf.zeros_like(p)) for p in params]
    v_s = [tf.Variable(tf.zeros_like(p)) for p in params]
    t_var = tf.Variable(0.0)

    @tf.function
    def step(xb, yb, beta, reg_on, lr_v, lr_d, train_v):
        with tf.GradientTape() as tape:
            sub = kernels(hard=False)
            rec = mse(sub, xb, yb) * scale
            reg = 0.0
            for V in Vs:
                h = tf.clip_by_value(tf.sigmoid(V) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)
                reg += tf.reduce_sum(1.0 - tf.pow(tf.abs(2.0 * h - 1.0), beta))
            loss = rec + reg_on * lam * reg
        grads = tape.gradient(loss, params)
        t_var.assign_add(1.0)
        t = t_var
        for i, (p, g) in enumerate(zip(params, grads)):
            if g is None:
                continue
            is_v = i < len(Vs)
            if is_v and not train_v:
                continue
            m_s[i].assign(0.9 * m_s[i] + 0.1 * g)
            v_s[i].assign(0.999 * v_s[i] + 0.001 * g * g)
            mh = m_s[i] / (1 - tf.pow(0.9, t))
            vh = v_s[i] / (1 - tf.pow(0.999, t))
            p.assign_sub((lr_v if is_v else lr_d) * mh / (tf.sqrt(vh) + 1e-8))
        return rec, reg

    @tf.function
    def bias_step(xb, yb, lr_d):
        with tf.GradientTape() as tape:
            rec = mse(kernels(hard=True), xb, yb) * scale
        grads = tape.gradient(rec, Ds)
        t_var.assign_add(1.0)
        for j, (p, g) in enumerate(zip(Ds, grads)):
            if g is None:
                continue
            i = len(Vs) + j
            m_s[i].assign(0.9 * m_s[i] + 0.1 * g)
            v_s[i].assign(0.999 * v_s[i] + 0.001 * g * g)
            mh = m_s[i] / (1 - tf.pow(0.9, t_var))
            vh = v_s[i] / (1 - tf.pow(0.999, t_var))
            p.assign_sub(lr_d * mh / (tf.sqrt(vh) + 1e-8))
        return rec

    n_warm = int(warm * iters)
    rec = reg = 0.0
    for it in range(iters):
        idx = rng.choice(n, min(bs, n), replace=False)
        xb, yb = tf.gather(xq, idx), tf.gather(yf, idx)
        if it < n_warm:
            beta, on = b_hi, 0.0
        else:
            beta, on = b_hi + (b_lo - b_hi) * (it - n_warm) / max(1, iters - n_warm), 1.0
        rec, reg = step(xb, yb, tf.constant(beta, tf.float32), tf.constant(on),
                        tf.constant(lr), tf.constant(cfg["lr_bias"]), tf.constant(True))
    undecided = 0
    for V in Vs:
        h = np.clip(1 / (1 + np.exp(-V.numpy())) * (ZETA - GAMMA) + GAMMA, 0, 1)
        undecided += int(((h > 0.01) & (h < 0.99)).sum())
    for it in range(cfg["bias_iters"]):
        idx = rng.choice(n, min(bs, n), replace=False)
        bias_step(tf.gather(xq, idx), tf.gather(yf, idx), tf.constant(cfg["lr_bias"] * 0.3))
    # figures on all calibration inputs (normalized units / SQNR)
    hard = kernels(hard=True)
    fn_hard = lambda x: run_block(block, x, hard)[0]
    fn_near = lambda x: run_block(block, x, near)[0]
    yq = batched(fn_hard, xq)
    yn = batched(fn_near, xq)
    sq = lambda a, b: 10 * np.log10(float(tf.reduce_sum(tf.square(a))) / max(float(tf.reduce_sum(tf.square(a - b))), 1e-30))
    out = []
    for inf, (kb, bb) in zip(infos, (hard[id(inf["layer"])] for inf in infos)):
        out.append((kb.numpy().astype(np.float64), None if bb is None else bb.numpy()))
    return out, {"sqnr_near": sq(yf, yn), "sqnr": sq(yf, yq), "undecided": undecided,
                 "n_w": n_w, "rec_end": float(rec), "reg_end": float(reg)}


# ----------------------------------------------------------------------------- the stage

def brecq_round_model(model, inputs, entries, kw, cfg):
    bits = kw["bits"]
    view = graph_view(model)
    targets, _, _ = RND._plan(view, bits)
    target_ids = {id(c) for c in targets}
    entry = {e.layer: e for e in entries}
    blocks = find_blocks(view, target_ids)
    first = {id(b[0][0]): b for b in blocks}
    in_block = {id(c) for b in blocks for c in b[0]}
    say(f"brecq: {len(blocks)} blocks reconstructed jointly: "
        + ", ".join(block_key(b[0][0].layer.name) for b in blocks))
    rng = np.random.default_rng(cfg.get("seed", 0))
    uses = {}
    for c in view.calls:
        for t in c.inputs:
            uses[id(t)] = uses.get(id(t), 0) + 1
    live = {id(t): (v, v) for t, v in zip(view.inputs, [tf.convert_to_tensor(x) for x in inputs])}
    stats = []
    k_layer = 0

    def release(c):
        for t in c.inputs:
            uses[id(t)] -= 1
            if uses[id(t)] == 0:
                live.pop(id(t), None)

    for c in view.calls:
        if id(c) in in_block and id(c) not in first:
            continue
        if id(c) in first:
            block = first[id(c)]
            calls, t_in, t_out = block
            xf, xq = live[id(t_in)]
            t0 = time.perf_counter()
            yf = batched(lambda x: run_block(block, x)[0], xf)
            infos = []
            for bc in calls:
                if id(bc) not in target_ids:
                    continue
                L = bc.layer
                e = entry[L.name]
                W = keras.ops.convert_to_numpy(L.kernel).astype(np.float64)
                b0 = None if getattr(L, "bias", None) is None else keras.ops.convert_to_numpy(L.bias).astype(np.float64)
                # bias's scale: rms of the layer's float output (one batch)
                infos.append({"layer": L, "W": W, "b0": b0, "s": _scales_shaped(L, W, e.scales),
                              "qmin": R.grid_min(e.bits), "qmax": R.grid_max(e.bits),
                              "Qada": CFG["_ada"].get(L.name), "name": L.name, "bits": e.bits})
            _, outs = run_block(block, xf[:8])
            for inf in infos:
                cid = [id(bc) for bc in calls if bc.layer is inf["layer"]][0]
                inf["bscale"] = np.float32(np.sqrt(np.mean(np.square(outs[cid].numpy()))) + 1e-12)
            res, st = reconstruct_block(block, xq, yf, infos, cfg, rng)
            for inf, (k, b) in zip(infos, res):
                L = inf["layer"]
                L.kernel.assign(k.astype(np.float32))
                if b is not None:
                    L.bias.assign(b.astype(np.float32))
                e = entry[L.name]
                e.kernel = keras.ops.convert_to_numpy(L.kernel)
                e.bias = None if b is None else keras.ops.convert_to_numpy(L.bias)
            yq = batched(lambda x: run_block(block, x)[0], xq)
            st.update(block=block_key(calls[0].layer.name), seconds=time.perf_counter() - t0,
                      layers=[f"{inf['name']}@{inf['bits']}" for inf in infos])
            stats.append(st)
            say(f"brecq: {st['block']} ({', '.join(st['layers'])}): block SQNR nearest "
                f"{st['sqnr_near']:.1f} -> {st['sqnr']:.1f} dB, undecided {st['undecided']}/"
                f"{st['n_w']}, {st['seconds']:.1f} s")
            for bc in calls:
                release(bc)
            live[id(t_out)] = (yf, yq)
            continue
        xf, xq = (list(v) for v in zip(*(live[id(t)] for t in c.inputs)))
        if id(c) in target_ids:
            k_layer += 1
            e = entry[c.layer.name]
            out_f, out_q, records, steps = RND._round_call(
                c, xf, xq, "adaround", e.bits, False, True, seed=k_layer, damp=kw["damp"])
            e.kernel = keras.ops.convert_to_numpy(c.layer.kernel)
            e.bias = keras.ops.convert_to_numpy(c.layer.bias) if c.layer.bias is not None else None
            e.scales = R.channel_order(steps[0])
            say(f"brecq: layer-wise {records[0].line()}")
            stats.append({"block": c.layer.name, "sqnr_near": records[0].sqnr_nearest_db,
                          "sqnr": records[0].sqnr_db, "seconds": records[0].seconds})
        else:
            out_f, out_q = RND._pass_through(c, xf, xq, True)
        release(c)
        for t, f, q in zip(c.outputs, out_f, out_q):
            if uses.get(id(t), 0):
                live[id(t)] = (f, q)
    return stats


_orig_round_model = WS.round_model


_orig_round_stage = WS.round_stage


def patched_round_stage(equalized, x_cal, opts, source, say_):
    CFG["_opts"], CFG["_xcal"] = opts, x_cal
    return _orig_round_stage(equalized, x_cal, opts, source, say_)


WS.round_stage = patched_round_stage


def patched_round_model(model, inputs, **kw):
    import copy
    from cle._quantize import pipeline as PL
    float_w = [(v, keras.ops.convert_to_numpy(v)) for v in model.weights]
    if "_cache" in CFG:  # cle's layer-wise result of an earlier call (same equalized model)
        report, entries = copy.deepcopy(CFG["_cache"])
        say("layer-wise rounding: reused from the first call")
    else:
        t0 = time.perf_counter()
        report, entries = _orig_round_model(model, inputs, **kw)
        CFG["_t_layerwise"] = time.perf_counter() - t0
        CFG["_cache"] = copy.deepcopy((report, entries))
        say(f"layer-wise rounding (cle's): {CFG['_t_layerwise']:.1f} s")
        # the AdaRound file exactly as cle writes it (convert + store from this model)
        opts = CFG["_opts"]
        content = PL._convert(model, CFG["_xcal"], opts, None, lambda m: None)[0]
        content, _ = WS.store_stage(content, copy.deepcopy(entries), lambda m: None,
                                    opts.target_spec)
        CFG["_ada_content"] = content
    if CFG["mode"] == "adaround":
        return report, entries
    CFG["_ada"] = {e.layer: np.asarray(e.kernel, np.float64) for e in entries if e.bits}
    for v, w in float_w:
        v.assign(w)
    t1 = time.perf_counter()
    CFG["_stats"] = brecq_round_model(model, inputs, entries, kw, CFG)
    CFG["_t_brecq"] = time.perf_counter() - t1
    say(f"block reconstruction: {CFG['_t_brecq']:.1f} s")
    report.seconds += CFG["_t_brecq"]
    return report, entries


WS.round_model = patched_round_model


# ----------------------------------------------------------------------------- measurement

NETS = {
    "mobilenet_v2": (P.mobilenet_v2_imagenet, 224, P.preprocess_imagenet),
    "efficientnet_lite1": (P.efficientnet_lite1_imagenet, 240, P.preprocess_efficientnet_lite),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="mobilenet_v2")
    ap.add_argument("--mode", default="brecq", choices=["baseline", "adaround", "brecq"])
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--lr-bias", type=float, default=1e-3)
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--warmup", type=float, default=0.2)
    ap.add_argument("--bias-iters", type=int, default=100)
    ap.add_argument("--init", default="frac", choices=["frac", "adaround"])
    ap.add_argument("--json", default="proto_block_rounding.jsonl")
    ap.add_argument("--tag", default="")
    ap.add_argument("--variants", default="200,1000", help="iterations per block; 0: cle's adaround only")
    a = ap.parse_args()
    CFG.update(mode=a.mode, iters=a.iters, batch=a.batch, lr=a.lr, lr_bias=a.lr_bias,
               lam=a.lam, warmup=a.warmup, bias_iters=a.bias_iters, init=a.init)
    tf.random.set_seed(0)
    load, size, prep = NETS[a.net]
    model = load()
    x_cal = prep(P.sample_images(64, size, seed=1))
    x_eval = prep(P.sample_images(256, size, seed=7))
    reference = model.predict(x_eval, batch_size=32, verbose=0)
    ref_cal = model.predict(x_cal, batch_size=32, verbose=0)
    def evaluate(content, tag, secs, rep=None, extra=None):
        y = Q.run_tflite(content, x_eval, batch_size=32)
        yc = Q.run_tflite(content, x_cal, batch_size=32)
        row = {"net": a.net, "tag": tag,
               "cfg": {k: v for k, v in CFG.items() if not k.startswith("_")},
               "top1": Q.top1_agreement(reference, y), "sqnr_db": Q.sqnr_db(reference, y),
               "cal48_sqnr_db": Q.sqnr_db(ref_cal[:48], yc[:48]),
               "cal48_top1": Q.top1_agreement(ref_cal[:48], yc[:48]),
               "hold16_sqnr_db": Q.sqnr_db(ref_cal[48:], yc[48:]),
               "bytes": len(content), "seconds": secs,
               "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "load": os.getloadavg()[0]}
        row.update(extra or {})
        print("ROW " + json.dumps({k: v for k, v in row.items() if k != "blocks"}), flush=True)
        with open(a.json, "a") as f:
            f.write(json.dumps(row, default=float) + "\n")

    if a.mode == "baseline":
        t0 = time.perf_counter()
        content = Q.convert_to_tflite_int8(model, x_cal, per_channel=True)
        evaluate(content, "baseline W8A8", time.perf_counter() - t0)
        return
    for it in [int(v) for v in a.variants.split(",")]:
        CFG["iters"] = it
        CFG["mode"] = "adaround" if it == 0 else "brecq"
        CFG.pop("_t_brecq", None)
        t0 = time.perf_counter()
        content, rep = cle.quantize(model, x_cal, weight_bits=4, progress=say)
        secs = time.perf_counter() - t0
        if "_ada_content" in CFG:
            evaluate(CFG.pop("_ada_content"), "W4A8 cle adaround (layer-wise)", None,
                     extra={"t_layerwise": CFG["_t_layerwise"]})
        if it:
            evaluate(content, f"W4A8 brecq {it} it", secs, rep,
                     extra={"t_layerwise_cached": CFG.get("_t_layerwise"),
                            "t_brecq": CFG.get("_t_brecq"),
                            "kernels_8bit": sum(1 for r in rep.rounding.layers if r.bits == 8),
                            "blocks": CFG.get("_stats")})


if __name__ == "__main__":
    main()
