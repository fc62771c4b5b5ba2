//! NICs and GPUs: their model ([`Nic`], [`Gpu`], [`GpuVendor`]) and reading them from sysfs and proc roots.

use std::collections::BTreeMap;
use std::path::Path;

use crate::cpulist::CpuSet;
use crate::error::TopologyError;
use crate::read::{cpu_list_at, dir_names, parse_error, parse_int, read_text, read_text_opt};

/// A physical network interface (`class/net/<name>` with a `device` link).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nic {
    /// The interface name (`eth0`, `ens1f0np0`).
    pub name: String,
    /// The NUMA node of its PCI device (`device/numa_node`); `None` when
    /// unknown (`-1` or missing) on a machine of several nodes — on a
    /// single-node machine unknown means that node.
    pub node: Option<usize>,
    /// The link speed in Mb/s (`speed`); `None` when the link is down
    /// (`-1`) or the file is unreadable.
    pub speed_mbps: Option<u64>,
    /// Its MSI/MSI-X interrupt numbers (`device/msi_irqs/`), ascending.
    pub irqs: Vec<u32>,
    /// The current affinity of those IRQs (`irq/N/smp_affinity_list` under
    /// the proc root), for the IRQs where it could be read.
    pub irq_affinity: BTreeMap<u32, CpuSet>,
}

/// The maker of a [`Gpu`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuVendor {
    /// PCI vendor 0x10de.
    Nvidia,
    /// PCI vendor 0x1002.
    Amd,
}

impl GpuVendor {
    /// `"nvidia"` or `"amd"`.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuVendor::Nvidia => "nvidia",
            GpuVendor::Amd => "amd",
        }
    }

    fn from_pci(vendor: u32) -> Option<GpuVendor> {
        match vendor {
            0x10de => Some(GpuVendor::Nvidia),
            0x1002 => Some(GpuVendor::Amd),
            _ => None,
        }
    }
}

/// A GPU: a PCI display/3D controller (class 0x03xxxx) made by NVIDIA or AMD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Who made it.
    pub vendor: GpuVendor,
    /// Its PCI address, lower-case (`0000:18:00.0`).
    pub bus_id: String,
    /// Its NUMA node, as for [`Nic::node`].
    pub node: Option<usize>,
}

/// Lower-cases a PCI address and adds the `0000:` domain when it is left out.
pub(crate) fn normalize_bus_id(bus_id: &str) -> String {
    let lower = bus_id.trim().to_ascii_lowercase();
    if lower.matches(':').count() == 1 {
        format!("0000:{lower}")
    } else {
        lower
    }
}

/// Reads `numa_node`: a missing file or `-1` is unknown, which is node
/// `single` on a single-node machine.
fn read_numa_node(path: &Path, single: Option<usize>) -> Result<Option<usize>, TopologyError> {
    let Some(text) = read_text_opt(path)? else {
        return Ok(single);
    };
    match parse_int(path, &text)? {
        -1 => Ok(single),
        value => usize::try_from(value)
            .map(Some)
            .map_err(|_| parse_error(path, format!("{value} is not a NUMA node"))),
    }
}

/// Reads a NIC's `speed`: unreadable or negative is `None`.
fn read_speed(path: &Path) -> Result<Option<u64>, TopologyError> {
    let Ok(text) = read_text(path) else {
        return Ok(None);
    };
    let value = parse_int(path, &text)?;
    Ok(u64::try_from(value).ok())
}

fn parse_hex(path: &Path, text: &str) -> Result<u32, TopologyError> {
    let text = text.trim();
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    u32::from_str_radix(digits, 16)
        .map_err(|_| parse_error(path, format!("{text:?} is not a hex number")))
}

/// The NICs under `sysfs_root/class/net` (none when it is missing), with IRQ
/// affinity from `proc_root` when given. `single` is the node an unknown
/// `numa_node` means (`Some` only on a single-node machine).
pub(crate) fn read_nics(
    sysfs_root: &Path,
    proc_root: Option<&Path>,
    single: Option<usize>,
) -> Result<Vec<Nic>, TopologyError> {
    let net = sysfs_root.join("class").join("net");
    let mut nics = Vec::new();
    for name in dir_names(&net)?.unwrap_or_default() {
        let dir = net.join(&name);
        let device = dir.join("device");
        if name == "lo" || !device.exists() {
            continue;
        }
        let irqs = read_irqs(&device.join("msi_irqs"))?;
        let irq_affinity = match proc_root {
            Some(proc_root) => read_irq_affinity(proc_root, &irqs)?,
            None => BTreeMap::new(),
        };
        nics.push(Nic {
            node: read_numa_node(&device.join("numa_node"), single)?,
            speed_mbps: read_speed(&dir.join("speed"))?,
            name,
            irqs,
            irq_affinity,
        });
    }
    Ok(nics)
}

fn read_irqs(dir: &Path) -> Result<Vec<u32>, TopologyError> {
    let mut irqs = Vec::new();
    for name in dir_names(dir)?.unwrap_or_default() {
        let irq = name
            .parse::<u32>()
            .map_err(|_| parse_error(&dir.join(&name), "not an IRQ number".to_owned()))?;
        irqs.push(irq);
    }
    irqs.sort_unstable();
    Ok(irqs)
}

/// `irq/N/smp_affinity_list` for each IRQ; unreadable files are left out.
fn read_irq_affinity(
    proc_root: &Path,
    irqs: &[u32],
) -> Result<BTreeMap<u32, CpuSet>, TopologyError> {
    let mut affinity = BTreeMap::new();
    for &irq in irqs {
        let path = proc_root
            .join("irq")
            .join(irq.to_string())
            .join("smp_affinity_list");
        if let Ok(text) = read_text(&path) {
            affinity.insert(irq, cpu_list_at(&path, &text)?);
        }
    }
    Ok(affinity)
}

/// The GPUs under `sysfs_root/bus/pci/devices` (none when it is missing).
/// Devices without a readable `class` or `vendor` are not GPUs.
pub(crate) fn read_gpus(
    sysfs_root: &Path,
    single: Option<usize>,
) -> Result<Vec<Gpu>, TopologyError> {
    let devices = sysfs_root.join("bus").join("pci").join("devices");
    let mut gpus = Vec::new();
    for name in dir_names(&devices)?.unwrap_or_default() {
        let dir = devices.join(&name);
        let (Some(class), Some(vendor)) = (
            read_text_opt(&dir.join("class"))?,
            read_text_opt(&dir.join("vendor"))?,
        ) else {
            continue;
        };
        let class = parse_hex(&dir.join("class"), &class)?;
        let vendor = parse_hex(&dir.join("vendor"), &vendor)?;
        let Some(vendor) = GpuVendor::from_pci(vendor) else {
            continue;
        };
        if class >> 16 != 0x03 {
            continue;
        }
        gpus.push(Gpu {
            vendor,
            bus_id: name.to_ascii_lowercase(),
            node: read_numa_node(&dir.join("numa_node"), single)?,
        });
    }
    gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    Ok(gpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_are_normalized() {
        assert_eq!(normalize_bus_id("0000:18:00.0"), "0000:18:00.0");
        assert_eq!(normalize_bus_id("0000:AB:00.0"), "0000:ab:00.0");
        assert_eq!(normalize_bus_id("9A:00.0"), "0000:9a:00.0");
        assert_eq!(normalize_bus_id(""), "");
    }

    #[test]
    fn hex_values() {
        let p = Path::new("class");
        assert_eq!(parse_hex(p, "0x030200\n").unwrap(), 0x03_0200);
        assert_eq!(parse_hex(p, "10DE").unwrap(), 0x10de);
        for bad in ["", "0x", "0xzz", "-0x1", "0x1ffffffff"] {
            assert!(
                matches!(parse_hex(p, bad), Err(TopologyError::Parse { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn vendors() {
        assert_eq!(GpuVendor::from_pci(0x10de), Some(GpuVendor::Nvidia));
        assert_eq!(GpuVendor::from_pci(0x1002), Some(GpuVendor::Amd));
        assert_eq!(GpuVendor::from_pci(0x8086), None);
        assert_eq!(GpuVendor::Amd.as_str(), "amd");
        assert_eq!(GpuVendor::Nvidia.as_str(), "nvidia");
    }
}
