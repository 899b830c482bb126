"""Right answers on every host, or a clear refusal: the CPU runtime's target chosen from
the CPU's own flags before the runtime loads, and the device check that every kernel
passes before its first launch (a planted wrong kernel is refused, nothing is launched
after it, conv_state and out stay untouched, and a verdict is per device, driver,
runtime and kernel)."""

import json
import os
import subprocess
import sys

import pytest
import torch

import jitconv
from jitconv.backends.sycl import bootstrap
from jitconv.backends.sycl import device_check
from jitconv.backends.sycl import launching
from jitconv.backends.sycl.state import STATE as SYCL_STATE

from helpers import bits, mixed_step, poisoned, usm_copy

AVX512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}
AVX2 = {"avx", "avx2", "fma", "bmi1", "bmi2", "sse4_2", "popcnt"}
ZEN5 = AVX2 | AVX512 | {"avx512_bf16", "avx512_vp2intersect", "avx512_vnni"}


@pytest.mark.parametrize("vendor, flags, target", [
    ("AuthenticAMD", ZEN5, "skx"),                       # Zen 5 (and Zen 4)
    ("AuthenticAMD", AVX2, "core-avx2"),                 # Zen 3
    ("AuthenticAMD", AVX2 | {"avx512f"}, "core-avx2"),   # AVX-512F alone is not skx
    ("HygonGenuine", {"avx", "sse4_2", "popcnt"}, "corei7-avx"),
    ("CentaurHauls", {"sse4_2", "popcnt"}, "corei7"),
    ("AuthenticAMD", {"sse2", "sse3"}, None),            # below every target: leave it
    ("GenuineIntel", ZEN5, None),                        # the runtime knows Intel CPUs
    ("GenuineIntel", AVX2, None),
])
def test_cpu_target_from_flags(vendor, flags, target):
    assert bootstrap.cpu_target_arch(vendor, flags) == target


def test_host_cpu_reads_cpuinfo(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n"
                    "flags\t\t: fpu sse4_2 avx avx2 avx512f\n\nprocessor\t: 1\n"
                    "vendor_id\t: AuthenticAMD\nflags\t\t: fpu\n")
    assert bootstrap.host_cpu(path) == ("AuthenticAMD", {"fpu", "sse4_2", "avx", "avx2",
                                                          "avx512f"})
    assert bootstrap.host_cpu(tmp_path / "missing") == (None, set())


CHILD = """
import json, os, jitconv
from jitconv.backends.sycl import bootstrap
print(json.dumps([os.environ.get("CL_CONFIG_CPU_TARGET_ARCH"), bootstrap.RUNTIME.cpu_target_set,
                  jitconv.devices()]))
"""


def _child(**env):
    environ = {k: v for k, v in os.environ.items() if k != "CL_CONFIG_CPU_TARGET_ARCH"}
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", CHILD], env=environ, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_bootstrap_sets_the_target_before_the_runtime_loads(sycl_device):
    vendor, flags = bootstrap.host_cpu()
    want = bootstrap.cpu_target_arch(vendor, flags)  # None on an Intel host
    year = bootstrap.cpu_runtime_year()
    if year is not None and year >= 2026:
        want = None  # the 2026 runtimes pick their own target
    value, set_by_us, listed = _child()
    assert value == want and set_by_us == want
    assert any(d.startswith(sycl_device.rsplit(":", 1)[0]) for d in listed)


def test_bootstrap_keeps_the_users_target():
    value, set_by_us, _ = _child(CL_CONFIG_CPU_TARGET_ARCH="corei7")
    assert value == "corei7" and set_by_us is None
    value, set_by_us, _ = _child(JITCONV_NO_BOOTSTRAP="1")
    assert set_by_us is None


# ------------------------------------------------------------------ the device check

@pytest.fixture
def fresh_checks(monkeypatch, tmp_path):
    """A process state in which no kernel has been built or checked yet: verdicts go to
    tmp_path/checks (the kernel cache stays, so no kernel is compiled again), and a
    refusal planted by a test ends with it."""
    monkeypatch.setattr(device_check, "ENABLED", True)
    monkeypatch.setattr(SYCL_STATE, "checks_passed", set())
    monkeypatch.setattr(SYCL_STATE, "refused", {})
    monkeypatch.setattr(device_check, "verdict_dir", lambda: tmp_path / "checks")
    monkeypatch.setattr(SYCL_STATE, "kernels", {})
    monkeypatch.setattr(SYCL_STATE, "unavailable", set())  # a planted miss ends here too
    monkeypatch.setattr(SYCL_STATE, "runs", {})
    return tmp_path / "checks"


def _step(dtype=torch.float32, width=4, seed=0):
    return mixed_step(torch.Generator().manual_seed(seed), dim=64, width=width, dtype=dtype,
                      ns_lengths=[5, 1], sp_lengths=[3], rows="shuffled", ns_pads=0,
                      usm=True)


def _perturb(monkeypatch):
    """Plant a wrong known answer: every kernel now looks wrong to the check."""
    right = device_check.expected
    monkeypatch.setattr(device_check, "expected",
                        lambda *a: (lambda out, state: (out + 0.5, state))(*right(*a)))


def test_first_launch_runs_the_check_once(sycl_device, fresh_checks):
    before = dict(SYCL_STATE.check_stats)
    step = _step()
    jitconv.causal_conv1d_mixed(**step)
    jitconv.causal_conv1d_mixed(**_step(seed=1))
    assert SYCL_STATE.check_stats["checked"] == before["checked"] + 1
    (verdict,) = fresh_checks.glob("*.json")
    record = json.loads(verdict.read_text())
    assert record["passed"] is True and record["kernel"]["width"] == 4
    assert record["device"]["driver"] and record["device"]["name"]


def test_planted_wrong_answer_refuses_the_device(sycl_device, fresh_checks, monkeypatch):
    # A kernel that passed and a launch remembered by run_cache, before the failure.
    good = _step(torch.float32)
    plan_args = {k: good[k] for k in ("x", "weight", "bias", "conv_state")}
    lines, _dim, state_len = good["conv_state"].shape
    plan = jitconv.plan(good["x"].shape[0], lines, state_len, 4,
                        **{k: v for k, v in good.items() if k not in plan_args})
    plan.run(**plan_args)
    plan.run(**plan_args)
    _perturb(monkeypatch)
    step = _step(torch.bfloat16)
    out = poisoned(step["x"].shape, torch.bfloat16, usm=True)
    state_before, out_before = bits(step["conv_state"]), bits(out)
    submitted, stored = SYCL_STATE.stats["submitted"], SYCL_STATE.check_stats["stored"]
    with pytest.raises(device_check.DeviceCheckError) as error:
        jitconv.causal_conv1d_mixed(**step, out=out)
    message = str(error.value)
    device = jitconv.get_queue().sycl_device
    for needle in (device.filter_string, device.name, device.driver_version, "bfloat16",
                   "width=4", "outputs wrong", "JITCONV_DEVICE_CHECK=0", "2026"):
        assert needle in message, needle
    assert torch.equal(bits(step["conv_state"]), state_before)
    assert torch.equal(bits(out), out_before)
    assert SYCL_STATE.check_stats["stored"] == stored  # nothing cached as passed
    assert not [p for p in fresh_checks.glob("*.json")
                if json.loads(p.read_text())["kernel"]["dtype"] == "bfloat16"]
    # Nothing more is launched on this device: not the refused kernel, not the kernel
    # that passed, not the remembered launch of a plan.
    for call in (lambda: jitconv.causal_conv1d_mixed(**step, out=out),
                 lambda: jitconv.causal_conv1d_mixed(**_step(torch.float32, seed=3)),
                 lambda: plan.run(**plan_args)):
        with pytest.raises(device_check.DeviceCheckError):
            call()
    assert SYCL_STATE.stats["submitted"] == submitted
    assert torch.equal(bits(step["conv_state"]), state_before)


def _device_plan_step(seed=0, dtype=torch.bfloat16):
    """A device plan on USM metadata (a mixed step, tokens in consecutive rows) and its
    layer's tensors."""
    step = mixed_step(torch.Generator().manual_seed(seed), dim=64, width=4, dtype=dtype,
                      ns_lengths=[5, 1], sp_lengths=[3], rows="plain", ns_pads=0,
                      usm=True)
    lines, _dim, state_len = step["conv_state"].shape
    metadata = {}
    for name in ("non_spec_query_start_loc", "non_spec_state_indices", "has_initial_state",
                 "spec_query_start_loc", "spec_state_indices", "num_accepted_tokens"):
        value = torch.as_tensor(step[name])
        metadata[name] = usm_copy(value if value.dtype == torch.bool else
                                  value.to(torch.int32))
    plan = jitconv.device_plan(step["x"].shape[0], lines, state_len, 4, **metadata)
    return plan, {k: step[k] for k in ("x", "weight", "bias", "conv_state")}


@pytest.mark.parametrize("call", ["mixed", "device plan"])
def test_a_wrong_kernel_is_caught(sycl_device, fresh_checks, monkeypatch, call):
    """A real wrong kernel (width 3's code asked to compute width 4) fails the check: the
    kernel of a mixed call, and a device plan's fused kernel (checked on the device
    plan's layout of the known-answer step)."""
    if call == "device plan" and not launching.have_compiler():
        pytest.skip("width 3's fused kernel is neither shipped nor compilable without "
                    "numba-dpex (a device plan then runs the planner and width 3's plain "
                    "kernel, which is what the mixed case checks)")
    build = launching._build
    monkeypatch.setattr(launching, "_build",
                        lambda width, dtype_name, queue, wide, fast=None, record_types=None,
                        chains=False, stage=False: build(3 if width == 4 else width,
                                                         dtype_name, queue, wide, fast,
                                                         record_types, chains, stage))
    with pytest.raises(device_check.DeviceCheckError, match="outputs wrong") as error:
        if call == "mixed":
            jitconv.causal_conv1d_mixed(**_step(torch.float32))
        else:
            plan, layer = _device_plan_step()
            state_before = bits(layer["conv_state"])
            plan.run(**layer)
    if call == "device plan":
        assert "fused, for device plans" in str(error.value)
        assert torch.equal(bits(layer["conv_state"]), state_before)


def test_a_device_plans_fused_kernel_is_checked(sycl_device, fresh_checks, monkeypatch):
    """A device plan's first run builds its fused kernel and checks it first (its own
    verdict, with the metadata's types); a planted wrong answer refuses the device
    before anything of the run is launched."""
    before = SYCL_STATE.check_stats["checked"]
    plan, layer = _device_plan_step(seed=1)
    plan.run(**layer)
    plan.check_errors()
    records = [json.loads(p.read_text())["kernel"] for p in fresh_checks.glob("*.json")]
    assert [r["record_types"] for r in records if "record_types" in r] == \
        [list(plan.element_types)], records
    assert SYCL_STATE.check_stats["checked"] == before + 1
    monkeypatch.setattr(SYCL_STATE, "kernels", {})
    monkeypatch.setattr(SYCL_STATE, "checks_passed", set())
    monkeypatch.setattr(device_check, "verdict_dir", lambda: fresh_checks / "other")
    _perturb(monkeypatch)
    plan, layer = _device_plan_step(seed=2)
    state_before = bits(layer["conv_state"])
    with pytest.raises(device_check.DeviceCheckError, match="fused, for device plans"):
        plan.run(**layer)
    assert torch.equal(bits(layer["conv_state"]), state_before)


def _stage_call(seed=0):
    """A GDN stage run on a small mixed step (one q / k head and two v heads of 32)
    through the public op; returns its conv_state."""
    gen = torch.Generator().manual_seed(seed)
    step = mixed_step(gen, dim=128, width=4, dtype=torch.bfloat16, ns_lengths=[5, 1],
                      sp_lengths=[3], rows="shuffled", ns_pads=0, spec_columns=2)
    T = step["x"].shape[0]
    ab = torch.randn((T, 4), generator=gen).to(torch.bfloat16)
    jitconv.gdn_conv_stage(step.pop("x"), step.pop("weight"), step.pop("bias"),
                           step["conv_state"], ab[:, :2], ab[:, 2:], torch.randn(2),
                           torch.randn(2), num_k_heads=1, head_k_dim=32, head_v_dim=32,
                           **{k: v for k, v in step.items() if k != "conv_state"})
    return step["conv_state"]


def test_the_stage_kernel_is_checked(sycl_device, fresh_checks, monkeypatch):
    """A GDN stage kernel passes its own known-answer check (the stage's reference, the
    nd-range launch with its barrier) before its first launch, once; a planted wrong
    answer refuses the device before anything of the run is launched."""
    before = SYCL_STATE.check_stats["checked"]
    _stage_call()
    _stage_call(seed=1)
    records = [json.loads(p.read_text())["kernel"] for p in fresh_checks.glob("*.json")]
    assert [r.get("stage") for r in records] == [True], records  # no conv kernel built
    assert SYCL_STATE.check_stats["checked"] == before + 1
    monkeypatch.setattr(SYCL_STATE, "kernels", {})
    monkeypatch.setattr(SYCL_STATE, "checks_passed", set())
    monkeypatch.setattr(device_check, "verdict_dir", lambda: fresh_checks / "other")
    right = device_check.reference.gdn_conv_stage_reference

    def wrong(*args, **kwargs):  # every spec k 0.5 off
        parts, state = right(*args, **kwargs)
        parts["spec"]["k"] = parts["spec"]["k"] + 0.5
        return parts, state
    monkeypatch.setattr(device_check.reference, "gdn_conv_stage_reference", wrong)
    submitted = SYCL_STATE.stats["submitted"]
    with pytest.raises(device_check.DeviceCheckError, match=r"\(the GDN stage\).*spec k "
                       r"outputs wrong") as error:
        _stage_call(seed=2)
    assert "non_spec" not in str(error.value).split("known-answer step:")[-1]
    assert SYCL_STATE.stats["submitted"] == submitted  # nothing of the run launched


def test_verdict_key_follows_device_driver_runtime_and_kernel():
    identity = {"filter": "opencl:cpu:0", "name": "CPU", "vendor": "Intel(R) Corporation",
                "driver": "2024.18.7.0.11_160000", "backend": "opencl", "type": "cpu",
                "runtime": {"dpctl": "0.17.0", "intel-sycl-rt": "2024.2.2"},
                "cpu_target": "skx"}
    spirv = b"\x03\x02\x23\x07" + bytes(range(64))
    key = device_check.verdict_key(identity, spirv)
    assert device_check.verdict_key(dict(identity, filter="opencl:cpu:1"), spirv) == key
    changed = [dict(identity, name="GPU"), dict(identity, driver="2026.20.1"),
               dict(identity, runtime={"dpctl": "0.22.1", "intel-sycl-rt": "2026.2.0"}),
               dict(identity, cpu_target="core-avx2"), dict(identity, cpu_target=None)]
    keys = {device_check.verdict_key(i, spirv) for i in changed}
    keys.add(device_check.verdict_key(identity, spirv[:-1] + b"\x00"))
    assert key not in keys and len(keys) == len(changed) + 1


def test_stored_verdicts_are_per_device_and_kernel(sycl_device, fresh_checks, monkeypatch):
    queue = jitconv.get_queue()
    kernel, spirv = launching._build(4, "float32", queue, False)
    launch = launching._known_answer_launch(kernel, queue, "float32", False)
    assert device_check.verify(queue, 4, "float32", False, spirv, launch) == "checked"
    assert device_check.verify(queue, 4, "float32", False, spirv, launch) == "passed"
    monkeypatch.setattr(SYCL_STATE, "checks_passed", set())  # a new process, same machine
    assert device_check.verify(queue, 4, "float32", False, spirv, launch) == "stored"
    # Another kernel (other SPIR-V) or another driver is not trusted: checked again.
    assert device_check.verify(queue, 4, "float32", False, spirv + b"\0\0\0\0",
                               launch) == "checked"
    identity = device_check.device_identity
    monkeypatch.setattr(device_check, "device_identity",
                        lambda d: dict(identity(d), driver="another driver"))
    assert device_check.verify(queue, 4, "float32", False, spirv, launch) == "checked"
    # A stored verdict that does not say "passed" is not trusted.
    for path in fresh_checks.glob("*.json"):
        path.write_text(json.dumps(dict(json.loads(path.read_text()), passed=False)))
    monkeypatch.setattr(SYCL_STATE, "checks_passed", set())
    assert device_check.verify(queue, 4, "float32", False, spirv, launch) == "checked"


def test_check_off_is_a_setting(sycl_device, fresh_checks, monkeypatch):
    monkeypatch.setattr(device_check, "ENABLED", False)
    _perturb(monkeypatch)
    jitconv.causal_conv1d_mixed(**_step())  # not checked, so not refused
    assert not list(fresh_checks.glob("*.json"))
    done = subprocess.run(
        [sys.executable, "-c", "from jitconv.backends.sycl import device_check; print(device_check.ENABLED)"],
        env=dict(os.environ, JITCONV_DEVICE_CHECK="0"), capture_output=True, text=True,
        timeout=300)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stderr[-2000:]


def test_check_command_prints_every_verdict(sycl_device, tmp_path):
    env = dict(os.environ, JITCONV_CACHE_DIR=str(tmp_path), JITCONV_DEVICE=sycl_device)
    env.pop("JITCONV_NO_SHIPPED_KERNELS", None)  # the shipped kernels: nothing to compile
    done = subprocess.run([sys.executable, "-m", "jitconv", "check", "--widths", "4",
                           "--dtypes", "float32", "--dim", "64"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    verdicts = [line for line in done.stdout.splitlines() if line.startswith("  width ")
                and "ms)" in line]
    cache = jitconv.backends.sycl.launching.kernel_cache
    assert len(verdicts) == len(cache.specializations()) + len(
        cache.fused_specializations()) + len(cache.stage_specializations())
    assert sum(" fused, metadata " in line for line in verdicts) == \
        len(cache.fused_specializations())
    assert sum(" GDN stage " in line for line in verdicts) == \
        len(cache.stage_specializations())
    assert all(" passed " in line for line in verdicts), verdicts
    assert done.stdout.strip().endswith("check: OK")
    assert len(list((tmp_path / "checks").glob("*.json"))) == len(verdicts)
