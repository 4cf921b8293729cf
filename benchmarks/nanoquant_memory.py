"""NanoQuant memory / time benchmark (arXiv 2602.06694): ``python benchmarks/nanoquant_memory.py [--write]``.

Measures, on CPU:

1. bytes of the quantized linear layers on disk (tensors in ``nanoquant.safetensors``) and in memory (packed buffers +
   scales; and, separately, the unpacked +-1 factor cache the plain-torch forward keeps) vs fp32, at 1.0/0.8/0.55 bpw;
2. quantization wall time per layer (``quantize_linear``, ADMM 400 iterations) and for the whole tiny model
   (``quantize_model``: ADMM only, and with block + model reconstruction at reduced epochs);
3. mat-vec latency: dense fp32 ``W x`` vs the factored forward (cached +-1 factors), unpack-then-matmul, and a
   byte-lookup-table (LUT) kernel in plain torch over the packed bits;
4. run-time memory and speed of a whole model's forward (a 4-layer Llama, hidden 1024, at 1 bpw): dense fp32, the
   cached forward and the chunked forward (``quant.forward=chunked``). Each mode runs in a fresh subprocess (glibc
   told to return freed blocks, ``MALLOC_MMAP_THRESHOLD_``); peak memory = the process's peak resident set
   (``VmHWM``, reset through ``/proc/self/clear_refs`` just before the forwards) minus its resident set before the
   model was built. Target: peak <= 2 x the model's stored size + one layer's chunk workspace.

``--write`` replaces the ``## NanoQuant`` section of ``docs/benchmarks.md`` (creating the file if needed).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import LlamaConfig, LlamaForCausalLM

from zoo.quant.nanoquant import (
    NanoQuantLinear,
    default_layer_filter,
    model_bits_per_weight,
    quantize_linear,
    quantize_model,
    rank_for_bits,
    save_quantized,
    set_forward_mode,
    unpack_signs,
)

ROOT = Path(__file__).resolve().parents[1]


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    """The demo's architecture: 2 layers, hidden 256, intermediate 512 (random init; sizes only)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=102,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg).eval()


def _timeit(fn, repeats: int = 50, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - t) / repeats)
    return best


def lut_matvec(packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``S x`` for a packed sign matrix ``S [m, n]`` (uint8 ``[m, n/8]``, LSB-first, 1 = +1) via byte lookup tables:
    ``T[g, b] = sum_j sign_j(b) x[8g + j]`` (256 entries per 8 inputs), then ``y_i = sum_g T[g, packed[i, g]]``."""
    m, nb = packed.shape
    bits = ((torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1).to(x.dtype) * 2 - 1  # [256, 8]
    table = bits @ x.view(nb, 8).T  # [256, nb]
    idx = packed.long() + 256 * torch.arange(nb).unsqueeze(0)  # flat index into table.T
    return table.T.reshape(-1)[idx].sum(1)


def memory_rows() -> list[dict]:
    rows = []
    for bits in (1.0, 0.8, 0.55):
        m = tiny_model()
        names = [n for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear) and ".layers." in n]
        fp32_bytes = sum(m.get_submodule(n).weight.numel() * 4 for n in names)
        report = quantize_model(
            m,
            bits,
            torch.randint(0, 102, (4, 64)),
            block_reconstruction=False,
            model_reconstruction=False,
            rank_multiple=8,
            admm={"outer_iters": 20},
        )
        layers = {n: mod for n, mod in m.named_modules() if isinstance(mod, NanoQuantLinear)}
        packed_mem = sum(
            mod.u_packed.nbytes + mod.v_packed.nbytes + sum(p.nbytes for p in mod.scales()) for mod in layers.values()
        )
        cache_mem = sum(mod.rank * (mod.in_features + mod.out_features) * 4 for mod in layers.values())
        with tempfile.TemporaryDirectory() as tmp:
            save_quantized(m, tmp)
            disk = 0
            with safe_open(str(Path(tmp) / "nanoquant.safetensors"), "pt") as f:
                for k in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    if k.rsplit(".", 1)[0] in layers and not k.endswith(".bias"):
                        t = f.get_tensor(k)
                        disk += t.numel() * t.element_size()
            file_bytes = (Path(tmp) / "nanoquant.safetensors").stat().st_size
        rows.append(
            {
                "bits": bits,
                "bpw": report.bits_per_weight,
                "fp32": fp32_bytes,
                "disk": disk,
                "mem": packed_mem,
                "cache": cache_mem,
                "file": file_bytes,
                "check": model_bits_per_weight(m),
            }
        )
    return rows


def timing_rows() -> dict:
    m = tiny_model()
    out: dict = {"per_layer": []}
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.down_proj"):
        lin = m.get_submodule(name)
        t = time.perf_counter()
        q = quantize_linear(lin, 1.0, rank_multiple=8)
        out["per_layer"].append((name, tuple(lin.weight.shape), q.rank, time.perf_counter() - t))
    calib = torch.randint(0, 102, (8, 128), generator=torch.Generator().manual_seed(0))
    for label, block, kd in (("ADMM only (400 it.)", False, False), ("+ block + model recon (2 ep.)", True, True)):
        mm = copy.deepcopy(m)
        t = time.perf_counter()
        quantize_model(
            mm,
            1.0,
            calib,
            block_reconstruction=block,
            model_reconstruction=kd,
            rank_multiple=8,
            block={"ep_epochs": 2, "fact_epochs": 2},
            kd_epochs=2,
        )
        out[label] = time.perf_counter() - t
    return out


def matvec_rows(sizes: tuple[int, ...] = (1024, 2048, 4096)) -> list[dict]:
    rows = []
    for d in sizes:
        torch.manual_seed(0)
        W = torch.randn(d, d)
        x = torch.randn(1, d)
        lin = torch.nn.Linear(d, d, bias=False)
        lin.weight.data = W
        r = int(d * d / (2 * d) - 16) // 32 * 32  # 1 bpw, rank_multiple 32
        q = quantize_linear(lin, 1.0, rank=r, outer_iters=2)  # timing only: factors need not be good
        q.forward(x)  # build the unpack cache
        S = unpack_signs(q.v_packed, d)  # [r, d]
        packed = q.v_packed
        ok = torch.allclose(lut_matvec(packed, x[0]), S @ x[0], atol=1e-3, rtol=1e-4)
        if not ok:
            raise AssertionError(f"LUT mat-vec disagrees with the dense +-1 product at d={d}")
        dense = _timeit(lambda W=W, x=x: x @ W.T)
        factored = _timeit(lambda q=q, x=x: q(x))
        unpack = _timeit(lambda q=q, d=d, x=x: x @ unpack_signs(q.v_packed, d).T, repeats=5)
        lut_v = _timeit(lambda p=packed, v=x[0]: lut_matvec(p, v), repeats=10)
        dense_half = _timeit(lambda S=S, x=x: x @ S.T)  # the r x d half of the factored product, dense +-1
        rows.append(
            {
                "d": d,
                "rank": r,
                "dense_ms": dense * 1e3,
                "factored_ms": factored * 1e3,
                "unpack_ms": unpack * 1e3,
                "lut_half_ms": lut_v * 1e3,
                "dense_half_ms": dense_half * 1e3,
                "lut_ok": ok,
            }
        )
    return rows


RUNTIME_MODEL = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16}
RUNTIME_TOKENS = (1, 32)  # (batch, sequence) of each forward
RUNTIME_CHUNK = 256


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _tensor_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def _runtime_model(sizes: dict) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=256, max_position_embeddings=64, tie_word_embeddings=True, **sizes)
    return LlamaForCausalLM(cfg).eval()


def _binarize(model: torch.nn.Module, mode: str) -> tuple[int, int]:
    """Replace every decoder-layer linear by a random-factor NanoQuant layer at the 1-bpw rank, in ``mode``;
    returns (bytes of the packed linears, largest chunk workspace in bytes)."""
    packed, workspace = 0, 0
    for name, lin in [(n, m) for n, m in model.named_modules() if default_layer_filter(n, m)]:
        r = rank_for_bits(lin.out_features, lin.in_features, 1.0, 32)
        layer = NanoQuantLinear.from_factors(
            torch.randn(lin.out_features, r),
            torch.randn(r, lin.in_features),
            torch.ones(lin.in_features),
            torch.ones(lin.out_features),
        )
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer)
        packed += layer.u_packed.nbytes + layer.v_packed.nbytes + sum(p.nbytes for p in layer.scales())
        workspace = max(workspace, RUNTIME_CHUNK * max(lin.in_features, r) * 4)
    set_forward_mode(model, mode, RUNTIME_CHUNK)
    return packed, workspace


def _warm_up() -> None:
    """Run every code path once on a small model, so that library code pages mapped by the first call are in the
    baseline and not charged to the measured forward."""
    small = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 4}
    with torch.no_grad():
        for mode in ("dense", "cached", "chunked"):
            model = _runtime_model(small)
            if mode != "dense":
                _binarize(model, mode)
            model(input_ids=torch.randint(0, 256, RUNTIME_TOKENS), use_cache=False)
            del model


def runtime_probe(mode: str, repeats: int = 20) -> dict:
    """One mode (``dense``, ``cached``, ``chunked``) in this process: stored bytes, peak resident growth over the
    pre-model baseline during ``repeats`` forwards, tokens/s. The quantized layers hold random +-1 factors at the
    1-bpw rank (memory and speed do not depend on the factors' quality)."""
    torch.manual_seed(0)
    _warm_up()
    gc.collect()
    base_kib = _status_kib("VmRSS")
    model = _runtime_model(RUNTIME_MODEL)
    packed_linears, workspace = _binarize(model, mode) if mode != "dense" else (0, 0)
    gc.collect()
    stored = _tensor_bytes(model)
    ids = torch.randint(0, 256, RUNTIME_TOKENS)
    before_kib = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set (VmHWM)
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)  # warm-up (and, cached mode, the unpacked factors)
        t = time.perf_counter()
        for _ in range(repeats):
            model(input_ids=ids, use_cache=False)
        seconds = time.perf_counter() - t
    peak_kib = _status_kib("VmHWM")
    return {
        "mode": mode,
        "stored": stored,
        "packed_linears": packed_linears,
        "workspace": workspace,
        "resident_before": (before_kib - base_kib) * 1024,
        "peak": (peak_kib - base_kib) * 1024,
        "tokens_per_s": repeats * ids.numel() / seconds,
    }


def runtime_rows(rounds: int = 3) -> list[dict]:
    """Every mode in its own subprocess, interleaved (dense cached chunked, ...) ``rounds`` times."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(torch.get_num_threads())}
    results: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for mode in ("dense", "cached", "chunked"):
            proc = subprocess.run(
                [sys.executable, __file__, "--probe", mode, "--threads", str(torch.get_num_threads())],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            results.setdefault(mode, []).append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return [{**runs[0], "all": runs} for runs in results.values()]


def render(mem: list[dict], tim: dict, mv: list[dict], threads: int, rt: list[dict] | None = None) -> str:
    kib = 1024
    lines = [
        "## NanoQuant",
        "",
        f"`python benchmarks/nanoquant_memory.py --write` on {platform.processor() or platform.machine()}, torch "
        f"{torch.__version__}, {threads} thread(s), a shared 2-core box (other jobs running: treat times as upper "
        "bounds). Model: the demo's 2-layer Llama (hidden 256, intermediate 512), 14 decoder-layer linears "
        f"({mem[0]['fp32'] // 4:,} weights); rank multiple 8.",
        "",
        "### Bytes of the quantized linears (decoder-layer linears only)",
        "",
        "| target | measured bpw | fp32 | on disk (packed + fp16 scales) | ratio | in memory (packed) | "
        "+ unpacked +-1 cache of the torch forward | safetensors file (whole model) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in mem:
        lines.append(
            f"| {r['bits']} | {r['bpw']:.4f} | {r['fp32'] / kib:.0f} KiB | {r['disk'] / kib:.1f} KiB | "
            f"{r['fp32'] / r['disk']:.1f}x | {r['mem'] / kib:.1f} KiB | {r['cache'] / kib:.0f} KiB | "
            f"{r['file'] / kib:.0f} KiB |"
        )
    lines += [
        "",
        "On disk and as stored buffers the quantized linears are 32/bpw times smaller than fp32 (>= 32x at <= 1 bpw; "
        "the whole file also holds the full-precision embedding/norms). The plain-torch forward of "
        '`NanoQuantLinear` with `forward_mode="cached"` keeps the unpacked +-1 factors in fp32 (`r (d_in + d_out)` '
        'floats), which at ~1 bpw is about as large as the dense fp32 weight; `forward_mode="chunked"` '
        "(`quant.forward=chunked`) unpacks a bounded chunk at a time and keeps the win at run time (next section).",
        "",
        "### Quantization wall time",
        "",
        "| layer | shape | rank @ 1 bpw | `quantize_linear` (ADMM 400 it.) |",
        "|---|---|---|---|",
    ]
    for name, shape, rank, secs in tim["per_layer"]:
        lines.append(f"| `{name}` | {shape[0]}x{shape[1]} | {rank} | {secs:.2f} s |")
    lines += [
        "",
        "Whole tiny model at 1 bpw, 8 x 128 calibration tokens: "
        + "; ".join(f"{k}: {v:.1f} s" for k, v in tim.items() if k != "per_layer")
        + ".",
        "",
        "### Mat-vec (batch 1) on CPU",
        "",
        "| d | rank @ 1 bpw | dense fp32 `W x` | factored fwd (cached +-1, two matvecs) | unpack + matmul (one "
        "factor) | LUT over packed bits (one factor) | dense +-1 matmul (one factor) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in mv:
        lines.append(
            f"| {r['d']} | {r['rank']} | {r['dense_ms']:.3f} ms | {r['factored_ms']:.3f} ms | "
            f"{r['unpack_ms']:.2f} ms | {r['lut_half_ms']:.2f} ms | {r['dense_half_ms']:.3f} ms |"
        )
    lines += [
        "",
        "Reading: at 1 bpw the factored product costs r (d_in + d_out) ~ d^2 multiply-adds, the same as dense, so "
        "with fp32 +-1 matrices it is no faster; unpacking bits on every call is much slower, and the plain-torch "
        "LUT kernel (correct: checked against the dense +-1 product) pays for its gather and is slower than the "
        "BLAS matvec too. On CPU without SIMD kernels (T-MAC-style) the win is memory, not speed.",
        "",
    ]
    if rt:
        lines += render_runtime(rt)
    return "\n".join(lines)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def render_runtime(rt: list[dict]) -> list[str]:
    mib = 1024 * 1024
    by = {r["mode"]: r for r in rt}
    quant = by["chunked"]
    lines = [
        "### Run-time memory and speed of the forward (whole model)",
        "",
        f"A Llama with {RUNTIME_MODEL['num_hidden_layers']} layers, hidden {RUNTIME_MODEL['hidden_size']}, "
        f"intermediate {RUNTIME_MODEL['intermediate_size']}, vocabulary 256; every decoder-layer linear at the "
        f"1-bpw rank (rank multiple 32; random factors). Forwards of {RUNTIME_TOKENS[0]} x {RUNTIME_TOKENS[1]} tokens, "
        f"no KV cache; chunk {RUNTIME_CHUNK} rows. Each mode ran {len(quant['all'])} times in fresh subprocesses, "
        "interleaved with the others (median, [min, max]). Peak = peak resident set during the forwards minus the "
        "process's resident set before the model was built (includes activations and allocator slack).",
        "",
        "| forward | stored model size | peak memory | peak / stored | tokens/s | tokens/s vs dense |",
        "|---|---|---|---|---|---|",
    ]
    dense_tps = _median([r["tokens_per_s"] for r in by["dense"]["all"]])
    for mode, label in (
        ("dense", "dense fp32"),
        ("cached", "NanoQuant, cached +-1"),
        ("chunked", "NanoQuant, chunked"),
    ):
        runs = by[mode]["all"]
        peaks = [r["peak"] / mib for r in runs]
        tps = [r["tokens_per_s"] for r in runs]
        stored = runs[0]["stored"] / mib
        lines.append(
            f"| {label} | {stored:.1f} MiB | {_median(peaks):.1f} MiB [{min(peaks):.1f}, {max(peaks):.1f}] | "
            f"{_median(peaks) / stored:.2f} | {_median(tps):.0f} [{min(tps):.0f}, {max(tps):.0f}] | "
            f"{_median(tps) / dense_tps:.2f} |"
        )
    bound = 2 * quant["stored"] + quant["workspace"]
    peak = max(r["peak"] for r in quant["all"])
    verdict = "met" if peak <= bound else "NOT met"
    lines += [
        "",
        f"Target for the chunked forward: peak <= 2 x stored size ({quant['stored'] / mib:.1f} MiB, of which "
        f"{quant['packed_linears'] / mib:.1f} MiB packed linears) + one layer's chunk workspace "
        f"({quant['workspace'] / mib:.1f} MiB) = {bound / mib:.1f} MiB; largest measured peak {peak / mib:.1f} MiB: "
        f"**{verdict}**. The cached forward's peak grows by the unpacked fp32 factors, about the dense model's size.",
        "",
    ]
    return lines


def write_section(text: str, path: Path = ROOT / "docs" / "benchmarks.md") -> None:
    """Replace (or append) the ``## NanoQuant`` section, leaving the rest of the file untouched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.is_file() else "# Benchmarks\n\nSide-by-side performance numbers of the zoo.\n"
    pattern = re.compile(r"^## NanoQuant\n.*?(?=^## |\Z)", re.S | re.M)
    new = pattern.sub(lambda _: text + "\n", old) if pattern.search(old) else old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new)


OLD_CACHE_NOTE = re.compile(
    r"The plain-torch forward of\s+`NanoQuantLinear` caches.*?not this reference forward\.", re.S
)
NEW_CACHE_NOTE = (
    'The plain-torch forward of `NanoQuantLinear` with `forward_mode="cached"` keeps the unpacked +-1 factors in fp32 '
    '(`r (d_in + d_out)` floats), about as large as the dense fp32 weight at ~1 bpw; `forward_mode="chunked"` '
    "(`quant.forward=chunked`) unpacks a bounded chunk at a time and keeps the win at run time (next subsection)."
)


def write_runtime_subsection(text: str, path: Path = ROOT / "docs" / "benchmarks.md") -> None:
    """Replace (or add at the end of the ``## NanoQuant`` section) only the run-time subsection, and bring the
    section's note on the cached forward up to date; the other NanoQuant measurements are left as they are."""
    old = path.read_text()
    section = re.search(r"^## NanoQuant\n.*?(?=^## |\Z)", old, re.S | re.M)
    if section is None:
        write_section(text)
        return
    body = OLD_CACHE_NOTE.sub(NEW_CACHE_NOTE, section.group(0))
    sub = re.compile(r"^### Run-time memory and speed.*?(?=^### |^## |\Z)", re.S | re.M)
    body = sub.sub(lambda _: text + "\n", body) if sub.search(body) else body.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(old[: section.start()] + body + old[section.end() :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--probe", choices=("dense", "cached", "chunked"), help=argparse.SUPPRESS)
    parser.add_argument("--runtime-only", action="store_true", help="only the run-time memory/speed section")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.probe:
        print(json.dumps(runtime_probe(args.probe)))
        return
    if args.runtime_only:
        text = "\n".join(render_runtime(runtime_rows()))
        print(text)
        if args.write:
            write_runtime_subsection(text)
        return
    mem = memory_rows()
    tim = timing_rows()
    mv = matvec_rows()
    rt = runtime_rows()
    text = render(mem, tim, mv, args.threads, rt)
    print(text)
    if args.write:
        write_section(text)


if __name__ == "__main__":
    main()
