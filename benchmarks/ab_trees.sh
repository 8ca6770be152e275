#!/usr/bin/env bash
# A/B of two trees on one lent GPU (machines differ by more than most changes, so a change is
# only measured against its base in the same call): a base commit's package, carried as .ab/base,
# and the working tree, their runs interleaved.
#   here:        bash benchmarks/ab_trees.sh prepare <commit>   (writes .ab/base; add ".ab/" to
#                .git/info/exclude once, and carry ".ab" with ".whl")
#   on the GPU:  bash benchmarks/ab_trees.sh run [rounds] -- <seq2serve cli arguments>
#                e.g. run 2 -- bench offline --shape opus-mt --num-requests 8192 --num-beams 4 ...
#                Each round runs the base, then the working tree; `--json` is added per run
#                ($OUT/ab_<tree>_<round>.json) and each run's "tok/s" lines are printed.
#                `SCRIPT=benchmarks/x.py` runs that script of each tree instead of the cli;
#                `SCRIPT=benchmarks/x.sh` (e.g. serving_vs_offline.sh: a server of each tree in
#                turn) runs it with bash from each tree, its $OUT at $out/<tree>_<round>.
#                `ORDER="new base"` runs the working tree first (a check that the order of the
#                runs on one machine does not decide the comparison).
cd "$(dirname "$0")/.." || exit 1
case $1 in
prepare)
    rm -rf .ab/base && mkdir -p .ab/base
    git archive "${2:?a commit}" | tar -x -C .ab/base
    # (what no run imports; the tokenizers come from the working tree on the machine)
    rm -rf .ab/base/docs .ab/base/notebooks .ab/base/tests .ab/base/models/assets
    du -sh .ab/base ;;
run)
    rounds=${2:-2}; shift 2; [ "$1" = "--" ] && shift
    source benchmarks/gpu_setup.sh >/dev/null 2>&1
    ln -sfn "$PWD/models/assets" .ab/base/models/assets
    [ -e .ab/base/.whl ] || ln -s "$PWD/.whl" .ab/base/.whl
    mkdir -p /tmp/pkg_base && ln -sfn "$PWD/.ab/base" /tmp/pkg_base/seq2serve
    out=${OUT:-/tmp/ab}; mkdir -p "$out"
    nvidia-smi --query-gpu=name --format=csv,noheader
    for i in $(seq "$rounds"); do
        for tree in ${ORDER:-base new}; do
            path=/tmp/pkg:/tmp/site; root=.
            [ $tree = base ] && path=/tmp/pkg_base:/tmp/site && root=.ab/base
            echo "== $tree $i"
            if [ -n "${SCRIPT%.sh}" ] && [ "$SCRIPT" != "${SCRIPT%.sh}" ]; then
                # (a shell script sources gpu_setup.sh from its tree: the package and the
                # wheels are that tree's; its files go to $out/<tree>_<round>/)
                mkdir -p "$out/${tree}_$i"
                OUT="$out/${tree}_$i" bash "$root/$SCRIPT" "$@" > "$out/ab_${tree}_$i.txt" 2>&1
                tail -25 "$out/ab_${tree}_$i.txt"
            elif [ -n "$SCRIPT" ]; then
                PYTHONPATH=$path python3 "$root/$SCRIPT" "$@" > "$out/ab_${tree}_$i.txt" 2>&1
                tail -25 "$out/ab_${tree}_$i.txt"
            else
                PYTHONPATH=$path python3 -m seq2serve.runtime.cli "$@" \
                    --json "$out/ab_${tree}_$i.json" 2>&1 | grep "tok/s"
            fi
        done
    done ;;
*)
    sed -n 2,12p "$0"; exit 2 ;;
esac
