#!/usr/bin/env bash
# florence-2-large's front end on a lent GPU machine. Each step's output goes to $OUT as it is
# measured (a call cut short keeps what it had); each mode fits one device call.
#   bash benchmarks/florence_frontend.sh fic       the image cost on threads (torch's default
#                                                  threads, then one), on a bare process pool
#                                                  and on the engine's media workers (~4 min)
#   bash benchmarks/florence_frontend.sh parts [N] the engine sent in parts with its media
#                                                  threads, then with N media workers (default
#                                                  8), JPEG images as a client uploads them
#                                                  (~8 min on a fresh machine: the first run
#                                                  compiles the tower)
cd "$(dirname "$0")/.." || exit 1
source benchmarks/gpu_setup.sh >/dev/null 2>&1
out=${OUT:-/tmp/florence_frontend}; mkdir -p "$out"
{ nvidia-smi --query-gpu=name --format=csv,noheader; nproc; } > "$out/machine.txt" 2>&1
case $1 in
fic)
    timeout 150 python3 benchmarks/frontend_image_cost.py --threads 1,4,8,16 --images 96 \
        --media-workers 4,8,16 > "$out/fic_default_threads.txt" 2>&1
    timeout 90 python3 benchmarks/frontend_image_cost.py --threads 1,8 --torch-threads 1 \
        --images 96 --processes 8,16 > "$out/fic_one_torch_thread.txt" 2>&1
    tail -n 8 "$out"/fic_*.txt ;;
parts)
    for n in 0 "${2:-8}"; do
        timeout 270 python3 benchmarks/florence_parts.py --rounds 1 --parts 16 --jpeg \
            --media-processes "$n" > "$out/parts_media_processes_$n.txt" 2>&1
    done
    tail -n 4 "$out"/parts_*.txt ;;
*)
    sed -n 2,11p "$0"; exit 2 ;;
esac
