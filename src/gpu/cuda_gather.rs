//! CUDA gather: a list of small host ↔ device copies at irregular places (a paged KV cache's
//! blocks) moved by one kernel launch instead of one copy-engine operation per segment. The
//! kernel (hand-written PTX, JIT-compiled by the driver once per context) reads its list from a
//! pinned table that stays untouched until the fence after the launch completes.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::result as cu;
use cudarc::driver::sys;

use super::BatchCopy;

/// Segments one launch's table holds (24 bytes each).
pub(super) const TABLE_ENTRIES: usize = 1024;
/// Tables per stream: launches whose fences have not completed yet. A gather that finds too
/// few free goes to the copy engines instead.
const TABLES: usize = 32;
/// Thread blocks per launch at most (each walks segments `blockIdx.x`, `+ gridDim.x`, …).
const MAX_BLOCKS: u32 = 256;
/// Threads per block: 16 bytes each per step where a segment is 16-byte aligned.
const THREADS: u32 = 256;

/// `morio_gather(table, n)`: block b copies segments b, b + gridDim.x, … of `table`
/// (`{src, dst, len}` as three u64) with its threads side by side: 16 bytes a thread (two
/// loads in flight) where source, destination and length are 16-byte aligned, 4 where 4-byte
/// aligned, else 1 (four loads in flight: host memory answers a load in about a microsecond).
/// Thread 0 reads each entry (one trip over PCIe, not one per warp) and hands it to the
/// block through shared memory. Host memory is reached at its own address (unified
/// addressing, pinned memory).
const PTX: &str = r#"
.version 6.4
.target sm_50
.address_size 64

.visible .entry morio_gather(
	.param .u64 p_table,
	.param .u32 p_n
)
{
	.reg .pred %p<8>;
	.reg .b32 %r<16>;
	.reg .b64 %rd<32>;
	.shared .align 8 .b64 s_seg[3];

	ld.param.u64 %rd1, [p_table];
	cvta.to.global.u64 %rd1, %rd1;
	ld.param.u32 %r1, [p_n];
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %nctaid.x;
	mov.u32 %r4, %tid.x;
	mov.u32 %r5, %ntid.x;
	cvt.u64.u32 %rd2, %r4;
	cvt.u64.u32 %rd3, %r5;
SEG:
	setp.ge.u32 %p1, %r2, %r1;
	@%p1 bra DONE;
	setp.ne.u32 %p7, %r4, 0;
	@%p7 bra ENTRY;
	mul.wide.u32 %rd4, %r2, 24;
	add.s64 %rd5, %rd1, %rd4;
	ld.global.u64 %rd6, [%rd5];
	ld.global.u64 %rd7, [%rd5+8];
	ld.global.u64 %rd8, [%rd5+16];
	st.shared.u64 [s_seg], %rd6;
	st.shared.u64 [s_seg+8], %rd7;
	st.shared.u64 [s_seg+16], %rd8;
ENTRY:
	bar.sync 0;
	ld.shared.u64 %rd6, [s_seg];
	ld.shared.u64 %rd7, [s_seg+8];
	ld.shared.u64 %rd8, [s_seg+16];
	bar.sync 0;
	cvta.to.global.u64 %rd6, %rd6;
	cvta.to.global.u64 %rd7, %rd7;
	or.b64 %rd9, %rd6, %rd7;
	or.b64 %rd9, %rd9, %rd8;
	and.b64 %rd10, %rd9, 15;
	setp.ne.s64 %p2, %rd10, 0;
	@%p2 bra W4;
	shl.b64 %rd11, %rd2, 4;
	shl.b64 %rd12, %rd3, 4;
	shl.b64 %rd25, %rd12, 1;
L16:
	setp.ge.u64 %p3, %rd11, %rd8;
	@%p3 bra NEXT;
	add.s64 %rd16, %rd11, %rd12;
	setp.lt.u64 %p4, %rd16, %rd8;
	add.s64 %rd13, %rd6, %rd11;
	add.s64 %rd19, %rd6, %rd16;
	ld.global.v4.u32 {%r6, %r7, %r8, %r9}, [%rd13];
	@%p4 ld.global.v4.u32 {%r10, %r11, %r12, %r13}, [%rd19];
	add.s64 %rd14, %rd7, %rd11;
	add.s64 %rd22, %rd7, %rd16;
	st.global.v4.u32 [%rd14], {%r6, %r7, %r8, %r9};
	@%p4 st.global.v4.u32 [%rd22], {%r10, %r11, %r12, %r13};
	add.s64 %rd11, %rd11, %rd25;
	bra.uni L16;
W4:
	and.b64 %rd10, %rd9, 3;
	setp.ne.s64 %p2, %rd10, 0;
	@%p2 bra W1;
	shl.b64 %rd11, %rd2, 2;
	shl.b64 %rd12, %rd3, 2;
L4:
	setp.ge.u64 %p3, %rd11, %rd8;
	@%p3 bra NEXT;
	add.s64 %rd13, %rd6, %rd11;
	add.s64 %rd14, %rd7, %rd11;
	ld.global.u32 %r6, [%rd13];
	st.global.u32 [%rd14], %r6;
	add.s64 %rd11, %rd11, %rd12;
	bra.uni L4;
W1:
	mov.u64 %rd11, %rd2;
	shl.b64 %rd12, %rd3, 2;
L1:
	setp.ge.u64 %p3, %rd11, %rd8;
	@%p3 bra NEXT;
	add.s64 %rd16, %rd11, %rd3;
	add.s64 %rd17, %rd16, %rd3;
	add.s64 %rd18, %rd17, %rd3;
	setp.lt.u64 %p4, %rd16, %rd8;
	setp.lt.u64 %p5, %rd17, %rd8;
	setp.lt.u64 %p6, %rd18, %rd8;
	add.s64 %rd13, %rd6, %rd11;
	add.s64 %rd19, %rd6, %rd16;
	add.s64 %rd20, %rd6, %rd17;
	add.s64 %rd21, %rd6, %rd18;
	ld.global.u8 %r6, [%rd13];
	@%p4 ld.global.u8 %r7, [%rd19];
	@%p5 ld.global.u8 %r8, [%rd20];
	@%p6 ld.global.u8 %r9, [%rd21];
	add.s64 %rd14, %rd7, %rd11;
	add.s64 %rd22, %rd7, %rd16;
	add.s64 %rd23, %rd7, %rd17;
	add.s64 %rd24, %rd7, %rd18;
	st.global.u8 [%rd14], %r6;
	@%p4 st.global.u8 [%rd22], %r7;
	@%p5 st.global.u8 [%rd23], %r8;
	@%p6 st.global.u8 [%rd24], %r9;
	add.s64 %rd11, %rd11, %rd12;
	bra.uni L1;
NEXT:
	add.s32 %r2, %r2, %r3;
	bra.uni SEG;
DONE:
	ret;
}
"#;

/// The kernel of the context current on this thread, loaded on first use; `None` where the
/// driver refused it (logged once per context; copies then go to the copy engines).
pub(super) fn kernel(ctx: usize) -> Option<usize> {
    static LOADED: OnceLock<Mutex<HashMap<usize, Option<usize>>>> = OnceLock::new();
    let mut m = LOADED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    *m.entry(ctx).or_insert_with(|| {
        let image = std::ffi::CString::new(PTX).ok()?;
        // SAFETY: a NUL-terminated PTX image; the module lives as long as the process (one per
        // context, never unloaded).
        let r = unsafe {
            cu::module::load_data(image.as_ptr() as *const c_void).and_then(|m| {
                cu::module::get_function(m, c"morio_gather".to_owned())
            })
        };
        match r {
            Ok(f) => Some(f as usize),
            Err(e) => {
                log::info!("GPU gather kernel not loaded ({e:?}): small scattered copies use the copy engines");
                None
            }
        }
    })
}

/// A stream's gather state: the kernel and its pinned tables.
#[derive(Debug)]
pub(super) struct Gather {
    func: usize,
    arena: super::PinnedBuf,
    /// Tables not in use.
    free: RefCell<Vec<usize>>,
    /// Tables of launches no fence covers yet (the next fence takes them).
    pending: RefCell<Vec<usize>>,
}

impl Gather {
    /// The state for a stream whose context has the kernel, with its tables pinned now.
    pub(super) fn new(func: usize, arena: super::PinnedBuf) -> Rc<Self> {
        Rc::new(Self {
            func,
            arena,
            free: RefCell::new((0..TABLES).rev().collect()),
            pending: RefCell::new(Vec::new()),
        })
    }

    /// Bytes of pinned memory the tables need.
    pub(super) const ARENA_BYTES: usize = TABLES * TABLE_ENTRIES * 24;

    /// Launch `copies` on `stream` (its context current), a table each `TABLE_ENTRIES`;
    /// `None` (nothing launched) where too few tables are free.
    ///
    /// # Safety
    /// Every copy's ranges must be live memory the GPU reaches (device memory of the stream's
    /// device, pinned host memory), untouched by others until a later fence completes.
    pub(super) unsafe fn launch(
        &self,
        stream: sys::CUstream,
        copies: &[BatchCopy],
    ) -> Option<Result<(), sys::CUresult>> {
        let need = copies.len().div_ceil(TABLE_ENTRIES);
        let mut free = self.free.borrow_mut();
        if free.len() < need {
            return None;
        }
        let base = self.arena.as_slice().as_ptr() as *mut u64;
        for part in copies.chunks(TABLE_ENTRIES) {
            let t = free.pop()?;
            // SAFETY: table `t` is TABLE_ENTRIES * 3 u64 inside the arena, free (no launch
            // reads it) until it goes back to `free` after its fence completes.
            let table = unsafe { base.add(t * TABLE_ENTRIES * 3) };
            for (i, c) in part.iter().enumerate() {
                // SAFETY: `i < TABLE_ENTRIES`, inside table `t`.
                unsafe {
                    table.add(3 * i).write(c.src);
                    table.add(3 * i + 1).write(c.dst);
                    table.add(3 * i + 2).write(c.len as u64);
                }
            }
            self.pending.borrow_mut().push(t);
            let mut ptr = table as u64;
            let mut n = part.len() as u32;
            let mut params = [
                &mut ptr as *mut u64 as *mut c_void,
                &mut n as *mut u32 as *mut c_void,
            ];
            let blocks = n.min(MAX_BLOCKS);
            // SAFETY: the kernel takes (u64, u32), given here; the table is filled and
            // stays put; the copies' ranges as the caller guarantees.
            let r = unsafe {
                cu::launch_kernel(
                    self.func as sys::CUfunction,
                    (blocks, 1, 1),
                    (THREADS, 1, 1),
                    0,
                    stream,
                    &mut params,
                )
            };
            if let Err(e) = r {
                return Some(Err(e.0));
            }
        }
        Some(Ok(()))
    }

    /// The tables of launches so far, for the fence being recorded after them.
    pub(super) fn take_pending(&self) -> Vec<usize> {
        std::mem::take(&mut *self.pending.borrow_mut())
    }

    /// Tables whose launches have completed.
    pub(super) fn give_back(&self, tables: Vec<usize>) {
        self.free.borrow_mut().extend(tables);
    }
}
