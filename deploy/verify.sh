#!/usr/bin/env bash
# Show where a running morio's threads are: each thread's name, the CPU it last ran on
# (/proc/PID/task/TID/stat field 39) and the CPUs it may run on (Cpus_allowed_list), and,
# given a plan, whether every shard thread (morio-shard-N) is pinned to the CPU the plan gives
# shard N.
#
# usage: verify.sh (--pid PID | --name NAME) [--shards-only] [--plan-json FILE | --plan]
#                  [plan options]
#        verify.sh --host [--morio PATH]
#
# --host checks this host or container instead (`morio check`): io_uring allowed (container
# runtimes' default seccomp profiles block it: use deploy/seccomp-morio.json) and the
# locked-memory limit; exit status 1, with what to change, if either is missing.
#
# Output, one line per thread, then a summary line starting with '#':
#   TID      NAME             CPU  ALLOWED        PLANNED  STATUS
#   4242     morio-shard-0      2  2              2        ok
# STATUS of a shard thread: ok; moved (pinned to its CPU but last ran elsewhere);
# unpinned (may run on other CPUs than its planned one); unplanned (the plan has no shard N);
# shared (another shard thread is on the same CPU). Without a plan, shards show pinned or
# unpinned. A planned shard with no thread is listed as "missing". Exit status: 1 when any
# shard is not ok against the plan, or the process is not found; 0 otherwise.
#
#   --pid PID           the process to look at
#   --name NAME         the process whose name (/proc/PID/comm) is NAME (default: morio);
#                       an error if several match
#   --shards-only       list only morio-shard-N threads
#   --plan-json FILE    compare with this `morio topology --json` output
#   --plan              compare with the plan `morio topology` makes now (same plan options as
#                       launch.sh: --morio, --nic, --gpu, --shards, --irq-cpus, --allowed,
#                       --sysfs-root)
#   --proc-root DIR     procfs to read (default: /proc)
#   -h, --help          this text
set -euo pipefail

PROG=verify.sh
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

PID=""
NAME=""
SHARDS_ONLY=0
WANT_PLAN=0
WANT_HOST=0

while (($#)); do
	if [[ $1 == --*=* ]]; then
		set -- "${1%%=*}" "${1#*=}" "${@:2}"
	fi
	case $1 in
	-h | --help)
		print_usage "$0"
		exit 0
		;;
	--pid)
		need_value "$@"
		[[ $2 =~ ^[0-9]+$ ]] || usage_error "--pid wants a process id, not '$2'"
		PID=$2
		shift 2
		;;
	--name)
		need_value "$@"
		NAME=$2
		shift 2
		;;
	--shards-only)
		SHARDS_ONLY=1
		shift
		;;
	--plan)
		WANT_PLAN=1
		shift
		;;
	--host)
		WANT_HOST=1
		shift
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

if ((WANT_HOST)); then
	morio=$(find_morio) || die "morio not found: pass --morio PATH, set MORIO or put morio on PATH"
	exec "$morio" check
fi
[[ -z $PID || -z $NAME ]] || usage_error "give --pid or --name, not both"
if [[ -z $PID ]]; then
	NAME=${NAME:-morio}
	pids=()
	for f in "$PROC_ROOT"/[0-9]*/comm; do
		comm=""
		read -r comm 2>/dev/null <"$f" || true
		[[ $comm == "$NAME" ]] || continue
		p=${f%/comm}
		pids+=("${p##*/}")
	done
	((${#pids[@]})) || die "no process named '$NAME' (in $PROC_ROOT/*/comm); give --pid"
	((${#pids[@]} == 1)) || die "several processes named '$NAME': ${pids[*]}; give --pid"
	PID=${pids[0]}
fi
[[ -d $PROC_ROOT/$PID/task ]] || die "no process $PID (no $PROC_ROOT/$PID/task)"

# planned[N] = the plan's CPU of shard N
declare -a planned=()
HAVE_PLAN=0
if [[ -n $PLAN_JSON ]] || ((WANT_PLAN)); then
	load_plan
	read -r -a planned <<<"$PLAN_SHARDS"
	HAVE_PLAN=1
fi

# One record per thread: TID NAME CPU ALLOWED (NAME may hold spaces: keep it last in the read).
declare -a tids=() names=() cpus=() alloweds=()
while read -r tid; do
	t=$PROC_ROOT/$PID/task/$tid
	# The thread may exit while we read: skip it then.
	comm=$(cat -- "$t/comm" 2>/dev/null) || continue
	stat=$(cat -- "$t/stat" 2>/dev/null) || continue
	# Fields after the ")" that closes comm start at field 3; field 39 is processor.
	read -r -a f <<<"${stat##*) }"
	status=$(cat -- "$t/status" 2>/dev/null) || continue
	allowed=""
	if [[ $status =~ Cpus_allowed_list:[[:space:]]*([0-9,-]+) ]]; then
		allowed=${BASH_REMATCH[1]}
	fi
	tids+=("$tid")
	names+=("$comm")
	cpus+=("${f[36]:-?}")
	alloweds+=("$allowed")
done < <(for d in "$PROC_ROOT/$PID/task"/[0-9]*; do echo "${d##*/}"; done | sort -n)

PROCESS=$(cat -- "$PROC_ROOT/$PID/comm" 2>/dev/null || echo "?")
echo "# pid $PID ($PROCESS), ${#tids[@]} threads$( ((HAVE_PLAN)) && echo ", plan from $PLAN_SOURCE")"
printf '%-8s %-16s %4s  %-14s %-8s %s\n' TID NAME CPU ALLOWED PLANNED STATUS

# Which CPU each shard thread is pinned to, to find two shards on one CPU.
declare -A pinned_by=()
for i in "${!tids[@]}"; do
	if [[ ${names[i]} =~ ^morio-shard-[0-9]+$ && ${alloweds[i]} =~ ^[0-9]+$ ]]; then
		c=${alloweds[i]}
		pinned_by[$c]=$((${pinned_by[$c]:-0} + 1))
	fi
done

SHARD_THREADS=0
BAD=0
declare -A seen=()
for i in "${!tids[@]}"; do
	name=${names[i]} cpu=${cpus[i]} allowed=${alloweds[i]} plan_cpu=- status=-
	if [[ $name =~ ^morio-shard-([0-9]+)$ ]]; then
		n=${BASH_REMATCH[1]}
		seen[$n]=1
		SHARD_THREADS=$((SHARD_THREADS + 1))
		if ((HAVE_PLAN)); then
			if ((n >= ${#planned[@]})); then
				status=unplanned
			else
				plan_cpu=${planned[n]}
				if [[ $allowed != "$plan_cpu" ]]; then
					status=unpinned
				elif [[ ${pinned_by[$plan_cpu]:-0} -gt 1 ]]; then
					status=shared
				elif [[ $cpu != "$plan_cpu" ]]; then
					status=moved
				else
					status=ok
				fi
			fi
			[[ $status == ok ]] || BAD=$((BAD + 1))
		elif [[ $allowed =~ ^[0-9]+$ ]]; then
			status=pinned
			[[ ${pinned_by[$allowed]:-0} -le 1 ]] || status=shared
		else
			status=unpinned
		fi
	elif ((SHARDS_ONLY)); then
		continue
	fi
	printf '%-8s %-16s %4s  %-14s %-8s %s\n' "${tids[i]}" "$name" "$cpu" "$allowed" "$plan_cpu" "$status"
done

if ((HAVE_PLAN)); then
	for n in "${!planned[@]}"; do
		if [[ -z ${seen[$n]:-} ]]; then
			printf '%-8s %-16s %4s  %-14s %-8s %s\n' - "morio-shard-$n" - - "${planned[n]}" missing
			BAD=$((BAD + 1))
		fi
	done
	if ((BAD)); then
		echo "# $SHARD_THREADS shard threads, ${#planned[@]} planned: $BAD not ok"
		exit 1
	fi
	echo "# $SHARD_THREADS shard threads, ${#planned[@]} planned: all ok"
else
	echo "# $SHARD_THREADS shard threads (no plan given: --plan-json FILE or --plan to check placement)"
fi
