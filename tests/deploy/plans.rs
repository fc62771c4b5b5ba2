//! The committed testdata plans (`deploy/testdata/*.json`) are self-consistent: CPU lists
//! partition the allowed CPUs, nodes hold their CPUs, the plan's NIC is on its node, no IRQ
//! is reused.

use std::collections::BTreeSet;
use std::path::Path;

use crate::common::{read, testdata};

/// Parses "0-3,8,10-11".
fn cpus(list: &str) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        out.extend(a.parse::<u64>().unwrap()..=b.parse::<u64>().unwrap());
    }
    out
}

#[test]
fn testdata_plans_are_consistent() {
    for name in ["h200-1s16c.json", "dual-socket-smt-8nic.json"] {
        let v: serde_json::Value = serde_json::from_str(&read(Path::new(&testdata(name)))).unwrap();
        let plan = &v["plan"];
        let s = |x: &serde_json::Value| cpus(x.as_str().unwrap());
        let all: BTreeSet<u64> = v["cpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_u64().unwrap())
            .collect();
        assert_eq!(s(&v["allowed_cpus"]), all, "{name}");
        let (shard, irq, app) = (
            s(&plan["shard_cpus"]),
            s(&plan["irq_cpus"]),
            s(&plan["app_cpus"]),
        );
        let shards: BTreeSet<u64> = plan["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .collect();
        assert_eq!(shards, shard, "{name}: shards and shard_cpus differ");
        assert!(
            shard.is_disjoint(&irq) && shard.is_disjoint(&app) && irq.is_disjoint(&app),
            "{name}"
        );
        let union: BTreeSet<u64> = shard.iter().chain(&irq).chain(&app).copied().collect();
        assert_eq!(union, all, "{name}: the three lists must cover every CPU");
        // Every CPU is in its node's list; the plan's node, NIC and NIC node agree.
        for c in v["cpus"].as_array().unwrap() {
            let node = &v["nodes"][c["node"].as_u64().unwrap() as usize];
            assert!(
                s(&node["cpus"]).contains(&c["id"].as_u64().unwrap()),
                "{name}: {c}"
            );
        }
        let nic = v["nics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == plan["nic"])
            .unwrap_or_else(|| panic!("{name}: the plan's NIC is not in nics"));
        assert_eq!(nic["node"], plan["node"], "{name}");
        let node = &v["nodes"][plan["node"].as_u64().unwrap() as usize];
        assert!(
            irq.is_subset(&s(&node["cpus"])),
            "{name}: IRQ CPUs off the NIC's node"
        );
        let irqs: Vec<u64> = v["nics"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|n| {
                n["irqs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i.as_u64().unwrap())
            })
            .collect();
        assert_eq!(
            irqs.len(),
            irqs.iter().collect::<BTreeSet<_>>().len(),
            "{name}: IRQ reused"
        );
    }
    let dual: serde_json::Value =
        serde_json::from_str(&read(Path::new(&testdata("dual-socket-smt-8nic.json")))).unwrap();
    assert_eq!(dual["nics"].as_array().unwrap().len(), 8);
    assert_eq!(dual["nodes"].as_array().unwrap().len(), 2);
}
