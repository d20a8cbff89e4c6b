"""The timing allocator setting: freed memory stays in the process, so repeated large allocations
stop faulting pages in (a negative control runs with the allocator's defaults)."""

import os
import subprocess
import sys

import pytest

from budgeted_attention.benchmark import allocator

# Forward passes of an encoder whose activations are megabytes (d 256, batch 16, sequence 128):
# warm-up, then the page faults of 6 more passes.
SCRIPT = """
import resource, torch
from budgeted_attention.benchmark.allocator import keep_freed_memory
from budgeted_attention.model.config import ModelConfig
from budgeted_attention.model.transformer import EncoderClassifier
torch.set_num_threads(1)
print(keep_freed_memory())
model = EncoderClassifier(ModelConfig(vocab_size=50, d_model=256, n_layers=1, n_heads=8, d_ff=1024, max_len=128, n_classes=2)).eval()
ids = torch.randint(3, 50, (16, 128))
def passes(n):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with torch.inference_mode():
        for _ in range(n):
            model(ids, torch.ones_like(ids))
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
passes(4)
print(passes(6))
"""


def _run(opt_out: bool) -> tuple[str, int]:
    """(the allocator setting, page faults of 6 passes) of SCRIPT in a fresh process."""
    env = {key: value for key, value in os.environ.items() if key != allocator.OPT_OUT}
    if opt_out:
        env[allocator.OPT_OUT] = "1"
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120, check=True)
    setting, faults = out.stdout.strip().splitlines()[-2:]
    return setting, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    setting, faults = _run(False)
    if not setting.startswith("glibc"):
        pytest.skip(f"not glibc: {setting}")
    assert "freed memory kept" in setting
    default, default_faults = _run(True)
    print(f"faults of 6 passes: {faults} kept, {default_faults} with the defaults")
    assert "defaults" in default
    # The defaults hand the activations' pages back and fault them in again on every pass (about
    # 1,000-4,000 per pass); kept, they are reused (at most a heap extension or two after warm-up).
    assert default_faults > 2_000 and faults * 5 < default_faults


def test_the_setting_is_made_once_and_reported(monkeypatch):
    monkeypatch.setattr(allocator, "_setting", None)
    monkeypatch.setenv(allocator.OPT_OUT, "1")
    assert allocator.keep_freed_memory() == f"the system allocator's defaults ({allocator.OPT_OUT} is set)"
    monkeypatch.delenv(allocator.OPT_OUT)
    assert allocator.keep_freed_memory().endswith("is set)")  # cached: once per process
