"""The llama.cpp memory plan from boot-log lines: per-backend sums and per-buffer-type counts."""
from __future__ import annotations

from arms.bootlog import parse_boot_log
from arms.profiles import load_profile

PROFILE = load_profile("llamacpp")


def test_overrides_are_counted_per_buffer_type_and_buffers_summed_per_backend():
    text = ("0.00.023.975 D tensor blk.0.ffn_gate_exps.weight (0 MiB f16) buffer type overridden to CPU\n"
            "0.00.024.069 D tensor blk.0.ffn_down_exps.weight (0 MiB f16) buffer type overridden to CPU\n"
            "0.00.024.135 D tensor blk.0.ffn_up_exps.weight (0 MiB f16) buffer type overridden to CPU\n"
            "tensor blk.1.ffn_up_exps.weight buffer type overriden to CUDA0\n"
            "0.00.028.564 I load_tensors:   CPU_Mapped model buffer size =     0.19 MiB\n"
            "0.00.028.565 I load_tensors:        CUDA0 model buffer size =   100.00 MiB\n"
            "0.00.028.566 I load_tensors:   CPU_Mapped model buffer size =     0.81 MiB\n")
    plan = parse_boot_log(text, PROFILE).plan
    assert plan["tensor_overrides"] == {"CPU": 3, "CUDA0": 1}
    assert plan["model_buffers_mib"] == {"CPU_Mapped": 1.0, "CUDA0": 100.0}
    assert plan["model_buffer_mib"] == 101.0
