#!/usr/bin/env python
"""The README's report picture: a tiny GPT-2 training step, eager and Inductor, predicted (no GPU),
rendered with kernelab.html_report; then, with Debian's chromium:
    chromium --headless --no-sandbox --window-size=1280,2000 --screenshot=report.png file:///tmp/gpt2_report.html
"""
import torch, kernelab
from kernelab.zoo import ZOO
from kernelab.html_report import render_html
zm = ZOO["gpt2"]
model, inputs = zm.build("tiny", device="cpu", dtype=torch.float32)
def step(**kw):
    loss = zm.loss(model, kw)
    loss.backward()
    return loss
reports = [kernelab.count(step, mode=m, predict=True, **inputs) for m in ("eager", "inductor")]
open("/tmp/gpt2_report.html", "w").write(render_html(reports, title="GPT-2 (tiny config) training step, predicted for an H200"))
print([r.num_kernels for r in reports])
