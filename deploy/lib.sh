# shellcheck shell=bash
# Shared by deploy/*.sh, sourced, never run: option handling, the topology plan (from
# `morio topology --json` or a --plan-json file), and CPU lists <-> hex masks. JSON and masks
# go through python3 (always installed; bash arithmetic stops at 64 CPUs).
#
# A script sets PROG before sourcing this file.

# Plan options, common to every script so that the same options give the same plan.
PLAN_JSON=""    # --plan-json FILE: use this JSON instead of running `morio topology`
MORIO_OPT=""    # --morio PATH
OPT_NIC=""      # --nic NAME
OPT_GPU=""      # --gpu BUSID
OPT_SHARDS=""   # --shards N
OPT_IRQ_CPUS="" # --irq-cpus N
OPT_ALLOWED=""  # --allowed LIST
SYSFS_ROOT=/sys
PROC_ROOT=/proc
PLAN_FILE=""    # the JSON the script reads, once load_plan ran
PLAN_SOURCE=""  # where it came from, for the operator

die() {
	echo "$PROG: $*" >&2
	exit 1
}

# usage_error MSG: a bad command line (exit 2, as getopt-style tools do).
usage_error() {
	echo "$PROG: $*" >&2
	echo "Try '$PROG --help'." >&2
	exit 2
}

# print_usage FILE: the script's header comment (after the shebang, up to the first
# non-comment line), without the leading '# '.
print_usage() {
	local line
	while IFS= read -r line; do
		case $line in
		'#!'*) continue ;;
		'# shellcheck'*) continue ;;
		'#'*)
			line=${line#\#}
			printf '%s\n' "${line# }"
			;;
		*) break ;;
		esac
	done <"$1"
}

# shell_join ARGS...: the arguments as one shell command line, quoted only where needed.
shell_join() {
	local a out=()
	for a in "$@"; do
		if [[ -n $a && $a =~ ^[A-Za-z0-9_./,:=@%+-]+$ ]]; then
			out+=("$a")
		else
			out+=("'${a//\'/\'\\\'\'}'")
		fi
	done
	printf '%s\n' "${out[*]}"
}

# need_value "$@": the option in $1 takes a value in $2.
need_value() {
	[[ $# -ge 2 && $2 != --* ]] || usage_error "option $1 needs a value"
}

# is_plan_opt OPT: whether OPT is one of the plan options set_plan_opt takes.
is_plan_opt() {
	case $1 in
	--plan-json | --morio | --nic | --gpu | --shards | --irq-cpus | --allowed | --sysfs-root | --proc-root) return 0 ;;
	*) return 1 ;;
	esac
}

# set_plan_opt OPT VALUE
set_plan_opt() {
	case $1 in
	--plan-json) PLAN_JSON=$2 ;;
	--morio) MORIO_OPT=$2 ;;
	--nic) OPT_NIC=$2 ;;
	--gpu) OPT_GPU=$2 ;;
	--shards)
		[[ $2 =~ ^[0-9]+$ ]] || usage_error "--shards wants a number, not '$2'"
		OPT_SHARDS=$2
		;;
	--irq-cpus)
		[[ $2 =~ ^[0-9]+$ ]] || usage_error "--irq-cpus wants a number, not '$2'"
		OPT_IRQ_CPUS=$2
		;;
	--allowed) OPT_ALLOWED=$2 ;;
	--sysfs-root) SYSFS_ROOT=${2%/} ;;
	--proc-root) PROC_ROOT=${2%/} ;;
	esac
}

# find_morio: prints the morio binary: --morio, then $MORIO, then `morio` on PATH.
find_morio() {
	if [[ -n $MORIO_OPT ]]; then
		printf '%s\n' "$MORIO_OPT"
	elif [[ -n ${MORIO:-} ]]; then
		printf '%s\n' "$MORIO"
	elif command -v morio >/dev/null 2>&1; then
		command -v morio
	else
		return 1
	fi
}

# load_plan: sets PLAN_FILE (and PLAN_SOURCE) to the plan JSON, checks it against the schema
# and sets, from it (CPU lists normalized, "" for null):
#   PLAN_NODE PLAN_NIC PLAN_GPU PLAN_IRQ_CPUS PLAN_SHARD_CPUS PLAN_APP_CPUS
#   PLAN_SHARDS          the shard CPUs in shard order, space-separated
#   PLAN_NODE_CPUS       the CPUs of PLAN_NODE
#   PLAN_OFF_NODE        shard CPUs outside PLAN_NODE
#   PLAN_OVERLAP         CPUs both in irq_cpus and in shard_cpus (a bad plan)
#   PLAN_NICS            the NICs' names, space-separated
#   PLAN_NIC_IRQS[NAME]  each NIC's IRQs, space-separated
#   PLAN_NIC_NODE[NAME]  each NIC's NUMA node
load_plan() {
	if [[ -n $PLAN_JSON ]]; then
		[[ -r $PLAN_JSON ]] || die "cannot read --plan-json $PLAN_JSON"
		local o
		for o in "--gpu:$OPT_GPU" "--shards:$OPT_SHARDS" "--irq-cpus:$OPT_IRQ_CPUS" "--allowed:$OPT_ALLOWED"; do
			[[ -z ${o#*:} ]] || echo "$PROG: note: ${o%%:*} is ignored with --plan-json (the file holds the plan)" >&2
		done
		PLAN_FILE=$PLAN_JSON
		PLAN_SOURCE=$PLAN_JSON
	else
		local morio
		morio=$(find_morio) || die "morio not found: pass --morio PATH, set MORIO, put morio on PATH, or give --plan-json FILE"
		local args=(topology --json --sysfs-root "$SYSFS_ROOT" --proc-root "$PROC_ROOT")
		[[ -z $OPT_NIC ]] || args+=(--nic "$OPT_NIC")
		[[ -z $OPT_GPU ]] || args+=(--gpu "$OPT_GPU")
		[[ -z $OPT_SHARDS ]] || args+=(--shards "$OPT_SHARDS")
		[[ -z $OPT_IRQ_CPUS ]] || args+=(--irq-cpus "$OPT_IRQ_CPUS")
		[[ -z $OPT_ALLOWED ]] || args+=(--allowed "$OPT_ALLOWED")
		PLAN_FILE=$(mktemp "${TMPDIR:-/tmp}/morio-plan.XXXXXX")
		# shellcheck disable=SC2064 # expand now: the name is fixed from here on
		trap "rm -f '$PLAN_FILE'" EXIT
		"$morio" "${args[@]}" >"$PLAN_FILE" || die "'$morio ${args[*]}' failed"
		PLAN_SOURCE="$morio ${args[*]}"
	fi
	local vars
	vars=$(pyh vars "$PLAN_FILE") || die "bad plan JSON from $PLAN_SOURCE"
	eval "$vars"
}

# pyh SUBCOMMAND ARGS...: the python3 helper.
#   vars FILE               schema check of a plan JSON (messages on stderr, exit 1), then
#                           the PLAN_* assignments load_plan evaluates (shell-quoted)
#   lists WANT CUR...       per CUR, a line: "same WANT" or "diff WANT" (CPU lists compared
#                           as sets, WANT normalized)
#   masks WANT CUR...       per CUR, a line: "same NEW" or "diff NEW", NEW the hex mask of the
#                           CPU list WANT shaped (digits, comma groups) like CUR when it fits
#   xps FILE CUR...         as masks, but queue i of len(CUR) gets block i of every CPU of
#                           the plan's "cpus" ordered by node, package, core, id
#   render TEMPLATE K=V...  TEMPLATE with @K@ replaced by V; a line naming a K whose V is
#                           empty is commented out; fails on any @NAME@ left
pyh() {
	python3 - "$@" <<'PY'
import json, re, sys

def die(msg, code=1):
    sys.stderr.write(msg + "\n")
    sys.exit(code)

def parse_list(s):
    out = set()
    for part in (s or "").strip().split(","):
        part = part.strip()
        if not part:
            continue
        a, _, b = part.partition("-")
        a = int(a)
        b = int(b) if b else a
        if b < a:
            raise ValueError("bad range " + part)
        out.update(range(a, b + 1))
    return sorted(out)

def fmt_list(ids):
    runs = []
    for i in sorted(set(ids)):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in runs)

def parse_mask(s):
    s = s.strip().replace(",", "")
    return int(s, 16) if s else 0

def fmt_mask(ids, like=""):
    v = 0
    for i in ids:
        v |= 1 << i
    groups = like.strip().split(",") if like.strip() else []
    if groups and all(re.fullmatch("[0-9a-fA-F]+", g) for g in groups):
        width = sum(len(g) for g in groups)
        if v < (1 << (4 * width)):
            h = format(v, "0%dx" % width)
            out, pos = [], 0
            for g in groups:
                out.append(h[pos:pos + len(g)])
                pos += len(g)
            return ",".join(out)
    h = format(v, "x")
    n = max(1, (len(h) + 7) // 8)
    h = h.zfill(8 * n)
    return ",".join(h[8 * i:8 * i + 8] for i in range(n))

def check(doc):
    errs = []
    def need(obj, key, types, where):
        if not isinstance(obj, dict) or key not in obj:
            errs.append("%s: missing \"%s\"" % (where, key))
            return None
        if not isinstance(obj[key], types) or isinstance(obj[key], bool):
            errs.append("%s: \"%s\" has the wrong type" % (where, key))
            return None
        return obj[key]
    def cpulist(obj, key, where):
        s = need(obj, key, str, where)
        if s is not None:
            try:
                parse_list(s)
            except ValueError:
                errs.append("%s: \"%s\" is not a CPU list: %r" % (where, key, s))
    if not isinstance(doc, dict):
        return ["the top level is not an object"]
    cpulist(doc, "allowed_cpus", "top level")
    for i, c in enumerate(need(doc, "cpus", list, "top level") or []):
        for k in ("id", "core", "package"):
            need(c, k, int, "cpus[%d]" % i)
    for i, n in enumerate(need(doc, "nodes", list, "top level") or []):
        need(n, "id", int, "nodes[%d]" % i)
        cpulist(n, "cpus", "nodes[%d]" % i)
    for i, n in enumerate(need(doc, "nics", list, "top level") or []):
        need(n, "name", str, "nics[%d]" % i)
        for q in need(n, "irqs", list, "nics[%d]" % i) or []:
            if not isinstance(q, int) or isinstance(q, bool):
                errs.append("nics[%d]: irqs must be numbers" % i)
    plan = need(doc, "plan", dict, "top level")
    if plan is not None:
        for k in ("node", "nic", "gpu"):
            if k not in plan:
                errs.append("plan: missing \"%s\"" % k)
        for k in ("shard_cpus", "irq_cpus", "app_cpus"):
            cpulist(plan, k, "plan")
        shards = need(plan, "shards", list, "plan") or []
        if any(not isinstance(s, int) or isinstance(s, bool) for s in shards):
            errs.append("plan: shards must be CPU numbers")
    return errs

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        die("plan JSON %s: %s" % (path, e))

def q(v):
    return "'" + str(v).replace("'", "'\\''") + "'"

def mask_line(ids, cur):
    new = fmt_mask(ids, cur)
    same = cur.strip() != "" and parse_mask(cur) == parse_mask(new)
    return ("same " if same else "diff ") + new

def xps_blocks(doc, n):
    cpus = sorted(doc["cpus"], key=lambda c: (c.get("node") if c.get("node") is not None else -1,
                                             c["package"], c["core"], c["id"]))
    ids = [c["id"] for c in cpus]
    if not ids:
        return [[] for _ in range(n)]
    if len(ids) < n:
        return [[ids[i % len(ids)]] for i in range(n)]
    return [ids[i * len(ids) // n:(i + 1) * len(ids) // n] for i in range(n)]

def main(argv):
    cmd, args = argv[0], argv[1:]
    if cmd == "vars":
        doc = load(args[0])
        errs = check(doc)
        for e in errs:
            sys.stderr.write("plan JSON %s: %s\n" % (args[0], e))
        if errs:
            sys.exit(1)
        p = doc["plan"]
        node = p["node"]
        shard = parse_list(p["shard_cpus"])
        irq = parse_list(p["irq_cpus"])
        node_cpus = []
        for n in doc["nodes"]:
            if node is not None and n["id"] == node:
                node_cpus = parse_list(n["cpus"])
        shards = p["shards"] or shard
        out = {
            "PLAN_NODE": "" if node is None else node,
            "PLAN_NIC": p["nic"] or "",
            "PLAN_GPU": p["gpu"] or "",
            "PLAN_IRQ_CPUS": fmt_list(irq),
            "PLAN_SHARD_CPUS": fmt_list(shard),
            "PLAN_APP_CPUS": fmt_list(parse_list(p["app_cpus"])),
            "PLAN_SHARDS": " ".join(str(c) for c in shards),
            "PLAN_NODE_CPUS": fmt_list(node_cpus),
            "PLAN_OFF_NODE": fmt_list(set(shards) - set(node_cpus)) if node_cpus else "",
            "PLAN_OVERLAP": fmt_list(set(irq) & set(shard)),
            "PLAN_NICS": " ".join(n["name"] for n in doc["nics"]),
        }
        for k, v in out.items():
            print("%s=%s" % (k, q(v)))
        print("declare -gA PLAN_NIC_NODE=(" + " ".join(
            "[%s]=%s" % (q(n["name"]), q("" if n.get("node") is None else n["node"])) for n in doc["nics"]) + ")")
        print("declare -gA PLAN_NIC_IRQS=(" + " ".join(
            "[%s]=%s" % (q(n["name"]), q(" ".join(str(i) for i in n["irqs"]))) for n in doc["nics"]) + ")")
    elif cmd == "lists":
        want = parse_list(args[0])
        for cur in args[1:]:
            try:
                same = parse_list(cur) == want
            except ValueError:
                same = False
            print(("same " if same else "diff ") + fmt_list(want))
    elif cmd == "masks":
        want = parse_list(args[0])
        for cur in args[1:]:
            print(mask_line(want, cur))
    elif cmd == "xps":
        doc = load(args[0])
        curs = args[1:]
        for cur, block in zip(curs, xps_blocks(doc, len(curs))):
            print(mask_line(block, cur))
    elif cmd == "render":
        with open(args[0]) as f:
            text = f.read()
        vals = dict(a.split("=", 1) for a in args[1:])
        out = []
        for line in text.splitlines():
            names = re.findall(r"@([A-Z_]+)@", line)
            if not line.lstrip().startswith("#") and any(n in vals and vals[n] == "" for n in names):
                line = "# (not in the plan) " + line
            for n in names:
                if vals.get(n):
                    line = line.replace("@%s@" % n, vals[n])
            out.append(line)
        left = sorted(set(re.findall(r"@([A-Z_]+)@", "\n".join(l for l in out if not l.startswith("#")))))
        if left:
            die("template %s: no value for %s" % (args[0], ", ".join(left)))
        print("\n".join(out))
    else:
        die("pyh: unknown subcommand " + cmd)

try:
    main(sys.argv[1:])
except ValueError as e:
    die("bad CPU list or mask: %s" % e)
PY
}
