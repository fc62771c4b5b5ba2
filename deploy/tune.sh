#!/usr/bin/env bash
# Tune a transfer node for morio: socket buffer sysctls, memlock for the service user, the
# NIC's IRQs onto the plan's IRQ CPUs (away from shard cores), RPS and XPS for its queues.
#
# usage: tune.sh [--apply] [--check] [--nic NAME] [--user NAME] [plan options]
#
# Without --apply nothing is changed: every change is printed first, one line each:
#   would set PATH: CURRENT -> NEW     (dry run; --apply makes it "set PATH: CURRENT -> NEW")
#   ok PATH already VALUE              (nothing to do)
#   skip PATH: WHY                     (not present here; left alone)
#   failed PATH: CURRENT -> NEW (WHY)  (--apply could not write it; exit status 1)
# Lines starting with '#' are context (the plan used, warnings, a summary).
#
#   --apply             make the changes (root; /proc/sys, /proc/irq and sysfs are not
#                       persistent: run again after every boot, e.g. from morio.service)
#   --check             exit 1 when anything would change (for monitoring)
#   --nic NAME          the NIC morio serves on (default: the plan's "nic")
#   --user NAME         service user of the memlock line (default: morio)
#   --etc-dir DIR       where security/limits.d lives (default: /etc)
#   --sysfs-root DIR    sysfs to read and change (default: /sys)
#   --proc-root DIR     procfs to read and change (default: /proc)
#   --plan-json FILE    use this `morio topology --json` output instead of running it
#   --morio PATH        morio binary (default: $MORIO, then morio on PATH)
#   --gpu BUSID, --shards N, --irq-cpus N, --allowed LIST
#                       passed to `morio topology` (ignored with --plan-json)
#   -h, --help          this text
#
# What it changes and why:
#   net.core.rmem_max, net.core.wmem_max   >= 64 MiB: the ceiling of SO_RCVBUF/SO_SNDBUF;
#       morio asks for 32 MiB per lane, which the kernel silently cuts to these maxima.
#   net.ipv4.tcp_rmem, tcp_wmem (max)      >= 64 MiB: the autotuning ceiling, so a lane can
#       keep a 100-400 Gb/s path full (bandwidth x RTT). Min and default are kept.
#   net.core.netdev_max_backlog            >= 250000: the per-CPU input queue that RPS fills
#       on the IRQ CPUs; the default 1000 drops packets in bursts at 100 Gb/s.
#   net.ipv4.tcp_mtu_probing               >= 1: find a working MSS when a jumbo-frame path
#       black-holes ICMP, instead of stalling the lane.
#   net.ipv4.tcp_slow_start_after_idle     = 0: morio keeps lanes open between transfers;
#       without this every burst after an idle gap starts from a small window again.
#   limits.d memlock                       unlimited for the service user: io_uring rings and
#       registered memory are locked (systemd ignores limits.d: morio.service has
#       LimitMEMLOCK=infinity; this line is for launch.sh from a login shell).
#   /proc/irq/N/smp_affinity_list          the NIC's IRQs onto the plan's irq_cpus, so
#       interrupts and softirq work never preempt a shard.
#   queues/rx-*/rps_cpus                   the irq_cpus: receive processing steered by RPS
#       stays on the IRQ CPUs too.
#   queues/tx-*/xps_cpus                   every CPU of the machine, in locality order, cut
#       into one block per TX queue (as perftune.py does): each sending CPU, shards
#       included, uses its own queue instead of a hash; TX completions follow the IRQs.
# irqbalance undoes IRQ affinity: this script warns when it runs and leaves it alone.
set -euo pipefail

PROG=tune.sh
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

APPLY=0
CHECK=0
SVC_USER=morio
ETC_DIR=/etc

while (($#)); do
	if [[ $1 == --*=* ]]; then
		set -- "${1%%=*}" "${1#*=}" "${@:2}"
	fi
	case $1 in
	-h | --help)
		print_usage "$0"
		exit 0
		;;
	--apply)
		APPLY=1
		shift
		;;
	--check)
		CHECK=1
		shift
		;;
	--user)
		need_value "$@"
		SVC_USER=$2
		shift 2
		;;
	--etc-dir)
		need_value "$@"
		ETC_DIR=${2%/}
		shift 2
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

load_plan

NIC=${OPT_NIC:-$PLAN_NIC}
IRQ_CPUS=$PLAN_IRQ_CPUS
SHARD_CPUS=$PLAN_SHARD_CPUS

CHANGES=0
FAILED=0

# change PATH CURRENT NEW [WRITE]: report one change and, with --apply, write WRITE (default
# NEW) into PATH. CURRENT and NEW are what the operator sees.
change() {
	local path=$1 cur=$2 new=$3 write=${4:-$3} err
	CHANGES=$((CHANGES + 1))
	if ((!APPLY)); then
		echo "would set $path: $cur -> $new"
	elif err=$({ printf '%s\n' "$write" >"$path"; } 2>&1); then
		echo "set $path: $cur -> $new"
	else
		echo "failed $path: $cur -> $new (${err##*: })"
		FAILED=$((FAILED + 1))
	fi
}

# skip PATH: a file this script cannot read is left alone.
skip() {
	if [[ -e $1 ]]; then
		echo "skip $1: cannot read it"
	else
		echo "skip $1: not present"
	fi
}

ok() {
	echo "ok $1 already $2"
}

# read_value PATH: the file's contents on one line (whitespace squeezed), or fail.
read_value() {
	local text words
	text=$(cat -- "$1" 2>/dev/null) || return 1
	read -r -a words <<<"$text" || true
	printf '%s\n' "${words[*]-}"
}

# sysctl_at_least NAME MIN [FIELD]: NAME's value (its FIELD-th number, 1-based, for the
# three-number tcp_rmem/tcp_wmem) raised to at least MIN; other fields are kept.
sysctl_at_least() {
	local name=$1 min=$2 field=${3:-1} path cur
	path=$PROC_ROOT/sys/${name//.//}
	if ! cur=$(read_value "$path"); then
		skip "$path"
		return
	fi
	local -a f
	read -r -a f <<<"$cur"
	local v=${f[field - 1]:-}
	if [[ ! $v =~ ^[0-9]+$ ]]; then
		echo "skip $path: unexpected value '$cur'"
	elif ((v >= min)); then
		ok "$path" "$cur"
	else
		f[field - 1]=$min
		local IFS=$'\t'
		local tabbed="${f[*]}"
		IFS=' '
		change "$path" "$cur" "${f[*]}" "$tabbed"
	fi
}

# sysctl_equal NAME VALUE
sysctl_equal() {
	local name=$1 want=$2 path cur
	path=$PROC_ROOT/sys/${name//.//}
	if ! cur=$(read_value "$path"); then
		skip "$path"
	elif [[ $cur == "$want" ]]; then
		ok "$path" "$cur"
	else
		change "$path" "$cur" "$want"
	fi
}

echo "# morio tune.sh: $( ((APPLY)) && echo "applying changes" || echo "dry run, nothing is changed (--apply to change)")"
echo "# plan from $PLAN_SOURCE: node ${PLAN_NODE:-none}, nic ${NIC:-none}, irq cpus ${IRQ_CPUS:-none}, shard cpus ${SHARD_CPUS:-none}"

# --- socket buffers and TCP behaviour (see the header for why each one) ---
MIB64=$((64 << 20))
sysctl_at_least net.core.rmem_max "$MIB64"
sysctl_at_least net.core.wmem_max "$MIB64"
sysctl_at_least net.ipv4.tcp_rmem "$MIB64" 3
sysctl_at_least net.ipv4.tcp_wmem "$MIB64" 3
sysctl_at_least net.core.netdev_max_backlog 250000
sysctl_at_least net.ipv4.tcp_mtu_probing 1
sysctl_equal net.ipv4.tcp_slow_start_after_idle 0

# --- memlock for the service user ---
[[ $SVC_USER =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] || die "bad --user '$SVC_USER'"
LIMITS=$ETC_DIR/security/limits.d/60-morio.conf
WANT_LIMIT="$SVC_USER - memlock unlimited"
if [[ ! -e $LIMITS ]]; then
	CHANGES=$((CHANGES + 1))
	if ((!APPLY)); then
		echo "would set $LIMITS: (absent) -> $WANT_LIMIT"
	elif err=$({ mkdir -p -- "${LIMITS%/*}" && printf '%s\n' "$WANT_LIMIT" >"$LIMITS"; } 2>&1); then
		echo "set $LIMITS: (absent) -> $WANT_LIMIT"
	else
		echo "failed $LIMITS: (absent) -> $WANT_LIMIT (${err##*: })"
		FAILED=$((FAILED + 1))
	fi
else
	CUR_LIMIT=$(read_value "$LIMITS" || echo "(unreadable)")
	if [[ $CUR_LIMIT == "$WANT_LIMIT" ]]; then
		ok "$LIMITS" "$CUR_LIMIT"
	else
		change "$LIMITS" "$CUR_LIMIT" "$WANT_LIMIT"
	fi
fi

# --- the NIC: IRQ affinity, RPS, XPS ---
if [[ -z $NIC ]]; then
	echo "# no NIC in the plan and no --nic: IRQ affinity, RPS and XPS left alone"
elif [[ -z $IRQ_CPUS ]]; then
	echo "# the plan has no irq_cpus: IRQ affinity, RPS and XPS of $NIC left alone"
else
	[[ -n ${PLAN_NIC_IRQS[$NIC]+set} ]] || die "NIC $NIC is not in the plan's nics (have: ${PLAN_NICS:-none})"
	nic_node=${PLAN_NIC_NODE[$NIC]}
	if [[ -n $nic_node && -n $PLAN_NODE && $nic_node != "$PLAN_NODE" ]]; then
		echo "# warning: NIC $NIC is on node $nic_node, the plan is built around node $PLAN_NODE"
	fi
	if [[ -n $PLAN_OVERLAP ]]; then
		echo "# warning: the plan's irq cpus ($IRQ_CPUS) overlap its shard cpus ($SHARD_CPUS) on $PLAN_OVERLAP"
	fi
	for pid_comm in "$PROC_ROOT"/[0-9]*/comm; do
		comm=""
		read -r comm 2>/dev/null <"$pid_comm" || true
		if [[ $comm == irqbalance ]]; then
			pid=${pid_comm%/comm}
			echo "# warning: irqbalance (pid ${pid##*/}) is running and will move these IRQs again:" \
				"stop it (systemctl disable --now irqbalance) or set IRQBALANCE_BANNED_CPULIST=$SHARD_CPUS"
		fi
	done

	# each_file KIND WANT PATH...: for every PATH, "skip" when it cannot be read, else "ok" or
	# a change, as `pyh KIND WANT CURRENT...` says ("same NEW" or "diff NEW" per value).
	each_file() {
		local kind=$1 want=$2 i k=0
		shift 2
		local paths=("$@") curs=() present=() verdicts=()
		for i in "${!paths[@]}"; do
			if curs[i]=$(read_value "${paths[i]}"); then
				present+=("${curs[i]}")
			else
				unset 'curs[i]'
			fi
		done
		((${#present[@]} == 0)) || mapfile -t verdicts < <(pyh "$kind" "$want" "${present[@]}")
		for i in "${!paths[@]}"; do
			if [[ -z ${curs[i]+set} ]]; then
				skip "${paths[i]}"
				continue
			fi
			local v=${verdicts[k]:-diff ?}
			k=$((k + 1))
			if [[ $v == same* ]]; then
				ok "${paths[i]}" "${curs[i]}"
			else
				change "${paths[i]}" "${curs[i]}" "${v#* }"
			fi
		done
	}

	irq_paths=()
	for irq in ${PLAN_NIC_IRQS[$NIC]}; do
		irq_paths+=("$PROC_ROOT/irq/$irq/smp_affinity_list")
	done
	if ((${#irq_paths[@]})); then
		each_file lists "$IRQ_CPUS" "${irq_paths[@]}"
	else
		echo "# the plan lists no IRQs for $NIC"
	fi

	QDIR=$SYSFS_ROOT/class/net/$NIC/queues
	if [[ ! -d $QDIR ]]; then
		skip "$QDIR"
	else
		# queue_paths PREFIX FILE: QDIR/PREFIX-N/FILE for every queue, N ascending.
		queue_paths() {
			local d
			for d in "$QDIR/$1"-*; do
				[[ -d $d ]] && echo "${d##*-}"
			done | sort -n | while read -r n; do echo "$QDIR/$1-$n/$2"; done
		}
		mapfile -t rps_paths < <(queue_paths rx rps_cpus)
		mapfile -t xps_paths < <(queue_paths tx xps_cpus)
		((${#rps_paths[@]} == 0)) || each_file masks "$IRQ_CPUS" "${rps_paths[@]}"
		((${#xps_paths[@]} == 0)) || each_file xps "$PLAN_FILE" "${xps_paths[@]}"
	fi
fi

if ((FAILED)); then
	echo "# $FAILED of $CHANGES changes failed"
	exit 1
elif ((CHANGES == 0)); then
	echo "# nothing to change"
elif ((APPLY)); then
	echo "# applied $CHANGES changes"
else
	echo "# $CHANGES changes to make: run again with --apply"
	((!CHECK)) || exit 1
fi
