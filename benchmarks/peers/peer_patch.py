"""A pytest plugin that runs a peer project's own conv tests through jitconv: loaded with
``-p peer_patch`` (this folder on PYTHONPATH) before the test modules import the peer's
ops, it puts jitconv's drop-ins in their place.

JITCONV_PEER=vllm: ``jitconv.vllm.plugin.install()`` on the vLLM ops module on the path
(the plugin reads that module's signatures and conventions, as in an engine);
JITCONV_PEER=sglang: ``jitconv.sglang``'s drop-ins bound into SGLang's Triton ops module
(its tests import the ops from there). Nothing of the peer's code is changed.
JITCONV_PEER_DEVICE: the jitconv device (default cuda:0; opencl:cpu runs the tests whose
tensors are on the CPU)."""

import collections
import functools
import os

CALLS = collections.Counter()


def _counted(name, fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        CALLS[name] += 1
        return fn(*args, **kwargs)
    return call


def pytest_sessionfinish(session, exitstatus):
    print(f"\njitconv calls: {dict(CALLS)}")


def pytest_configure(config):
    import jitconv
    jitconv.set_device(os.environ.get("JITCONV_PEER_DEVICE", "cuda:0"))
    peer = os.environ["JITCONV_PEER"]
    if peer == "vllm":
        from jitconv.vllm import plugin
        replaced = plugin.install()
        assert any(name.endswith("causal_conv1d_update") for name in replaced), replaced
        import vllm.model_executor.layers.mamba.ops.causal_conv1d as ops
        ops.causal_conv1d_update = _counted("causal_conv1d_update", ops.causal_conv1d_update)
        print("jitconv replaced:", replaced)
    elif peer == "sglang":
        import sglang.kernels.ops.mamba.causal_conv1d_triton as ops
        from jitconv import sglang as drop_ins
        ops.causal_conv1d_fn = _counted("causal_conv1d_fn", drop_ins.causal_conv1d_fn)
        ops.causal_conv1d_update = _counted("causal_conv1d_update",
                                            drop_ins.causal_conv1d_update)
        print("jitconv replaced: sglang.kernels.ops.mamba.causal_conv1d_triton."
              "causal_conv1d_fn, causal_conv1d_update")
    else:
        raise ValueError(f"JITCONV_PEER: 'vllm' or 'sglang', got {peer!r}")
