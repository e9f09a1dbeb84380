#!/usr/bin/env bash
# Is the ring-attention kernel power-limited? The same kernel and shape on constant and on random data:
#   1. the SM clock and board power while 300 launches run back to back (nvidia-smi every 50 ms, loaded samples);
#   2. the duration of one launch at the clocks Nsight Compute locks (base), and its SM throughput.
# Equal durations at locked clocks but different speeds free-running mean the data's power costs clock. Then the
# same log for torch SDPA's flash backend on random data (the bench's baseline), 300 calls.
#   usage: tools/diag/ring_attention_power.sh RING_CHECK [S] [causal 0|1]
#   (RING_CHECK: tools/diag/ring_attention_check.cu built as its header says)
set -u
bin=$1 s=${2:-32768} causal=${3:-1} out=${OUT:-/tmp}

# log_power NAME COMMAND...: run COMMAND while nvidia-smi samples; print the loaded samples' clock and power
log_power() {
  local log="$out/smi_${s}_${causal}_$1.csv"
  shift
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 50 > "$log" &
  local smi=$!
  sleep 1
  "$@"
  kill "$smi"; wait "$smi" 2>/dev/null
  python3 - "$log" <<'PY'
import statistics, sys
rows = []
for line in open(sys.argv[1]):
    try:
        clock, power, temp = (float(x) for x in line.split(","))
    except ValueError:
        continue
    rows.append((clock, power, temp))
loaded = [r for r in rows if r[1] > 250]  # samples taken while the kernel ran
if loaded:
    print(f"  {len(loaded)} loaded samples: SM clock median {statistics.median(r[0] for r in loaded):.0f} MHz "
          f"(min {min(r[0] for r in loaded):.0f}), power median {statistics.median(r[1] for r in loaded):.0f} W "
          f"(max {max(r[1] for r in loaded):.0f}), temperature max {max(r[2] for r in loaded):.0f} C")
else:
    print("  no loaded samples")
PY
}

for data in const random; do
  log_power "$data" "$bin" --one "$s" "$causal" "$data" 300
  ncu --section SpeedOfLight -k regex:ring_attention "$bin" --one "$s" "$causal" "$data" 1 2>&1 \
    | grep -E "SM Frequency|Duration|Compute \(SM\) Throughput" | sed "s/^/  ncu $data: /"
done
log_power sdpa python3 -c "
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
q, k, v = ((torch.rand(1, 16, $s, 128, device='cuda') * 4 - 2).to(torch.bfloat16) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    F.scaled_dot_product_attention(q, k, v, is_causal=bool($causal)); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(300): F.scaled_dot_product_attention(q, k, v, is_causal=bool($causal))
    b.record(); b.synchronize()
t = a.elapsed_time(b) / 300
print(f'sdpa flash S=$s causal=$causal data=random launches=300: {t:.3f} ms a launch, '
      f'{4.0 * $s * $s * 128 * 16 * (0.5 if $causal else 1.0) / t / 1e9:.0f} TFLOP/s')
"
