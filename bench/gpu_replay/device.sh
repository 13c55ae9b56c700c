#!/usr/bin/env bash
# On a GPU machine without TensorFlow: replays the exported cases (export.py, run where TF
# is) and writes REPLAY.md, replay.json and the logs to OUT_DIR. Then, time allowing,
# replays the larger models with TF32 GEMMs (REPLAY-tf32.md), profiles, and
# runs the small call of every model again under compute-sanitizer's memcheck (an
# out-of-bounds access there fails the model), and profiles the kernels of one call of
# each model in PROFILE with Nsight Compute (each kernel's GPU time, to profile.txt), and
# the kernels named in SOL with its SpeedOfLight section.
#
#   bench/gpu_replay/device.sh CASES_DIR OUT_DIR [SECONDS]
set -uo pipefail
cd "$(dirname "$0")/../.."
cases=$1 out=$2 budget=${3:-420}
deadline=$((SECONDS + budget))
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$out/gpu.txt"
work=$(mktemp -d)
python3 -m bench.gpu_replay.check --cases "$cases" --out "$work/replay" --timeout 150 \
  >"$out/replay.log" 2>&1
status=$?
cp "$work/replay/REPLAY.md" "$work/replay/replay.json" "$out/" 2>/dev/null
tail -n 5 "$out/replay.log"
if ((deadline - SECONDS > 120)); then  # the bench models again, GEMMs on TF32 (TF's GPU default)
  models=$(python3 -c "import json,sys; m=json.load(open(sys.argv[1]+'/manifest.json'))
print(','.join(dict.fromkeys(c['model'] for c in m['cases'] if c['kernels'] > 12)))" "$cases")
  python3 -m bench.gpu_replay.check --cases "$cases" --out "$work/tf32" --tf32 --models "$models" \
    --timeout 150 >>"$out/replay.log" 2>&1
  cp "$work/tf32/REPLAY.md" "$out/REPLAY-tf32.md" 2>/dev/null
  tail -n 1 "$out/replay.log"
fi
PROFILE=${PROFILE:-"bert_base:2 fastspeech_conv:2 mobilenet_v2:2 gpt2_decoder:2"}
if command -v ncu >/dev/null; then
  for job in $PROFILE; do
    left=$((deadline - SECONDS))
    ((left > 40)) || break  # a profile took 10-15 s on the H200
    echo "== ncu: ${job%%:*} call ${job##*:}" | tee -a "$out/profile.txt"
    timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
      -c 120 python3 -m bench.gpu_replay.check --cases "$cases" --out "$work/replay" \
      --models "${job%%:*}" --calls "${job##*:}" --child "$work/replay/libreplay.so" \
      >>"$out/profile.txt" 2>&1
  done
  # SOL="model:call:regex ...": Nsight Compute's SpeedOfLight section (compute vs memory
  # throughput) for the kernels whose names match, appended to profile.txt
  for job in ${SOL:-}; do
    left=$((deadline - SECONDS))
    ((left > 40)) || break
    IFS=: read -r model call regex <<<"$job"
    echo "== ncu SpeedOfLight: $model call $call, kernels ~ $regex" | tee -a "$out/profile.txt"
    timeout 60 ncu --clock-control none --section SpeedOfLight -k "regex:$regex" -c 16 \
      python3 -m bench.gpu_replay.check --cases "$cases" --out "$work/replay" --models "$model" \
      --calls "$call" --child "$work/replay/libreplay.so" >>"$out/profile.txt" 2>&1
  done
fi
left=$((deadline - SECONDS))
if command -v compute-sanitizer >/dev/null && ((left > 60)); then
  echo "== memcheck, call 0 of each model (${left}s left)"
  timeout $((left - 20)) python3 -m bench.gpu_replay.check --cases "$cases" --out "$work/memcheck" \
    --calls 0 --timeout 90 --prefix "compute-sanitizer --tool memcheck --error-exitcode 3" \
    >"$out/memcheck.log" 2>&1
  echo "memcheck exit: $?"
  cp "$work/memcheck/REPLAY.md" "$out/MEMCHECK.md" 2>/dev/null
  grep -m 20 "Invalid\|ERROR SUMMARY: [1-9]" "$out/memcheck.log"
fi
exit $status
