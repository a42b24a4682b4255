"""llama.cpp for the inference benchmark (`make bench-llamacpp`): its tools built once from the
llama-cpp-python source distribution (which carries llama.cpp's whole source under vendor/llama.cpp)
into Gym's cache, the embedded model written as GGUF at F32 / Q8_0 / Q4_0 by llama.cpp's own
quantizer, and helpers that run `llama-bench` and `llama-server`.

Building takes ~10 minutes on 2 cores, once per llama-cpp-python version and machine; nothing here runs
in `make test`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python's sdist; its vendor/llama.cpp is the llama.cpp we measure
TOOLS = ("llama-bench", "llama-server", "llama-quantize")


# `--isa avx2`: llama.cpp limited to AVX2 (and FMA, F16C, BMI2), as Gym's kernels are by GYM_KERNEL_ISA=avx2,
# so an AVX-512 machine measures both AVX2 paths in one run.
ISA_FLAGS = {
    "native": ["-DGGML_NATIVE=ON"],
    # native but no AMX: a VM may list AMX in its CPU flags without enabling it (llama.cpp's AMX kernels then
    # die with SIGILL at their first tile instruction, as on this project's 2026-11 machine)
    "native-noamx": ["-DGGML_NATIVE=ON", "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
                     "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"],
    "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF",
             "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
             "-DGGML_AMX_BF16=OFF"],
}
ISA = os.environ.get("GYM_BENCH_ISA", "native")  # set by bench/infer_speed.py --isa


def cache_dir() -> Path:
    home = Path(os.environ.get("GYM_HOME", Path.home() / ".cache" / "gym")).expanduser()
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[-1].split("\n", 1)[0] if Path(
        "/proc/cpuinfo").is_file() else platform.processor()
    key = hashlib.sha256(f"{VERSION}:{flags}".encode()).hexdigest()[:12]
    return home / "llamacpp" / f"{VERSION}-{key}"


def build_dir() -> Path:
    return cache_dir() / ("build" if ISA == "native" else f"build-{ISA}")


def source_dir() -> Path:
    """llama.cpp's source, from the sdist (downloaded once with pip)."""
    root = cache_dir()
    source = root / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    if (source / "CMakeLists.txt").is_file():
        return source
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={VERSION}", "-d", str(root)], check=True)
    with tarfile.open(root / f"llama_cpp_python-{VERSION}.tar.gz") as archive:
        archive.extractall(root, filter="data")
    return source


def build() -> Path:
    """The folder holding llama-bench, llama-server and llama-quantize, built for this CPU (or its AVX2 path)."""
    out = build_dir()
    binaries = out / "bin"
    if all((binaries / tool).is_file() for tool in TOOLS):
        return binaries
    if shutil.which("cmake") is None:
        sys.exit("Building llama.cpp needs cmake (apt-get install cmake) and a C++ compiler.")
    source = source_dir()
    started = time.perf_counter()
    print(f"Building llama.cpp {VERSION} tools into {out} (once; ~10 minutes on 2 cores)...", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "build.log"  # the compiler's thousands of warnings go here, not to the table
    with log.open("w") as sink:
        # No network during the build: no prebuilt web UI download, no HTTPS client.
        steps = [["cmake", "-S", str(source), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", *ISA_FLAGS[ISA],
                  "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
                  "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF"],
                 ["cmake", "--build", str(out), "-j", str(os.cpu_count() or 2), "--target", *TOOLS]]
        for step in steps:
            if subprocess.run(step, stdout=sink, stderr=subprocess.STDOUT).returncode != 0:
                sys.exit(f"Building llama.cpp failed; the last lines of {log}:\n"
                         + "\n".join(log.read_text().splitlines()[-20:]))
    print(f"Built in {time.perf_counter() - started:.0f} s.", flush=True)
    return binaries


def gguf_files(source: Path, kinds: tuple[str, ...] = ("F32", "Q8_0", "Q4_0")) -> dict[str, Path]:
    """The GGUF model `source` at each weight type, written by llama-quantize. The embedded model ships as
    Q4_1; dequantized to F32 it holds exactly the float weights Gym's converted copy holds, so every row
    of the benchmark serves the same model."""
    binaries = build()
    folder = cache_dir() / "models" / hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for kind in ("F32",) + tuple(k for k in kinds if k != "F32"):
        path = folder / f"model-{kind}.gguf"
        if not path.is_file():
            origin = source if kind == "F32" else files["F32"]
            partial = path.with_suffix(".partial")
            done = subprocess.run([str(binaries / "llama-quantize"), "--allow-requantize", str(origin), str(partial),
                                   kind], capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"llama-quantize {kind} failed:\n{done.stderr[-2000:]}")
            partial.rename(path)
        files[kind] = path
    return {kind: files[kind] for kind in kinds}


def llama_bench(model: Path, *, threads: int, prompt: int, generate: int, repetitions: int = 3) -> dict[str, float]:
    """llama-bench's tokens/s for prefilling `prompt` tokens and for generating `generate` tokens."""
    out = subprocess.run([str(build() / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", str(prompt),
                          "-n", str(generate), "-r", str(repetitions), "-o", "json"], check=True,
                         capture_output=True, text=True).stdout
    rates = {}
    for row in json.loads(out):
        rates["prefill" if row["n_prompt"] else "decode"] = float(row["avg_ts"])
    return rates


class LlamaServer:
    """llama-server with `parallel` slots on a free local port, as a context manager."""

    def __init__(self, model: Path, *, threads: int, parallel: int, context_per_slot: int) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [str(build() / "llama-server"), "-m", str(model), "-t", str(threads), "-tb", str(threads),
                        "-np", str(parallel), "-c", str(parallel * context_per_slot), "--port", str(self.port),
                        "--host", "127.0.0.1", "--no-webui", "-cb"]

    def __enter__(self) -> LlamaServer:
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.process.kill()
        raise RuntimeError(f"llama-server did not start: {' '.join(self.command)}")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def complete(self, prompt: list[int], new_tokens: int, seed: int) -> tuple[int, float]:
        """Generate exactly `new_tokens` after `prompt` (token ids); (tokens generated, seconds to the first)."""
        body = json.dumps({"prompt": prompt, "n_predict": new_tokens, "ignore_eos": True, "temperature": 0.7,
                           "top_p": 0.9, "seed": seed, "stream": True, "cache_prompt": False}).encode()
        request = urllib.request.Request(f"{self.url}/completion", data=body,
                                         headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        first = None
        tokens = 0
        with urllib.request.urlopen(request, timeout=600) as response:
            for line in response:
                if not line.startswith(b"data: "):
                    continue
                event = json.loads(line[6:])
                if event.get("content") or event.get("tokens"):
                    tokens += max(1, len(event.get("tokens") or []))
                    first = first if first is not None else time.perf_counter() - started
                if event.get("stop"):
                    break
        return tokens, first if first is not None else float("nan")


if __name__ == "__main__":  # `python bench/llamacpp.py`: build only
    shutil.which("cmake") or sys.exit("building llama.cpp needs cmake: apt-get install cmake")
    print(build())
