"""One cached decoding step's instructions, counted by callgrind (deterministic, unlike wall time on a shared
machine). Run through run.sh, which builds toggle.c and starts this under valgrind; counting covers only the
timed steps (toggle.c's client requests), after an uncounted prefill and warm-up.

    python dev/step_instructions/step.py SHAPE STATE STEPS     (STATE: stock or a design, e.g. mrope)
"""
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from benchmarks import hf_e2e as E  # noqa: E402
from ropekit.hf import patch_model  # noqa: E402

torch.set_num_threads(1)
lib = ctypes.CDLL(os.environ["TOGGLE_LIB"])
shape, state, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
model, inputs = E.QWEN2_VL.model(shape), E.QWEN2_VL.inputs(shape, 1)
if state != "stock":
    patch_model(model, design=state)
key = E._cache()
with torch.no_grad():
    for counted in (False, True):  # the first pass warms up
        out = model(**inputs, use_cache=True, logits_to_keep=1)
        cache, token = getattr(out, key), out.logits[:, -1:].argmax(-1)
        for _ in range(3):
            out = model(input_ids=token, **{key: cache}, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
        if counted:
            lib.cg_start()
        for _ in range(steps):
            out = model(input_ids=token, **{key: cache}, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
        if counted:
            lib.cg_stop()
