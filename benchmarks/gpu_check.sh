#!/usr/bin/env bash
# The GPU check: pytest -m gpu (tests/gpu/test_gpu.py) and benchmarks/grpo_vs_trl.py on the device, figures written
# into the "GPU check" section of docs/benchmarks.md. Run from the repository root on a machine with CUDA:
#   bash benchmarks/gpu_check.sh [steps=8] [repeats=3]
# Exit status: pytest's (the section is written in any case, with the failures listed).
set -u
cd "$(dirname "$0")/.."
STEPS="${1:-8}"
REPEATS="${2:-3}"
OUT="$(mktemp -d)"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device here; nothing run (docs/benchmarks.md keeps its 'not run yet' line)" >&2
    exit 3
fi

start=$(date +%s)
python -m pytest -m gpu tests/gpu -q -rA -p no:cacheprovider --junitxml "$OUT/gpu.xml" 2>&1 | tee "$OUT/pytest.txt"
status=${PIPESTATUS[0]}
pytest_seconds=$(( $(date +%s) - start ))

python benchmarks/grpo_vs_trl.py --device cuda --steps "$STEPS" --repeats "$REPEATS" --threads 4 \
    --json "$OUT/grpo_vs_trl.json" --no-write > "$OUT/grpo_vs_trl.md" 2> "$OUT/grpo_vs_trl.err" \
    || echo "grpo_vs_trl.py failed: $(tail -n 3 "$OUT/grpo_vs_trl.err")" > "$OUT/grpo_vs_trl.md"

python - "$OUT" "$status" "$pytest_seconds" <<'PY'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

sys.path.insert(0, "benchmarks")
from _results import write_section  # noqa: E402

out, status, seconds = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rows = []
for case in ET.parse(out / "gpu.xml").iter("testcase"):
    outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else (
        "skipped" if case.find("skipped") is not None else "passed")
    rows.append(f"| `{case.get('name')}` | {outcome} | {float(case.get('time', 0)):.1f} |")
devices = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
body = "\n".join([
    f"`bash benchmarks/gpu_check.sh` on {devices} (CUDA {torch.version.cuda}); pytest exit status {status}, "
    f"{seconds} s in all.",
    "",
    "| `pytest -m gpu` test | outcome | seconds |",
    "|---|---|---|",
    *rows,
    "",
    "`benchmarks/grpo_vs_trl.py --device cuda`:",
    "",
    (out / "grpo_vs_trl.md").read_text().strip(),
])
write_section("GPU check", body)
print(body)
PY
exit "$status"
