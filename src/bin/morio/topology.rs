//! `morio topology`: the machine model (CPUs, NUMA nodes, NICs, GPUs) and a NUMA-aware placement plan, as tables or JSON.

use std::path::PathBuf;

use anyhow::Context;
use comfy_table::Table;
use morio_topology::{plan_node, CpuSet, NodePlan, NodePlanRequest, Topology};
use serde_json::{json, Value};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Root of the sysfs tree to read.
    #[arg(long, default_value = "/sys")]
    sysfs_root: PathBuf,
    /// Root of the proc tree to read IRQ affinity from.
    #[arg(long, default_value = "/proc")]
    proc_root: PathBuf,
    /// Plan around this network interface's NUMA node.
    #[arg(long, value_name = "NAME")]
    nic: Option<String>,
    /// Plan around this GPU's NUMA node (PCI address, e.g. 0000:18:00.0).
    #[arg(long, value_name = "BUSID")]
    gpu: Option<String>,
    /// Shards (default: one per physical core left on the node).
    #[arg(long, value_name = "N")]
    shards: Option<usize>,
    /// CPUs reserved for the device's IRQs (default: one core with its SMT siblings).
    #[arg(long, value_name = "N")]
    irq_cpus: Option<usize>,
    /// Allowed CPUs, e.g. 0-15,32-47 (default: this process's affinity mask).
    #[arg(long, value_name = "LIST")]
    allowed: Option<CpuSet>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (topo, allowed, plan) = model(&args)?;
    if args.json {
        let value = to_json(&args, &topo, &allowed, &plan);
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print_tables(&args, &topo, &allowed, &plan);
    }
    Ok(())
}

fn model(args: &Args) -> anyhow::Result<(Topology, CpuSet, NodePlan)> {
    let topo = Topology::discover(&args.sysfs_root, Some(&args.proc_root))
        .with_context(|| format!("reading topology under {}", args.sysfs_root.display()))?;
    let allowed = args
        .allowed
        .clone()
        .unwrap_or_else(morio::placement::allowed_cpus);
    let req = NodePlanRequest {
        nic: args.nic.clone(),
        gpu: args.gpu.clone(),
        n_shards: args.shards,
        n_irq_cpus: args.irq_cpus,
    };
    let plan = plan_node(&topo, &allowed, &req).context("planning placement")?;
    Ok((topo, allowed, plan))
}

fn list(cpus: &[usize]) -> String {
    cpus.iter().copied().collect::<CpuSet>().to_string()
}

fn to_json(args: &Args, topo: &Topology, allowed: &CpuSet, plan: &NodePlan) -> Value {
    let cpus: Vec<Value> = topo
        .cpus
        .iter()
        .map(|c| {
            json!({"id": c.id, "core": c.core, "package": c.package, "node": c.node,
                   "siblings": c.siblings.to_string()})
        })
        .collect();
    let nodes: Vec<Value> = topo
        .nodes
        .iter()
        .map(|n| json!({"id": n.id, "cpus": n.cpus.to_string(), "distances": n.distances}))
        .collect();
    let nics: Vec<Value> = topo
        .nics
        .iter()
        .map(|n| {
            let affinity: serde_json::Map<String, Value> = n
                .irq_affinity
                .iter()
                .map(|(irq, cpus)| (irq.to_string(), Value::from(cpus.to_string())))
                .collect();
            json!({"name": n.name, "node": n.node, "speed_mbps": n.speed_mbps,
                   "irqs": n.irqs, "irq_affinity": affinity})
        })
        .collect();
    let gpus: Vec<Value> = topo
        .gpus
        .iter()
        .map(|g| json!({"vendor": g.vendor.as_str(), "bus_id": g.bus_id, "node": g.node}))
        .collect();
    json!({
        "sysfs_root": args.sysfs_root.display().to_string(),
        "allowed_cpus": allowed.to_string(),
        "cpus": cpus,
        "nodes": nodes,
        "nics": nics,
        "gpus": gpus,
        "plan": {
            "node": plan.node,
            "nic": plan.nic,
            "gpu": plan.gpu,
            "shard_cpus": list(&plan.shard_cpus),
            "irq_cpus": list(&plan.irq_cpus),
            "app_cpus": list(&plan.app_cpus),
            "shards": plan.shard_cpus,
        },
    })
}

fn opt<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> Table {
    let mut table = Table::new();
    table.load_preset(comfy_table::presets::ASCII_MARKDOWN);
    table.set_header(header.to_vec());
    for row in rows {
        table.add_row(row);
    }
    table
}

fn print_tables(args: &Args, topo: &Topology, allowed: &CpuSet, plan: &NodePlan) {
    println!(
        "sysfs root {}, {} CPUs ({} physical cores), allowed {} ({} of them)\n",
        args.sysfs_root.display(),
        topo.cpus.len(),
        topo.physical_cores(),
        allowed,
        topo.online().intersection(allowed).len()
    );
    let nodes = topo.nodes.iter().map(|n| {
        let cores = topo
            .cpus
            .iter()
            .filter(|c| c.node == n.id && c.siblings.iter().next() == Some(c.id));
        let distances: Vec<String> = n.distances.iter().map(u32::to_string).collect();
        vec![
            n.id.to_string(),
            n.cpus.to_string(),
            cores.count().to_string(),
            distances.join(" "),
        ]
    });
    println!(
        "{}\n",
        table(&["node", "cpus", "cores", "distances"], nodes)
    );
    let cpus = topo.cpus.iter().map(|c| {
        [c.id, c.core, c.package, c.node]
            .map(|v| v.to_string())
            .into_iter()
            .chain([c.siblings.to_string()])
            .collect()
    });
    println!(
        "{}\n",
        table(&["cpu", "core", "package", "node", "siblings"], cpus)
    );
    let nics = topo.nics.iter().map(|n| {
        let irqs: Vec<String> = n
            .irqs
            .iter()
            .map(|irq| match n.irq_affinity.get(irq) {
                Some(cpus) => format!("{irq}→{cpus}"),
                None => irq.to_string(),
            })
            .collect();
        vec![
            n.name.clone(),
            opt(n.node),
            opt(n.speed_mbps),
            irqs.join(" "),
        ]
    });
    println!(
        "{}\n",
        table(&["nic", "node", "Mb/s", "irqs (→ affinity)"], nics)
    );
    let gpus = topo
        .gpus
        .iter()
        .map(|g| vec![g.bus_id.clone(), g.vendor.as_str().to_owned(), opt(g.node)]);
    println!("{}\n", table(&["gpu", "vendor", "node"], gpus));
    println!(
        "plan: node {}, nic {}, gpu {}",
        opt(plan.node),
        opt(plan.nic.as_deref()),
        opt(plan.gpu.as_deref())
    );
    let rows = [
        ("irq", list(&plan.irq_cpus), plan.irq_cpus.len()),
        ("shards", list(&plan.shard_cpus), plan.shard_cpus.len()),
        ("app", list(&plan.app_cpus), plan.app_cpus.len()),
    ]
    .map(|(role, cpus, n)| vec![role.to_owned(), n.to_string(), cpus]);
    println!("{}", table(&["role", "count", "cpus"], rows));
    let order: Vec<String> = plan.shard_cpus.iter().map(usize::to_string).collect();
    println!("shard order: {}", order.join(" "));
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn json_for(fixture: &str, extra: &[&str]) -> anyhow::Result<Value> {
        let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("topology/tests/fixtures");
        let (sys, proc) = match fixture {
            "h200-1s16c" => (base.join(fixture), base.join("h200-1s16c-proc")),
            _ => (
                base.join(fixture).join("sys"),
                base.join(fixture).join("proc"),
            ),
        };
        let mut argv = vec!["t".to_owned(), "--json".to_owned()];
        argv.extend(["--sysfs-root".to_owned(), sys.display().to_string()]);
        argv.extend(["--proc-root".to_owned(), proc.display().to_string()]);
        argv.extend(extra.iter().map(|s| s.to_string()));
        let args = Cli::try_parse_from(argv)?.args;
        let (topo, allowed, plan) = model(&args)?;
        Ok(to_json(&args, &topo, &allowed, &plan))
    }

    #[test]
    fn json_schema_on_two_sockets() {
        let v = json_for("2s-smt-8gpu-8nic", &["--nic", "eth5", "--allowed", "0-63"]).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 7, "{keys:?}");
        assert_eq!(v["allowed_cpus"], "0-63");
        assert!(v["sysfs_root"].as_str().unwrap().ends_with("/sys"));
        assert_eq!(v["cpus"].as_array().unwrap().len(), 64);
        assert_eq!(
            v["cpus"][33],
            json!({"id": 33, "core": 1, "package": 0, "node": 0, "siblings": "1,33"})
        );
        assert_eq!(
            v["nodes"][1],
            json!({"id": 1, "cpus": "16-31,48-63", "distances": [21, 10]})
        );
        assert_eq!(v["nics"].as_array().unwrap().len(), 8);
        assert_eq!(
            v["nics"][7],
            json!({"name": "eth7", "node": 1, "speed_mbps": 400000, "irqs": [170, 171, 172, 173],
                   "irq_affinity": {"170": "16-31,48-63", "171": "16-31,48-63", "172": "16-31,48-63"}})
        );
        assert_eq!(v["gpus"].as_array().unwrap().len(), 8);
        assert_eq!(
            v["gpus"][4],
            json!({"vendor": "nvidia", "bus_id": "0000:9a:00.0", "node": 1})
        );
        let shards: Vec<usize> = (17..32).collect();
        assert_eq!(
            v["plan"],
            json!({"node": 1, "nic": "eth5", "gpu": null, "shard_cpus": "17-31",
                   "irq_cpus": "16,48", "app_cpus": "0-15,32-47,49-63", "shards": shards})
        );
    }

    #[test]
    fn json_gpu_plan_and_unknowns() {
        let v = json_for(
            "h200-1s16c",
            &["--gpu", "18:00.0", "--allowed", "0-7", "--shards", "3"],
        )
        .unwrap();
        assert_eq!(
            v["plan"],
            json!({"node": 0, "nic": null, "gpu": "0000:18:00.0", "shard_cpus": "1-3",
                   "irq_cpus": "0", "app_cpus": "4-7", "shards": [1, 2, 3]})
        );
        assert_eq!(
            v["nics"][0]["irq_affinity"],
            json!({"45": "0-15", "46": "1", "47": "2-3,8"})
        );
        assert_eq!(v["nodes"][0]["distances"], json!([10]));
        assert!(json_for("h200-1s16c", &["--nic", "eth9"]).is_err());
        assert!(json_for("h200-1s16c", &["--allowed", "0-"]).is_err());
        assert!(json_for("h200-1s16c", &["--allowed", "40-47"]).is_err());
    }

    #[test]
    fn tables_print_without_error() {
        let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("topology/tests/fixtures");
        let args = Cli::try_parse_from([
            "t".to_owned(),
            "--sysfs-root".to_owned(),
            base.join("dual-socket-smt").display().to_string(),
            "--allowed".to_owned(),
            "0-15".to_owned(),
        ])
        .unwrap()
        .args;
        assert!(run(args).is_ok());
    }
}
