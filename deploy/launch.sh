#!/usr/bin/env bash
# Start `morio serve` on the plan's shard CPUs, its memory on the plan's NUMA node.
#
# usage: launch.sh --config FILE [--print | --unit] [options] [plan options] [-- MORIO-ARGS...]
#
# Runs (exec, so morio keeps this PID for systemd and signals):
#   [numactl --cpunodebind=NODE --membind=NODE] taskset -c SHARD_CPUS \
#       MORIO serve --config FILE --cpus CPU,CPU,... [MORIO-ARGS...]
# where SHARD_CPUS is the plan's "shard_cpus", --cpus lists the plan's "shards" (one CPU per
# shard, in shard order) and NODE is the plan's "node". The command is printed on stderr
# before it runs.
#
#   --config FILE       morio serve's TOML configuration (required)
#   --print             print the command on stdout and exit; nothing runs
#   --unit              print morio.service filled in from the plan and exit (install it as
#                       /etc/systemd/system/morio.service, then systemctl daemon-reload)
#   --template FILE     the unit template for --unit (default: morio.service beside this script)
#   --user NAME         the service user written into the unit (default: morio)
#   --numactl WHEN      auto (default: when numactl is installed and the plan has a node),
#                       always, or never
#   --plan-json FILE    use this `morio topology --json` output instead of running it
#   --morio PATH        morio binary (default: $MORIO, then morio on PATH)
#   --nic NAME, --gpu BUSID, --shards N, --irq-cpus N, --allowed LIST,
#   --sysfs-root DIR, --proc-root DIR
#                       passed to `morio topology` (ignored with --plan-json, except --nic,
#                       which only names the NIC for the unit's tune.sh line)
#   -h, --help          this text
set -euo pipefail

PROG=launch.sh
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

CONFIG=""
MODE=run
NUMACTL=auto
SVC_USER=morio
TEMPLATE=$HERE/morio.service
EXTRA=()

while (($#)); do
	if [[ $1 == --*=* ]]; then
		set -- "${1%%=*}" "${1#*=}" "${@:2}"
	fi
	case $1 in
	-h | --help)
		print_usage "$0"
		exit 0
		;;
	--config)
		need_value "$@"
		CONFIG=$2
		shift 2
		;;
	--print)
		MODE=print
		shift
		;;
	--unit)
		MODE=unit
		shift
		;;
	--template)
		need_value "$@"
		TEMPLATE=$2
		shift 2
		;;
	--user)
		need_value "$@"
		SVC_USER=$2
		shift 2
		;;
	--numactl)
		need_value "$@"
		case $2 in
		auto | always | never) NUMACTL=$2 ;;
		*) usage_error "--numactl wants auto, always or never, not '$2'" ;;
		esac
		shift 2
		;;
	--)
		shift
		EXTRA=("$@")
		break
		;;
	*)
		if is_plan_opt "$1"; then
			need_value "$@"
			set_plan_opt "$1" "$2"
			shift 2
		else
			usage_error "unknown option '$1'"
		fi
		;;
	esac
done

[[ -n $CONFIG ]] || usage_error "--config FILE is required"

load_plan

SHARD_CPUS=$PLAN_SHARD_CPUS
[[ -n $SHARD_CPUS ]] || die "the plan ($PLAN_SOURCE) has no shard_cpus"
CPUS_ARG=${PLAN_SHARDS// /,}
NODE=$PLAN_NODE
NIC=${OPT_NIC:-$PLAN_NIC}
# Shards outside the plan's node still run there; their memory is bound to the node anyway.
[[ -z $PLAN_OFF_NODE ]] || echo "$PROG: note: shard cpus $PLAN_OFF_NODE are outside node $NODE (cpus $PLAN_NODE_CPUS)" >&2

if ! MORIO_BIN=$(find_morio); then
	[[ $MODE == run ]] && die "morio not found: pass --morio PATH, set MORIO or put morio on PATH"
	MORIO_BIN=morio
fi

if [[ $MODE == unit ]]; then
	[[ -r $TEMPLATE ]] || die "cannot read unit template $TEMPLATE"
	[[ $CONFIG == /* ]] || CONFIG=$(pwd)/$CONFIG
	[[ $MORIO_BIN == /* ]] || die "the unit needs an absolute morio path, not '$MORIO_BIN' (--morio PATH)"
	[[ $SVC_USER =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] || die "bad --user '$SVC_USER'"
	# tune.sh in ExecStartPre plans from the same inputs as this unit.
	TUNE=(--user "$SVC_USER")
	[[ -z $NIC ]] || TUNE+=(--nic "$NIC")
	if [[ -n $PLAN_JSON ]]; then
		[[ $PLAN_JSON == /* ]] || PLAN_JSON=$(pwd)/$PLAN_JSON
		TUNE+=(--plan-json "$PLAN_JSON")
	fi
	[[ -z $OPT_GPU || -n $PLAN_JSON ]] || TUNE+=(--gpu "$OPT_GPU")
	[[ -z $OPT_SHARDS || -n $PLAN_JSON ]] || TUNE+=(--shards "$OPT_SHARDS")
	[[ -z $OPT_IRQ_CPUS || -n $PLAN_JSON ]] || TUNE+=(--irq-cpus "$OPT_IRQ_CPUS")
	[[ -z $OPT_ALLOWED || -n $PLAN_JSON ]] || TUNE+=(--allowed "$OPT_ALLOWED")
	pyh render "$TEMPLATE" "MORIO=$MORIO_BIN" "CONFIG=$CONFIG" "SHARD_CPUS=${SHARD_CPUS//,/ }" \
		"CPUS=$CPUS_ARG" "NODE=$NODE" "NUMA_POLICY=${NODE:+bind}" "USER=$SVC_USER" \
		"DEPLOY_DIR=$HERE" "TUNE_ARGS=$(shell_join "${TUNE[@]}")"
	exit 0
fi

CMD=()
case $NUMACTL in
always) [[ -n $NODE ]] || die "--numactl always, but the plan has no NUMA node" ;;
never) ;;
auto) command -v numactl >/dev/null 2>&1 && [[ -n $NODE ]] || NUMACTL=never ;;
esac
[[ $NUMACTL == never ]] || CMD+=(numactl "--cpunodebind=$NODE" "--membind=$NODE")
CMD+=(taskset -c "$SHARD_CPUS" "$MORIO_BIN" serve --config "$CONFIG" --cpus "$CPUS_ARG" ${EXTRA[@]+"${EXTRA[@]}"})

if [[ $MODE == print ]]; then
	shell_join "${CMD[@]}"
	exit 0
fi

[[ -r $CONFIG ]] || die "cannot read --config $CONFIG"
command -v taskset >/dev/null 2>&1 || die "taskset not found (util-linux)"
[[ $NUMACTL == never ]] || command -v numactl >/dev/null 2>&1 || die "numactl not found (--numactl never runs without it)"
echo "$PROG: exec $(shell_join "${CMD[@]}")" >&2
exec "${CMD[@]}"
