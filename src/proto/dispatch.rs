//! The owner's dispatch of one transfer onto lanes: which chunks, on which lanes, in which
//! order, and the shared stripes of a large write. Pure: the caller picks the home lane and
//! the generation and hands the resulting work to its lanes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::access::AccessKey;
use super::codes;
use super::frame::{ChunkHead, Op};
use super::layout::{self, Layout};
use super::limits::MAX_CHUNKS_PER_TRANSFER;
use super::plan;

/// One transfer as its owner names it on lanes and in reports: the owner shard, the uid and
/// the generation the owner gave it (uids can repeat after a transfer ended; generations
/// never do on one owner).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransferRef {
    /// The shard that owns the transfer (in any numbering the caller chooses).
    pub owner: usize,
    /// The transfer's uid.
    pub uid: u64,
    /// The owner's generation for it.
    pub gen: u64,
}

/// One chunk to send: the frame's fields except the lane-local tag, and its pieces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkSpec {
    /// Read or write.
    pub op: Op,
    /// Its index in the transfer.
    pub chunk: u32,
    /// Chunks in the transfer.
    pub n_chunks: u32,
    /// The target's region.
    pub mem_id: u32,
    /// Its access key (from the remote `MemoryDesc`).
    pub access_key: AccessKey,
    /// Whether the target's region is GPU memory (a same-host sender offers its own GPU
    /// memory as device parts only then).
    pub remote_device: bool,
    /// Bounds of every remote byte the transfer touches.
    pub extent: (u64, u64),
    /// The lane the target joins the transfer's chunks on (0 for a single chunk).
    pub join_lane: u16,
    /// Local and remote ranges, in payload order.
    pub pieces: Layout,
    /// Whether it is the whole transfer.
    pub final_: bool,
}

impl ChunkSpec {
    /// Its frame header with `tag` for transfer `uid`.
    pub fn head(&self, tag: u64, uid: u64) -> ChunkHead {
        ChunkHead {
            tag,
            uid,
            chunk: self.chunk,
            n_chunks: self.n_chunks,
            mem_id: self.mem_id,
            access_key: self.access_key,
            extent: self.extent,
            join_lane: self.join_lane,
        }
    }
}

/// FINISH's fields except the tag and uid: the verdict that ends a transfer at the target
/// when one of its chunks never left, or (`fence`) one of the FINISHes that end a write
/// failed early, one on each lane that carried its chunks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinishSpec {
    /// Read or write.
    pub op: Op,
    /// Chunks in the transfer.
    pub n_chunks: u32,
    /// Its total bytes.
    pub total: u64,
    /// The failure.
    pub code: u32,
    /// Its message.
    pub msg: String,
    /// Whether it fences a failed write on its lane ([`super::lane::LaneBook::fence`]): its
    /// COMPLETE says every chunk sent before it on the lane is placed or dropped, and is
    /// reported as [`super::lane::Report::Fenced`].
    pub fence: bool,
}

/// What a lane is asked to send. `L` is the caller's handle on the local memory.
#[derive(Debug)]
pub enum Work<L> {
    /// One chunk, from or into `local`.
    Chunk(ChunkSpec, L),
    /// FINISH.
    Finish(FinishSpec),
    /// Take stripes of a write from its shared list, one after another, until none is left.
    Shared(Arc<SharedStripes>, L),
}

/// Work for a lane with the transfer it belongs to.
#[derive(Debug)]
pub struct Item<L> {
    /// The transfer.
    pub to: TransferRef,
    /// What to send.
    pub work: Work<L>,
}

/// Chunks `first..first + stripes.len()` of a striped write, taken one at a time by the
/// lanes that hold a [`Work::Shared`] item for it, so a slow lane sends fewer of them and
/// the transfer ends with its fastest lanes. Which lane carries which chunk does not matter
/// to the target: every chunk names the join lane, and only chunk 0 must ride it (it is
/// dealt to the home lane directly, never shared).
#[derive(Debug)]
pub struct SharedStripes {
    next: AtomicUsize,
    cancelled: AtomicBool,
    first: u32,
    n_chunks: u32,
    mem_id: u32,
    access_key: AccessKey,
    remote_device: bool,
    extent: (u64, u64),
    join_lane: u16,
    stripes: Box<[Layout]>,
}

impl SharedStripes {
    /// The stripes `first..` of a write of `n_chunks` chunks into `target`: the region's id,
    /// its access key, whether it is GPU memory, and the transfer's extent.
    pub fn new(
        first: u32,
        n_chunks: u32,
        target: (u32, AccessKey, bool, (u64, u64)),
        join_lane: u16,
        stripes: Vec<Layout>,
    ) -> Self {
        debug_assert!(first >= 1 && first as usize + stripes.len() == n_chunks as usize);
        Self {
            next: AtomicUsize::new(0),
            cancelled: AtomicBool::new(false),
            first,
            n_chunks,
            mem_id: target.0,
            access_key: target.1,
            remote_device: target.2,
            extent: target.3,
            join_lane,
            stripes: stripes.into_boxed_slice(),
        }
    }

    /// The next stripe nobody has taken yet; `None` once all are taken or the transfer
    /// ended.
    pub fn take(&self) -> Option<ChunkSpec> {
        if self.cancelled.load(Ordering::Relaxed) {
            return None;
        }
        // Relaxed: each index is handed out once; the stripes themselves never change.
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let pieces = self.stripes.get(i)?.clone();
        Some(ChunkSpec {
            op: Op::Write,
            chunk: self.first + i as u32,
            n_chunks: self.n_chunks,
            mem_id: self.mem_id,
            access_key: self.access_key,
            remote_device: self.remote_device,
            extent: self.extent,
            join_lane: self.join_lane,
            pieces,
            final_: false,
        })
    }

    /// The transfer ended (failed or timed out): no lane takes another stripe.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }
}

/// How the owner cuts transfers (from the backend's configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatchParams {
    /// Lanes per peer.
    pub n_lanes: u16,
    /// Transfers of at least this many bytes are striped over every lane.
    pub striping_threshold: u64,
    /// Largest chunk.
    pub chunk_bytes: u64,
    /// Whether a large striped write shares its stripes between its lanes.
    pub share_stripes: bool,
}

/// A transfer to dispatch.
#[derive(Debug)]
pub struct Request {
    /// Read or write.
    pub op: Op,
    /// The target's region.
    pub mem_id: u32,
    /// Its access key, carried by every chunk.
    pub access_key: AccessKey,
    /// Whether the target's region is GPU memory.
    pub remote_device: bool,
    /// Checked segments.
    pub layout: Layout,
    /// Total bytes.
    pub total: u64,
}

/// A dispatched transfer: the work of each lane it uses.
#[derive(Debug)]
pub struct Plan<L> {
    /// Chunks in the transfer.
    pub n_chunks: u32,
    /// `(lane, items)` for every lane with work, by lane.
    pub lanes: Vec<(u16, Vec<Item<L>>)>,
    /// The shared stripes of a write that shares them, to cancel when it ends early.
    pub stripes: Option<Arc<SharedStripes>>,
}

/// Why a transfer cannot be dispatched: a wire code and its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    /// Wire status code.
    pub code: u32,
    /// The reason.
    pub msg: &'static str,
}

/// The home lane of the next transfer an owner shard sends to a peer: one of the lanes the
/// shard runs (`shard`, `shard + n_shards`, … below `n_lanes`, lane `l` running on shard
/// `l % n_shards`), round robin by `cursor`. A single-lane transfer uses only its home lane,
/// so it never leaves its owner's core; a striped one starts there. `None` when the shard
/// runs no lane.
pub fn home_lane(shard: usize, n_shards: usize, n_lanes: u16, cursor: usize) -> Option<u16> {
    let n_shards = n_shards.max(1);
    let n_own = (n_lanes as usize).saturating_sub(shard).div_ceil(n_shards);
    (n_own > 0).then(|| (shard + (cursor % n_own) * n_shards) as u16)
}

/// Cut `req` into chunks on lanes starting at `home`. `Ok(None)`: nothing to move. Chunk 0
/// rides the home lane, which the target joins the chunks on; a striped transfer deals its
/// chunks round robin from there, and a write that shares its stripes deals chunk 0 to the
/// home lane and a [`Work::Shared`] item to the home lane and the lanes after it.
pub fn dispatch<L: Clone>(
    req: Request,
    params: DispatchParams,
    home: u16,
    to: TransferRef,
    local: &L,
) -> Result<Option<Plan<L>>, Refused> {
    let n_lanes = params.n_lanes.max(1);
    let striped = n_lanes > 1 && req.total >= params.striping_threshold;
    if striped && req.layout.destination_overlaps(req.op == Op::Write) {
        return Err(Refused {
            code: codes::ERR_INVALID_ARGS,
            msg: "overlapping destination segments cannot be striped",
        });
    }
    let shared = striped
        && req.op == Op::Write
        && params.share_stripes
        && plan::shares_stripes(req.total, n_lanes as u64, params.chunk_bytes);
    let chunk_bytes = if striped {
        layout::layout_stripe(&req.layout, n_lanes as u64, params.chunk_bytes)
    } else {
        params.chunk_bytes
    };
    let extent = req.layout.remote_extent();
    // A strided batch stays strided down to the frame; a list is cut as a list.
    let mut chunks = layout::layout_chunks(req.layout, chunk_bytes);
    if chunks.is_empty() {
        return Ok(None);
    }
    const _: () = assert!(
        MAX_CHUNKS_PER_TRANSFER == 1 << 20,
        "update the message below"
    );
    // A target joins at most MAX_CHUNKS_PER_TRANSFER chunks (it closes a connection whose
    // chunk claims more): refuse here instead.
    let n_chunks = match u32::try_from(chunks.len()) {
        Ok(n) if n <= MAX_CHUNKS_PER_TRANSFER => n,
        _ => {
            return Err(Refused {
                code: codes::ERR_INVALID_ARGS,
                msg: "transfer has more than 1048576 chunks (MAX_CHUNKS_PER_TRANSFER): \
                      raise chunk_bytes or split it",
            })
        }
    };
    let final_ = n_chunks == 1;
    let mut per_lane: Vec<Vec<Item<L>>> = (0..n_lanes).map(|_| Vec::new()).collect();
    let mut stripes = None;
    if shared && !final_ {
        // Chunk 0 rides the home lane as below; the rest go into one shared list, and the
        // home lane and the lanes after it (as many as there are chunks) take from it.
        let rest = chunks.split_off(1);
        let list = Arc::new(SharedStripes::new(
            1,
            n_chunks,
            (req.mem_id, req.access_key, req.remote_device, extent),
            home,
            rest,
        ));
        for j in 0..(n_lanes as usize).min(n_chunks as usize) {
            per_lane[(home as usize + j) % n_lanes as usize].push(Item {
                to,
                work: Work::Shared(list.clone(), local.clone()),
            });
        }
        stripes = Some(list);
    }
    for (i, pieces) in chunks.into_iter().enumerate() {
        let lane = if striped {
            (home as usize + i) % n_lanes as usize
        } else {
            home as usize
        };
        let spec = ChunkSpec {
            op: req.op,
            chunk: i as u32,
            n_chunks,
            mem_id: req.mem_id,
            access_key: req.access_key,
            remote_device: req.remote_device,
            extent,
            join_lane: if final_ { 0 } else { home },
            pieces,
            final_,
        };
        let item = Item {
            to,
            work: Work::Chunk(spec, local.clone()),
        };
        // Chunk 0 of a shared-stripe write goes ahead of the home lane's shared item.
        let at = if stripes.is_some() {
            0
        } else {
            per_lane[lane].len()
        };
        per_lane[lane].insert(at, item);
    }
    let lanes = per_lane
        .into_iter()
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .map(|(l, v)| (l as u16, v))
        .collect();
    Ok(Some(Plan {
        n_chunks,
        lanes,
        stripes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::plan::Piece;

    fn list(n: u64, len: u64) -> Layout {
        Layout::List(
            (0..n)
                .map(|i| Piece {
                    local: i * len,
                    remote: i * len,
                    len,
                })
                .collect(),
        )
    }

    fn params(n_lanes: u16, share: bool) -> DispatchParams {
        DispatchParams {
            n_lanes,
            striping_threshold: 1 << 20,
            chunk_bytes: 1 << 20,
            share_stripes: share,
        }
    }

    const KEY: AccessKey = AccessKey::from_bytes([5; 16]);

    const TO: TransferRef = TransferRef {
        owner: 0,
        uid: 9,
        gen: 1,
    };

    fn req(op: Op, layout: Layout) -> Request {
        let total = layout.total_bytes();
        Request {
            op,
            mem_id: 7,
            access_key: KEY,
            remote_device: false,
            layout,
            total,
        }
    }

    fn chunks_of(items: &[Item<()>]) -> Vec<u32> {
        items
            .iter()
            .filter_map(|i| match &i.work {
                Work::Chunk(c, _) => Some(c.chunk),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn home_lanes_are_the_owners_own_round_robin() {
        // 8 lanes on 3 shards: shard 1 runs lanes 1, 4 and 7.
        let got: Vec<_> = (0..4).map(|c| home_lane(1, 3, 8, c)).collect();
        assert_eq!(got, [Some(1), Some(4), Some(7), Some(1)]);
        assert_eq!(home_lane(5, 8, 4, 0), None);
        assert_eq!(home_lane(0, 0, 1, 3), Some(0));
    }

    #[test]
    fn transfers_of_more_chunks_than_a_target_joins_are_refused_here() {
        let one_lane = |chunk_bytes| DispatchParams {
            chunk_bytes,
            ..params(1, false)
        };
        let piece = |local, remote, len| Piece { local, remote, len };
        // A read of one remote byte into three places, one byte per chunk: more chunks than
        // its extent has bytes is legal.
        let read = Layout::List(vec![piece(0, 0, 1), piece(1, 0, 1), piece(2, 0, 1)]);
        let p = dispatch(req(Op::Read, read), one_lane(1), 0, TO, &());
        assert_eq!(p.unwrap().unwrap().n_chunks, 3);
        // More chunks than a target joins.
        let n = u64::from(MAX_CHUNKS_PER_TRANSFER);
        let big = Layout::List(vec![piece(0, 0, n + 1)]);
        let r = dispatch(req(Op::Write, big), one_lane(1), 0, TO, &()).unwrap_err();
        assert_eq!(r.code, codes::ERR_INVALID_ARGS);
        let most = Layout::List(vec![piece(0, 0, n)]);
        let p = dispatch(req(Op::Write, most), one_lane(1), 0, TO, &());
        assert_eq!(p.unwrap().unwrap().n_chunks, MAX_CHUNKS_PER_TRANSFER);
    }

    #[test]
    fn a_small_transfer_is_one_final_chunk_on_its_home_lane() {
        let p = dispatch(req(Op::Write, list(4, 64)), params(4, true), 2, TO, &())
            .unwrap()
            .unwrap();
        assert_eq!(p.n_chunks, 1);
        assert_eq!(p.lanes.len(), 1);
        let (lane, items) = &p.lanes[0];
        assert_eq!(*lane, 2);
        match &items[0].work {
            Work::Chunk(c, ()) => {
                assert!(c.final_);
                assert_eq!((c.join_lane, c.extent), (0, (0, 256)));
                assert_eq!((c.mem_id, c.access_key), (7, KEY));
                assert_eq!(c.head(1, 9).access_key, KEY);
            }
            w => panic!("{w:?}"),
        }
    }

    #[test]
    fn a_striped_read_deals_chunks_round_robin_from_home() {
        let p = dispatch(req(Op::Read, list(8, 1 << 20)), params(4, true), 3, TO, &())
            .unwrap()
            .unwrap();
        assert_eq!(p.n_chunks, 8);
        assert!(p.stripes.is_none());
        let by_lane: Vec<(u16, Vec<u32>)> =
            p.lanes.iter().map(|(l, v)| (*l, chunks_of(v))).collect();
        assert_eq!(
            by_lane,
            [
                (0, vec![1, 5]),
                (1, vec![2, 6]),
                (2, vec![3, 7]),
                (3, vec![0, 4])
            ]
        );
        for (_, items) in &p.lanes {
            for i in items {
                if let Work::Chunk(c, _) = &i.work {
                    assert_eq!((c.join_lane, c.final_), (3, false));
                }
            }
        }
    }

    #[test]
    fn a_shared_stripe_write_puts_chunk_zero_first_on_home() {
        let p = dispatch(
            req(Op::Write, list(16, 1 << 20)),
            params(4, true),
            1,
            TO,
            &(),
        )
        .unwrap()
        .unwrap();
        let stripes = p.stripes.clone().expect("shares its stripes");
        let home = &p.lanes.iter().find(|(l, _)| *l == 1).unwrap().1;
        assert!(matches!(&home[0].work, Work::Chunk(c, _) if c.chunk == 0));
        assert!(matches!(&home[1].work, Work::Shared(..)));
        let shared: usize = p
            .lanes
            .iter()
            .map(|(_, v)| {
                v.iter()
                    .filter(|i| matches!(i.work, Work::Shared(..)))
                    .count()
            })
            .sum();
        assert_eq!(shared, 4);
        let mut taken = Vec::new();
        while let Some(c) = stripes.take() {
            assert_eq!(
                (c.mem_id, c.access_key),
                (7, KEY),
                "every stripe carries the key"
            );
            taken.push(c.chunk);
        }
        assert_eq!(taken.len() as u32 + 1, p.n_chunks);
        assert_eq!(taken[0], 1);
    }

    #[test]
    fn overlapping_destinations_are_not_striped() {
        let layout = Layout::List(vec![
            Piece {
                local: 0,
                remote: 0,
                len: 1 << 20,
            },
            Piece {
                local: 1 << 20,
                remote: 0,
                len: 1 << 20,
            },
        ]);
        let err = dispatch(req(Op::Write, layout), params(2, true), 0, TO, &()).unwrap_err();
        assert_eq!(err.code, codes::ERR_INVALID_ARGS);
    }

    #[test]
    fn nothing_to_move_is_no_plan() {
        let p = dispatch(req(Op::Read, list(0, 0)), params(2, true), 0, TO, &()).unwrap();
        assert!(p.is_none());
    }

    #[test]
    fn nothing_is_taken_after_cancel() {
        let s = SharedStripes::new(
            1,
            3,
            (7, KEY, false, (0, 48)),
            0,
            vec![list(1, 16), list(1, 16)],
        );
        assert_eq!(s.take().map(|c| c.chunk), Some(1));
        s.cancel();
        assert!(s.take().is_none());
    }
}
