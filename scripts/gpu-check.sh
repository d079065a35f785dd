#!/usr/bin/env bash
# The GPU check: everything under cuda/, the NCCL communicator, the DLPack path and
# optex.torch on CUDA tensors, built and run on a GPU machine in one call of a few
# minutes. The machine may have no network and no Eigen, GoogleTest, Google Benchmark
# or CLI11, so what it lacks is prepared here into one git-ignored folder, .gpu-kit/.
#
#   scripts/gpu-check.sh prepare          fill .gpu-kit/ (needs apt and the network);
#                                         prints its size and the paths a call must carry
#   scripts/gpu-check.sh check            the cheap part of the dry run: the kit is whole,
#                                         covers every find_package, configures alone,
#                                         and the tree with it fits in 64 MiB
#   scripts/gpu-check.sh run [--out DIR]  on the GPU machine: tiers 0-4, each time-boxed,
#                                         the whole within 8 minutes on 16 cores; a summary
#                                         table last and one archive of every log in DIR
#                                         (default: $OPTEX_GPU_CHECK_OUT, else $OUT, else
#                                         build-gpu-check/out)
#   scripts/gpu-check.sh dry-run          `run` here on a copy of the tree as the GPU
#                                         machine receives it, without network and with
#                                         the system's Eigen, GoogleTest, benchmark and
#                                         CLI11 hidden; GPU tests skip, the rest must pass
#   scripts/gpu-check.sh collect ARCHIVE [RESULTS]
#                                         unpack a run's archive into
#                                         bench/results/gpu-<model>-<date>/
#
# docs/DESIGN.md section 8 says what each tier proves.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

command="${1:-}"
[ $# -gt 0 ] && shift
case "$command" in
  prepare) exec bash "$here/gpu_check/prepare.sh" "$@" ;;
  check) exec bash "$here/gpu_check/check.sh" "$@" ;;
  run) exec bash "$here/gpu_check/run.sh" "$@" ;;
  dry-run) exec bash "$here/gpu_check/dry_run.sh" "$@" ;;
  collect) exec bash "$here/gpu_check/collect.sh" "$@" ;;
  -h | --help | help)
    usage
    exit 0
    ;;
  *)
    usage >&2
    echo "gpu-check.sh: expected one of prepare, check, run, dry-run, collect; got '${command}'" >&2
    exit 2
    ;;
esac
