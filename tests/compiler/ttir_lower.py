"""Lower generated kernels to TTIR with Triton's real front-end (no GPU needed): type errors,
loop-carried type changes and bad broadcasts that the interpreter tolerates fail here.

    python tests/compiler/ttir_lower.py JOBS.json    (run without TRITON_INTERPRET)

JOBS.json: [{"path" (or "factory": "module:function" returning the kernel), "name", "signature": {arg:
type}, "constexprs": {arg: value}}]. Prints one
line per job: "ok NAME" or "FAIL NAME: error".
"""
import importlib.util
import json
import sys


def lower(job, backend, target):
    from triton._C.libtriton import ir
    from triton.compiler.compiler import ASTSource

    if "factory" in job:  # "module:function" returning the kernel (kernelab's fixed kernels)
        module_name, function = job["factory"].split(":")
        fn = getattr(importlib.import_module(module_name), function)()
    else:
        spec = importlib.util.spec_from_file_location("kl_ttir_" + job["name"], job["path"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, job["name"])
    constexprs = {(fn.arg_names.index(k),): v for k, v in job["constexprs"].items()}
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    src = ASTSource(fn, job["signature"], constexprs)
    return src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)


def main():
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend

    target = GPUTarget("cuda", 90, 32)
    backend = CUDABackend(target)
    for job in json.load(open(sys.argv[1])):
        try:
            lower(job, backend, target)
            print(f"ok {job['name']}")
        except Exception as exc:  # noqa: BLE001 - reported per kernel
            print(f"FAIL {job['name']}: {type(exc).__name__}: {str(exc)[:600]}".replace("\n", " "))


if __name__ == "__main__":
    main()
