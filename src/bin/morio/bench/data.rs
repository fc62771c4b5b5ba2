//! Buffer contents for the benchmark: segment layouts (contiguous or MORI's stride of
//! size+1, in order or scattered), allocation without aborting, seeded scrambling, and xxh3
//! over a list of segments.

use std::sync::Arc;

use anyhow::{bail, Context};
use morio::{IoEngine, RegisteredBuffer};

use super::args::{Args, GpuRuntimeKind, MemType};
use xxhash_rust::xxh3::Xxh3;

/// Bytes copied per step when scrambling or hashing.
const STEP: usize = 1 << 20;

/// Where a row's transfers lie in the buffers (the same offsets on both sides).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Slots of `size` bytes back to back (`--batch-contiguous`) instead of MORI's stride of
    /// `size + 1`.
    pub contiguous: bool,
    /// The slots in a seeded shuffled order (`--batch-scattered`), as a paged KV cache's
    /// block table: never in their own order, and no [`RUN_ROWS`] consecutive transfers
    /// rising by a constant pitch (which the engine would copy as one 2D copy).
    pub scattered: bool,
}

/// Offset of transfer `i` of a row, for every `i < batch`.
pub fn offsets(size: usize, batch: usize, layout: Layout) -> Vec<usize> {
    let stride = if layout.contiguous { size } else { size + 1 };
    let mut v: Vec<usize> = (0..batch).map(|i| i * stride).collect();
    if layout.scattered {
        scatter(&mut v, 0x5EED ^ batch as u64);
    }
    v
}

/// Consecutive segments at one rising pitch that GPU copies take as one 2D copy (the
/// engine's `gpu::strided::MIN_ROWS`): a scattered layout holds no such run.
pub const RUN_ROWS: usize = 4;

/// Shuffle `v` (ascending) until it is neither in its own order nor holds a run of
/// [`RUN_ROWS`]; the first shuffle is kept where it qualifies, so layouts of larger batches
/// are those of earlier sessions. Gives up after 64 shuffles (never needed from 2 slots on).
fn scatter(v: &mut [usize], seed: u64) {
    let sorted = v.to_vec();
    let mut next = splitmix(seed);
    for _ in 0..64 {
        shuffle(v, &mut next);
        if v.len() < 2 || (v != sorted.as_slice() && !has_run(v)) {
            return;
        }
    }
}

/// Whether `v` holds [`RUN_ROWS`] consecutive values rising by one pitch.
fn has_run(v: &[usize]) -> bool {
    v.windows(RUN_ROWS).any(|w| {
        w[1] > w[0]
            && w.windows(2)
                .all(|p| p[1] > p[0] && p[1] - p[0] == w[1] - w[0])
    })
}

/// A splitmix64 stream from `seed`.
fn splitmix(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Fisher–Yates with a splitmix64 stream: the same order for the same seed on every run and
/// on both sides, without a generator crate's version deciding it.
fn shuffle(v: &mut [usize], next: &mut impl FnMut() -> u64) {
    for i in (1..v.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

/// The row's segments as (offset, length) pairs, the same on both sides.
pub fn segments(size: usize, batch: usize, layout: Layout) -> Vec<(u64, u64)> {
    offsets(size, batch, layout)
        .into_iter()
        .map(|o| (o as u64, size as u64))
        .collect()
}

/// Bytes from 0 to the end of the row's furthest segment.
pub fn extent(size: usize, batch: usize, layout: Layout) -> usize {
    offsets(size, batch, layout)
        .into_iter()
        .max()
        .map_or(0, |o| o + size)
}

/// A zeroed buffer of `len` bytes, or an error (never an abort) if it cannot be had.
pub fn alloc(len: usize) -> anyhow::Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .with_context(|| format!("cannot allocate a {len}-byte buffer"))?;
    v.resize(len, 0);
    Ok(v)
}

/// This side's registered buffer of `len` bytes, in host or GPU memory.
pub fn side_buffer(
    engine: &IoEngine,
    a: &Args,
    mem: MemType,
    len: usize,
) -> anyhow::Result<RegisteredBuffer> {
    match mem {
        MemType::Cpu => Ok(engine.register_buffer(alloc(len)?)?),
        MemType::Gpu => {
            if a.gpu_runtime == GpuRuntimeKind::Fake {
                engine.set_gpu_runtime(Arc::new(morio::gpu::fake::FakeGpu::new(1)))?;
            }
            engine
                .alloc_gpu_buffer(a.gpu_device, len)
                .with_context(|| format!("{len} bytes on GPU {}", a.gpu_device))
        }
    }
}

/// Pinned GPU staging bytes the engine holds, and the most it had in use at once.
pub fn staging(engine: &IoEngine) -> (u64, u64) {
    engine.stats().map_or((0, 0), |s| {
        let t = s.total();
        (t.gpu_staging_bytes as u64, t.gpu_staging_peak_bytes as u64)
    })
}

/// Fill `buf[..len]` with bytes that depend only on `seed` (xorshift64*).
pub fn scramble(buf: &RegisteredBuffer, seed: u64, len: usize) -> anyhow::Result<()> {
    if len > buf.len() {
        bail!("scramble of {len} bytes, buffer has {}", buf.len());
    }
    let mut x = seed | 1;
    let mut scratch = vec![0u8; STEP.min(len)];
    let mut off = 0;
    while off < len {
        let n = STEP.min(len - off);
        for c in scratch[..n].chunks_mut(8) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
        if !buf.write_at(off, &scratch[..n]) {
            bail!("scramble out of range at {off}");
        }
        off += n;
    }
    Ok(())
}

/// xxh3-64 of the concatenated segments, in order.
pub fn hash_segments(buf: &RegisteredBuffer, segs: &[(u64, u64)]) -> anyhow::Result<u64> {
    let mut h = Xxh3::new();
    let mut scratch = Vec::new();
    for &(off, len) in segs {
        let end = off.checked_add(len).filter(|&e| e <= buf.len() as u64);
        if end.is_none() {
            bail!(
                "segment ({off}, {len}) is outside the {}-byte buffer",
                buf.len()
            );
        }
        let (mut o, end) = (off as usize, (off + len) as usize);
        while o < end {
            let n = STEP.min(end - o);
            scratch.resize(n, 0);
            if !buf.read_at(o, &mut scratch) {
                bail!("hash out of range at {o}");
            }
            h.update(&scratch);
            o += n;
        }
    }
    Ok(h.digest())
}

#[cfg(test)]
mod tests {
    use super::*;

    const STRIDED: Layout = Layout {
        contiguous: false,
        scattered: false,
    };
    const CONTIG: Layout = Layout {
        contiguous: true,
        scattered: false,
    };

    #[test]
    fn layouts() {
        assert_eq!(offsets(8, 3, STRIDED), [0, 9, 18]);
        assert_eq!(offsets(8, 3, CONTIG), [0, 8, 16]);
        assert_eq!(extent(8, 3, STRIDED), 26);
        assert_eq!(extent(8, 3, CONTIG), 24);
        assert_eq!(segments(4, 2, STRIDED), [(0, 4), (5, 4)]);
    }

    #[test]
    fn scattered_layouts_are_the_same_slots_in_an_irregular_repeatable_order() {
        let scat = Layout {
            scattered: true,
            ..STRIDED
        };
        let o = offsets(8, 256, scat);
        assert_eq!(o, offsets(8, 256, scat), "the same order every time");
        let mut sorted = o.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            offsets(8, 256, STRIDED),
            "the strided layout's slots"
        );
        assert_eq!(extent(8, 256, scat), extent(8, 256, STRIDED));
        // Irregular: no run of four transfers at one pitch, which a 2D copy would take.
        let pitched = o.windows(4).filter(|w| {
            let d = |a: usize, b: usize| b as i64 - a as i64;
            d(w[0], w[1]) == d(w[1], w[2]) && d(w[1], w[2]) == d(w[2], w[3])
        });
        assert_eq!(pitched.count(), 0);
        // The order of sessions before small batches were reshuffled (their rows compare).
        assert_eq!(o[..4], [216 * 9, 178 * 9, 71 * 9, 169 * 9]);
    }

    #[test]
    fn small_scattered_batches_are_scattered_too() {
        let scat = Layout {
            scattered: true,
            ..STRIDED
        };
        // One shuffle alone left 2 and 4 slots in their own order.
        for batch in 2..=300 {
            let o = offsets(8, batch, scat);
            let strided = offsets(8, batch, STRIDED);
            assert_ne!(o, strided, "{batch} slots in their own order");
            assert!(!has_run(&o), "{batch} slots: a 2D run in {o:?}");
            let mut sorted = o.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, strided);
        }
        assert_eq!(offsets(8, 1, scat), [0]);
        assert!(has_run(&[0, 9, 18, 27]) && has_run(&[5, 0, 3, 6, 9]));
        assert!(!has_run(&[27, 18, 9, 0]) && !has_run(&[0, 9, 18, 28]));
    }
}
