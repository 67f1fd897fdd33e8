#!/usr/bin/env bash
# cpu-native's bfloat16 matmul paths on a machine that only has Python, torch and a C++ compiler: no llmp install,
# no network. Made for the device machine lent to some sessions (its host is a 16-core Intel Xeon: AMX where
# it is a Sapphire Rapids or later), where the tile path can meet real AMX instructions:
#
#   run(command="bash benchmarks/amx_device.sh", timeout_s=420)
#
# It prints the CPU, builds the compiled library in place against the torch there, says which path the library
# chose and why, runs its dense matmul tests on every path the CPU has (the amx tiles among them where they pass
# their start-up check), then benchmarks/matmul_paths.py at 2 threads (the figures' machine) and at every core.
# Each step's output goes to $OUT (or a new temporary folder) as well. Needs: torch, numpy, pluggy, tqdm, pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
python="${PYTHON:-python3}"
export PYTHONPATH="$PWD/core:$PWD/plugins/kernels/torch:$PWD/plugins/kernels/cpu:$PWD/plugins/kernels/cpu-native${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

{ date -u; lscpu; "$python" -c "import torch; print('torch', torch.__version__)"; } 2>&1 | tee "$out/machine.txt" |
    grep -E "^(Model name|Flags)|torch|UTC" | cut -c1-120
grep -o -E "amx[a-z0-9_]*|avx512_bf16" "$out/machine.txt" | sort -u | tr '\n' ' '
echo

(cd plugins/kernels/cpu-native && "$python" setup.py build_ext --inplace) > "$out/build.txt" 2>&1 ||
    { tail -30 "$out/build.txt"; exit 1; }
"$python" - <<'EOF' 2>&1 | tee "$out/path.txt"
import torch
from llmp_kernels_cpu_native.library import dense_path, load
load()
ops = torch.ops.llmp_native
print("isa:", ops.isa(), "| has amx:", ops.has_amx(), "| tile state:", ops.amx_tiles_unusable() or "granted")
print("tiles' check in a child:", ops.amx_tiles_check() or "passed")
print("bfloat16 matmuls:", dense_path())
EOF
"$python" -m pytest -q -p no:cacheprovider plugins/kernels/cpu-native/tests/test_dense_matmul.py 2>&1 |
    tee "$out/tests.txt" | tail -15
for threads in 2 "$(nproc)"; do
    timeout 150 "$python" benchmarks/matmul_paths.py --threads "$threads" --rounds 3 --json "$out/paths-$threads.json" 2>&1 |
        tee "$out/paths-$threads.txt"
done
