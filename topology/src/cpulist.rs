//! The Linux "cpulist" text format (`0-3,8,10-11`) and [`CpuSet`], the set of CPU ids it denotes.

use std::collections::{btree_set, BTreeSet};
use std::fmt;
use std::iter::Copied;
use std::str::FromStr;

use crate::error::TopologyError;

/// The largest CPU id [`parse_cpu_list`] accepts.
///
/// Linux's `NR_CPUS` is at most 8192 on any mainstream architecture; this
/// bound only stops a malformed range such as `0-99999999999` from building
/// an enormous set.
pub const MAX_CPU_ID: usize = (1 << 16) - 1;

/// An ordered set of CPU ids.
///
/// Displays in the kernel's list form (`0-3,8`), and parses from it with
/// [`parse_cpu_list`] or [`str::parse`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<usize>);

impl CpuSet {
    /// An empty set.
    pub fn new() -> CpuSet {
        CpuSet(BTreeSet::new())
    }

    /// Adds `cpu`; returns whether it was newly added.
    pub fn insert(&mut self, cpu: usize) -> bool {
        self.0.insert(cpu)
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        self.0.contains(&cpu)
    }

    /// The number of CPUs in the set.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The CPU ids, in ascending order.
    pub fn iter(&self) -> Copied<btree_set::Iter<'_, usize>> {
        self.0.iter().copied()
    }

    /// The CPUs in both `self` and `other`.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }
}

impl FromIterator<usize> for CpuSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> CpuSet {
        CpuSet(iter.into_iter().collect())
    }
}

impl Extend<usize> for CpuSet {
    fn extend<I: IntoIterator<Item = usize>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl<'a> IntoIterator for &'a CpuSet {
    type Item = usize;
    type IntoIter = Copied<btree_set::Iter<'a, usize>>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl IntoIterator for CpuSet {
    type Item = usize;
    type IntoIter = btree_set::IntoIter<usize>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl fmt::Display for CpuSet {
    /// Writes the kernel list form: ascending, runs of two or more
    /// consecutive ids as `a-b`, separated by commas; the empty set is `""`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids = self.iter().peekable();
        let mut first = true;
        while let Some(start) = ids.next() {
            let mut end = start;
            while let Some(&next) = ids.peek() {
                if end.checked_add(1) != Some(next) {
                    break;
                }
                end = next;
                ids.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl FromStr for CpuSet {
    type Err = TopologyError;

    fn from_str(s: &str) -> Result<CpuSet, TopologyError> {
        parse_cpu_list(s)
    }
}

/// Parses the kernel's CPU list format, e.g. `"0-3,8,10-11\n"`.
///
/// Surrounding whitespace (including the trailing newline sysfs files end
/// with) and whitespace around elements and range bounds is ignored; an
/// empty or all-whitespace string is the empty set. Overlapping elements are
/// merged.
///
/// # Errors
///
/// [`TopologyError::InvalidCpuList`] for an empty element (`"1,,2"`, `"1,"`),
/// a non-number (`"a"`, `"-1"`, `"+1"`), a reversed range (`"3-1"`), a
/// stride (`"0-7:2"`) or an id above [`MAX_CPU_ID`].
pub fn parse_cpu_list(input: &str) -> Result<CpuSet, TopologyError> {
    let mut set = BTreeSet::new();
    let trimmed = input.trim();
    if trimmed.is_empty() {
        return Ok(CpuSet(set));
    }
    for element in trimmed.split(',') {
        let element = element.trim();
        if element.is_empty() {
            return Err(invalid(input, "empty element".to_owned()));
        }
        let (lo, hi) = match element.split_once('-') {
            Some((lo, hi)) => (parse_id(input, lo)?, parse_id(input, hi)?),
            None => {
                let id = parse_id(input, element)?;
                (id, id)
            }
        };
        if lo > hi {
            return Err(invalid(input, format!("range {lo}-{hi} is reversed")));
        }
        set.extend(lo..=hi);
    }
    Ok(CpuSet(set))
}

fn parse_id(input: &str, text: &str) -> Result<usize, TopologyError> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(input, format!("{text:?} is not a CPU number")));
    }
    match text.parse::<usize>() {
        Ok(id) if id <= MAX_CPU_ID => Ok(id),
        _ => Err(invalid(
            input,
            format!("CPU {text} is above the maximum {MAX_CPU_ID}"),
        )),
    }
}

fn invalid(input: &str, detail: String) -> TopologyError {
    TopologyError::InvalidCpuList {
        input: input.to_owned(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(s: &str) -> Vec<usize> {
        parse_cpu_list(s).unwrap().iter().collect()
    }

    #[test]
    fn parses_typical_lists() {
        assert_eq!(ids("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(ids("0"), vec![0]);
        assert_eq!(ids("5-5"), vec![5]);
        assert_eq!(ids(" 1 , 3 - 4 \n"), vec![1, 3, 4]);
        assert_eq!(ids("3,1,2,1-2"), vec![1, 2, 3]);
    }

    #[test]
    fn empty_and_whitespace_are_empty_sets() {
        assert!(parse_cpu_list("").unwrap().is_empty());
        assert!(parse_cpu_list("\n").unwrap().is_empty());
        assert!(parse_cpu_list(" \t\n ").unwrap().is_empty());
    }

    #[test]
    fn rejects_malformed_lists() {
        for bad in [
            ",",
            "1,",
            ",1",
            "1,,2",
            "a",
            "1-",
            "-1",
            "1-2-3",
            "3-1",
            "+1",
            "0-7:2",
            "1.5",
            "0x1",
            "1 2",
            "99999999999999999999999",
            "0-65536",
        ] {
            match parse_cpu_list(bad) {
                Err(TopologyError::InvalidCpuList { input, .. }) => assert_eq!(input, bad),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn accepts_max_id() {
        assert_eq!(ids("65535"), vec![MAX_CPU_ID]);
    }

    #[test]
    fn displays_list_form() {
        let set: CpuSet = [0, 1, 2, 3, 8, 10, 11].into_iter().collect();
        assert_eq!(set.to_string(), "0-3,8,10-11");
        assert_eq!(CpuSet::new().to_string(), "");
        let set: CpuSet = [usize::MAX - 1, usize::MAX].into_iter().collect();
        assert_eq!(
            set.to_string(),
            format!("{}-{}", usize::MAX - 1, usize::MAX)
        );
    }

    #[test]
    fn display_round_trips() {
        // A small deterministic LCG: a property-style check without proptest.
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..500 {
            let mut set = CpuSet::new();
            for _ in 0..(state % 40) {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                set.insert(((state >> 33) % 64) as usize);
            }
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let text = set.to_string();
            assert_eq!(parse_cpu_list(&text).unwrap(), set, "{text}");
            assert_eq!(text.parse::<CpuSet>().unwrap(), set);
        }
    }

    #[test]
    fn set_operations() {
        let mut set = CpuSet::new();
        assert!(set.insert(4));
        assert!(!set.insert(4));
        set.extend([1, 2]);
        assert!(set.contains(4) && !set.contains(3));
        assert_eq!(set.len(), 3);
        let other: CpuSet = [2, 4, 9].into_iter().collect();
        assert_eq!(set.intersection(&other).to_string(), "2,4");
        assert_eq!((&set).into_iter().sum::<usize>(), 7);
        assert_eq!(set.into_iter().collect::<Vec<_>>(), vec![1, 2, 4]);
    }
}
