#!/usr/bin/env bash
# Cross-checks a `dptrain export` file outside Rust: the onnx package's full checker (with
# shape inference), then onnxruntime and onnx's reference evaluator (two independent
# implementations) on one random batch at two batch sizes, which must agree within 1e-4.
# (tests/export.rs holds every export to dptrain's own logits through tract.)
# Python packages come from the venv at ${PEER_VENV:-$HOME/torchvenv}, made if absent.
# Usage: scripts/check_onnx.sh MODEL.onnx
set -euo pipefail
model=${1:?usage: scripts/check_onnx.sh MODEL.onnx}
venv=${PEER_VENV:-$HOME/torchvenv}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import onnx, onnxruntime' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q onnx onnxruntime numpy
fi
"$venv/bin/python" - "$model" <<'PY'
import sys
import numpy as np, onnx, onnxruntime as ort
from onnx.reference import ReferenceEvaluator
path = sys.argv[1]
m = onnx.load(path)
onnx.checker.check_model(m, full_check=True)
meta = {p.key: p.value for p in m.metadata_props}
dims = [d.dim_param or d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
print(f"{path}: opset {m.opset_import[0].version}, input {m.graph.input[0].name} {dims}, "
      f"output {m.graph.output[0].name}, {len(m.graph.node)} nodes; checker passed")
for k in ("class_names", "normalize_mean", "normalize_std", "input_shape"):
    if k in meta:
        print(f"  {k} = {meta[k]}")
sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
ref = ReferenceEvaluator(m)
rng = np.random.default_rng(0)
for n in (1, 7):
    x = rng.uniform(-1, 1, size=[n, *dims[1:]]).astype(np.float32)
    a = sess.run(None, {"input": x})[0]
    b = ref.run(None, {"input": x})[0]
    worst = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1)))
    print(f"  batch {n}: logits {a.shape}, onnxruntime vs reference evaluator: max diff {worst:.2e}")
    assert a.shape == (n, int(meta.get("dptrain.classes", a.shape[1]))) and worst <= 1e-4
print("ok")
PY
