"""jitconv's CUDA kernels (and vLLM's Triton decode kernel) compiled to SASS for the H200
(sm_90) on a machine without a GPU: read registers and the instruction order before
spending device time.

    python sass_offline.py OUT_DIR '{"width": 4, "dtype_name": "bfloat16", "channels": 2,
        "short_tokens": 1, "row_group": 2, "layout": [...], "block": [128, 1], ...}'
    python sass_offline.py OUT_DIR --triton VLLM_CAUSAL_CONV1D_PY [bf16|fp32] [DIM]

The JSON holds the fields of a ``source.KernelSpec`` (what ``launching`` chooses for a
launch; ``layout`` in ``source.LAYOUT_ARGS`` order, ``fused_plan`` the metadata's element
types, ``plan_kind`` as [[name, value], ...]). Writes NAME.ptx,
NAME.cubin, NAME.sass in OUT_DIR and prints ptxas's register / spill report.

Needs, in its own virtual environment (not the project's: numba-dpex pins numba 0.59):
numba-cuda with the numba and numpy it wants, nvidia-cuda-nvrtc (numba-cuda asks NVRTC
which architectures it supports), triton (its wheel carries nvdisasm), and a CUDA
toolkit's libNVVM and ptxas (CUDA_HOME, default /usr/local/cuda). numba-cuda asks the
current device for its compute capability when it compiles device functions: with no
GPU, this script answers 9.0 in its place (``_no_device``); nothing is launched.
"""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CUDA_HOME = Path(os.environ.setdefault("CUDA_HOME", "/usr/local/cuda"))
ARCH = (9, 0)


def _tool(name):
    """nvdisasm / ptxas: from the toolkit, else from Triton's wheel."""
    if (CUDA_HOME / "bin" / name).exists():
        return str(CUDA_HOME / "bin" / name)
    import triton
    found = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not found.exists():
        sys.exit(f"{name}: not in {CUDA_HOME / 'bin'} nor in Triton's wheel")
    return str(found)


def assemble(out, ptx, max_registers=None):
    """ptxas for sm_90, then nvdisasm: OUT.cubin, OUT.sass; ptxas's report lines."""
    Path(out + ".ptx").write_text(ptx)
    command = [_tool("ptxas"), f"-arch=sm_{ARCH[0]}{ARCH[1]}", "-v", out + ".ptx",
               "-o", out + ".cubin"]
    if max_registers:
        command.insert(1, f"-maxrregcount={max_registers}")
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    sass = subprocess.run([_tool("nvdisasm"), "-c", out + ".cubin"], capture_output=True,
                          text=True, check=True).stdout
    Path(out + ".sass").write_text(sass)
    return [line for line in done.stderr.splitlines() if "Used" in line or "spill" in line]


def _no_device():
    """numba-cuda's device-function compile asks the current device for its compute
    capability: answer ARCH instead of initialising a driver that is not there."""
    import numba.cuda.dispatcher as dispatcher
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=ARCH)


def jitconv_kernel(out, options):
    """make_conv_kernel(**options) compiled to PTX instead of loaded on a GPU."""
    sys.path.insert(0, str(ROOT))
    # the package's __init__ imports torch (not needed here): load its modules alone
    package = types.ModuleType("jitconv")
    package.__path__ = [str(ROOT / "jitconv")]
    sys.modules["jitconv"] = package
    _no_device()
    from numba import cuda
    from numba.core.typing.templates import Signature
    import jitconv.backends.cuda.kernels as kernels_cuda
    real_jit = cuda.jit
    compiled = {}

    def to_ptx(*args, **kwargs):  # the kernel's cuda.jit(signature, ...) only
        if args and isinstance(args[0], Signature) and not kwargs.get("device"):
            def compile_ptx(function):
                compiled["ptx"], _ = cuda.compile_ptx(function, args[0], cc=ARCH,
                                                      fastmath=kwargs.get("fastmath", False))
                compiled["max_registers"] = kwargs.get("max_registers")
            return compile_ptx
        return real_jit(*args, **kwargs)

    kernels_cuda.cuda.jit = to_ptx
    try:
        from jitconv.backends.cuda.source import KernelSpec
        options = dict(options)
        for key in ("layout", "block", "fused_plan"):
            if options.get(key) is not None:
                options[key] = tuple(options[key])
        if options.get("plan_kind") is not None:  # [[name, value], ...]
            options["plan_kind"] = tuple((n, v) for n, v in options["plan_kind"])
        kernels_cuda.make_conv_kernel(KernelSpec(**options))
    finally:
        kernels_cuda.cuda.jit = real_jit
    return assemble(out, compiled["ptx"], compiled["max_registers"])


def triton_decode_kernel(out, vllm_file, dtype="bf16", dim=2048):
    """vLLM's _causal_conv1d_update_kernel as vLLM launches it for decode-only 64 (bench
    workload; no PDL), compiled for sm_90 by Triton without a GPU."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sys.modules.setdefault("torch", types.ModuleType("torch"))  # the file imports it
    sys.modules["torch"].Tensor = object
    # vLLM's imports replaced as bench_gpu.load_vllm_triton does (that one needs torch
    # and a GPU); the layout below is the bench's decode-only step (state_len 6).
    text = Path(vllm_file).read_text()
    text = text.replace("from vllm.platforms import current_platform", "")
    text = text.replace("from vllm.triton_utils import tl, triton",
                        "import triton\nimport triton.language as tl")
    text = text.replace("from vllm.v1.attention.backends.utils import NULL_BLOCK_ID, PAD_SLOT_ID",
                        "NULL_BLOCK_ID, PAD_SLOT_ID = 0, -1")
    text = text.split("\nif current_platform.is_cpu()")[0]
    module = types.ModuleType("vllm_causal_conv1d")
    module.__file__ = str(Path(out).with_suffix(".vllm.py"))
    Path(module.__file__).write_text(text)  # triton reads the kernel's source file
    exec(compile(text, module.__file__, "exec"), module.__dict__)
    kernel = module._causal_conv1d_update_kernel
    pointer = f"*{dtype}"
    signature = {"x_ptr": pointer, "w_ptr": pointer, "bias_ptr": pointer,
                 "conv_state_ptr": pointer, "conv_state_indices_ptr": "*i32",
                 "num_accepted_tokens_ptr": "*i32", "query_start_loc_ptr": "*i32",
                 "o_ptr": pointer, "batch": "i32", "num_cache_lines": "i32",
                 "stride_x_token": "i64", "stride_o_token": "i64"}
    constants = dict(dim=dim, seqlen=1, state_len=3, stride_x_seq=dim, stride_x_dim=1,
                     stride_w_dim=4, stride_w_width=1, stride_conv_state_seq=dim * 6,
                     stride_conv_state_dim=1, stride_conv_state_tok=dim,
                     stride_state_indices=1, stride_o_seq=dim, stride_o_dim=1,
                     null_block_id=-1, HAS_BIAS=True, KERNEL_WIDTH=4, SILU_ACTIVATION=True,
                     IS_VARLEN=False, IS_SPEC_DECODING=False, NP2_STATELEN=4,
                     HAS_NULL_BLOCK=True, BLOCK_N=256, launch_pdl=False)
    signature.update({name: "constexpr" for name in constants})
    at = kernel.arg_names.index
    aligned = ("x_ptr", "w_ptr", "bias_ptr", "conv_state_ptr", "conv_state_indices_ptr", "o_ptr")
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(at(n),): v for n, v in constants.items()},
                       attrs={(at(n),): [["tt.divisibility", 16]] for n in aligned})
    result = triton.compile(source, target=GPUTarget("cuda", ARCH[0] * 10 + ARCH[1], 32))
    Path(out + ".cubin").write_bytes(result.asm["cubin"])
    Path(out + ".ptx").write_text(result.asm["ptx"])
    Path(out + ".sass").write_text(subprocess.run(
        [_tool("nvdisasm"), "-c", out + ".cubin"], capture_output=True, text=True,
        check=True).stdout)
    return [f"{result.metadata.num_warps} warps"]


def main(argv):
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        sys.exit("NUMBA_ENABLE_CUDASIM=1: the simulator compiles nothing; unset it")
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    if argv[1] == "--triton":
        dtype = argv[3] if len(argv) > 3 else "bf16"
        dim = int(argv[4]) if len(argv) > 4 else 2048
        lines = triton_decode_kernel(str(out_dir / f"triton_update_{dtype}_{dim}"), argv[2],
                                     dtype, dim)
    else:
        options = json.loads(argv[1])
        name = "jitconv_" + "_".join(f"{k}{v}" for k, v in sorted(options.items())
                                     if k not in ("layout",))
        name = "".join(ch if ch.isalnum() or ch in "_-" else "" for ch in name)[:120]
        lines = jitconv_kernel(str(out_dir / name), options)
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
