"""NanoQuant demo (arXiv 2602.06694): held-out perplexity vs *measured* bits per weight on a tiny trained LM.

``python -m zoo.demos.nanoquant [--out docs/results] [--steps 800] [--threads 2]``

1. Train a 2-layer Llama (hidden 256, intermediate 512, char vocabulary) on the synthetic 2-digit addition task
   (``zoo.data.tasks.Addition``, step-by-step reasoning text) until held-out perplexity is far below the vocabulary
   size.
2. Quantize copies of it with every arm of the paper's comparison: full precision, bitsandbytes NF4 and int8 (CPU),
   sign + row scale, OneBit SVID, NanoQuant ADMM-only, + block reconstruction, + model reconstruction, the NanoQuant
   arms at 1.0, 0.8 and 0.55 bpw targets.
3. Report held-out perplexity (all tokens of 256 held-out rows) and greedy exact match (64 held-out prompts) against
   the measured bpw of the quantized layers (every linear inside the decoder layers; embeddings, norms and the tied
   ``lm_head`` stay full precision in every arm and are not counted), write a table and a Pareto plot.

Calibration: 8 x 128 tokens of the task's *training* rows (paper: 128 x 2048 WikiText-2). The demo shows the
mechanism and direction of effect at toy scale; it does not reproduce the paper's numbers.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from zoo.backbones.tokenizer import build_char_tokenizer
from zoo.data.sources import TaskSource
from zoo.data.tasks import Addition
from zoo.generation.sampling import SamplingParams, generate_text
from zoo.quant.baselines import quantize_onebit, quantize_sign
from zoo.quant.nanoquant import model_bits_per_weight, quantize_model, replace_linears
from zoo.quant.nanoquant_quantizer import calibration_ids

TARGETS = (1.0, 0.8, 0.55)
SEED = 0


def _say(msg: str) -> None:
    print(msg, flush=True)


def encode_rows(tok: Any, rows: list[dict[str, Any]], max_len: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """``<bos> prompt completion <eos>`` right-padded to ``[N, T]`` plus the loss mask (all real tokens)."""
    seqs = [
        [tok.bos_token_id, *tok(r["prompt"] + r["completion"], add_special_tokens=False)["input_ids"]] for r in rows
    ]
    seqs = [s[: max_len - 1] + [tok.eos_token_id] for s in seqs]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = True
    return ids, mask


@torch.no_grad()
def perplexity(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, batch: int = 64) -> float:
    """Token-level perplexity of next-token prediction over the real tokens after ``<bos>``."""
    model.eval()
    nll, count = 0.0, 0
    for s in range(0, ids.shape[0], batch):
        x, m = ids[s : s + batch], mask[s : s + batch]
        logits = model(input_ids=x, attention_mask=m.long()).logits[:, :-1].float()
        tgt = x[:, 1:].masked_fill(~m[:, 1:], -100)
        nll += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="sum"))
        count += int(m[:, 1:].sum())
    return math.exp(nll / count)


def exact_match(model: torch.nn.Module, tok: Any, rows: list[dict[str, Any]], task: Addition) -> float:
    """Greedy generation accuracy on held-out prompts (the task's exact verifier)."""
    res = generate_text(model, tok, [r["prompt"] for r in rows], SamplingParams(max_new_tokens=40, do_sample=False))
    return sum(task.verify(t, r["answer"]) for t, r in zip(res.texts, rows)) / len(rows)


def train(tok: Any, train_rows: list[dict[str, Any]], val: tuple[torch.Tensor, torch.Tensor], steps: int) -> Any:
    """Train the tiny LM from scratch (AdamW 3e-3, warmup + cosine, batch 32)."""
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(cfg)
    ids, mask = encode_rows(tok, train_rows)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 30) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    gen = torch.Generator().manual_seed(SEED)
    model.train()
    for step in range(steps):
        idx = torch.randint(0, ids.shape[0], (32,), generator=gen)
        x, m = ids[idx], mask[idx]
        out = model(input_ids=x, attention_mask=m.long(), labels=x.masked_fill(~m, -100))
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % 100 == 0:
            _say(f"  step {step + 1}: train loss {out.loss.item():.3f}, held-out ppl {perplexity(model, *val):.3f}")
            model.train()
    return model.eval()


def bnb_arm(model: torch.nn.Module, tok: Any, mode: str) -> torch.nn.Module:
    """Reload the trained model through ``from_pretrained`` with the zoo's ``BnbQuantizer`` (the same path as
    ``quant=bnb_nf4``/``bnb_int8``)."""
    from zoo.quant.bnb import BnbQuantizer

    q = BnbQuantizer(mode)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        return q.apply(AutoModelForCausalLM.from_pretrained(tmp, **q.from_pretrained_kwargs())).eval()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/results", help="directory of nanoquant.md / nanoquant.png / json")
    parser.add_argument("--steps", type=int, default=800, help="training steps of the tiny LM")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy 2-core box)")
    parser.add_argument("--calib", type=int, default=8, help="calibration sequences of 128 tokens")
    parser.add_argument("--admm-iters", type=int, default=100, help="ADMM outer iterations (paper/code 400)")
    parser.add_argument("--epochs", type=int, default=2, help="block-reconstruction epochs per stage (code 8)")
    parser.add_argument("--kd-epochs", type=int, default=4, help="scales-only KD epochs (code 8)")
    parser.add_argument("--kd-lr", type=float, default=1e-4, help="KD lr (paper 1e-6, code 1e-5; see the page)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # one "inputs will be cast" line per int8 matmul
    warnings.filterwarnings("ignore", message=".*rank_multiple.*")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    tok = build_char_tokenizer()
    task = Addition(digits=2)
    source = TaskSource(task, num_train=8000, num_val=256, num_test=64, seed=SEED)
    val = encode_rows(tok, source.rows("val"))
    em_rows = source.rows("test")
    _say(f"training the tiny LM (vocabulary {len(tok)}) ...")
    fp = train(tok, source.rows("train"), val, args.steps)
    train_s = time.time() - t0
    calib = calibration_ids(tok, task=task, num_samples=args.calib, seq_len=128, seed=SEED)

    rows: list[dict[str, Any]] = []

    def record(arm: str, target: float | None, model: torch.nn.Module, bpw: float, secs: float, **extra: Any) -> None:
        row = {
            "arm": arm,
            "target": target,
            "bpw": bpw,
            "ppl": perplexity(model, *val),
            "exact_match": exact_match(model, tok, em_rows, task),
            "seconds": secs,
            **extra,
        }
        rows.append(row)
        _say(
            f"  {arm:<28} target={target if target is not None else '-':<5} bpw={bpw:7.4f} "
            f"ppl={row['ppl']:8.3f} EM={row['exact_match']:.3f} ({secs:.1f}s)"
        )

    _say("arms:")
    record("full precision (fp32)", None, fp, 32.0, 0.0)
    from zoo.quant.bnb import bnb_bits_per_weight

    for mode, label in (("nf4", "bnb NF4 (double quant)"), ("int8", "bnb int8 (LLM.int8)")):
        t = time.time()
        m = bnb_arm(fp, tok, mode)
        record(label, None, m, bnb_bits_per_weight(m), time.time() - t)
    for label, fn in (("sign + row scale", quantize_sign), ("OneBit SVID", quantize_onebit)):
        t = time.time()
        m = copy.deepcopy(fp)
        replace_linears(m, fn, None)
        record(label, None, m, model_bits_per_weight(m), time.time() - t)
    common = {
        "rank_multiple": 8,
        "shrinkage": 0.2,
        "admm": {"outer_iters": args.admm_iters},
        "block": {"ep_epochs": args.epochs, "fact_epochs": args.epochs, "fact_batch_size": 1},
        "kd_epochs": args.kd_epochs,
        "kd_lr": args.kd_lr,
        "seed": SEED,
    }
    for target in TARGETS:
        for arm, block, kd in (
            ("NanoQuant ADMM only", False, False),
            ("NanoQuant + block recon", True, False),
            ("NanoQuant + model recon", True, True),
        ):
            t = time.time()
            m = copy.deepcopy(fp)
            rep = quantize_model(m, target, calib, block_reconstruction=block, model_reconstruction=kd, **common)
            extra = {"kl_before": rep.kl_before_distill, "kl_after": rep.kl_after_distill}
            extra["reverted_blocks"] = sum(b.reverted for b in rep.blocks)
            record(arm, target, m, rep.bits_per_weight, time.time() - t, **extra)

    result = {
        "seed": SEED,
        "task": task.describe(),
        "model": {"hidden": 256, "intermediate": 512, "layers": 2, "heads": 4, "vocab": len(tok)},
        "train_steps": args.steps,
        "train_seconds": train_s,
        "calibration": list(calib.shape),
        "nanoquant_knobs": common,
        "threads": args.threads,
        "rows": rows,
        "total_seconds": time.time() - t0,
    }
    (out / "nanoquant.json").write_text(json.dumps(result, indent=2))
    plot(rows, out / "nanoquant.png")
    _say(f"done in {result['total_seconds']:.0f}s; wrote {out / 'nanoquant.json'} and {out / 'nanoquant.png'}")
    return result


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Pareto plot: held-out perplexity (log) vs measured bpw (log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = {"NanoQuant ADMM only": "s", "NanoQuant + block recon": "^", "NanoQuant + model recon": "o"}
    for arm in markers:
        pts = sorted((r["bpw"], r["ppl"]) for r in rows if r["arm"] == arm)
        ax.plot(*zip(*pts), marker=markers[arm], label=arm)
    for r in rows:
        if r["arm"] not in markers:
            ax.scatter(r["bpw"], r["ppl"], marker="x", s=50)
            ax.annotate(r["arm"], (r["bpw"], r["ppl"]), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("measured bits per weight (decoder-layer linears)")
    ax.set_ylabel("held-out perplexity")
    ax.set_title("NanoQuant demo: tiny Llama on 2-digit addition (seed 0)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
