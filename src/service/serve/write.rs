//! Target side: serving a WRITE chunk, and answering one into GPU memory only once its
//! copies into device memory are done, reading the next frame meanwhile when it has begun
//! to arrive.

use std::rc::Rc;

use super::place::{place, Placed};
use super::{check, respond, Link};
use crate::proto::codes;
use crate::proto::frame::Chunk;
use crate::proto::join::JoinKey;
use crate::region::SharedRegion;
use crate::service::gpu_io::{self, landed};
use crate::service::Shard;
use crate::trace;
use crate::transport::framed::{ConnError, FrameReader, FrameWriter};
use crate::transport::Rx;

/// What a served connection carries from one frame to the next.
#[derive(Default)]
pub(super) struct Turn {
    /// The last traced transfer whose answer is queued, and whether it was a join's.
    pub(super) last_uid: Option<(u64, bool)>,
    /// A WRITE chunk into GPU memory, read but not answered: its last copies into device
    /// memory run while the connection reads the next frame (which had begun to arrive), and
    /// it is answered before anything that frame brings.
    landing: Option<Landing>,
    /// The next READ chunk's first staging slot, copied out of GPU memory while the READ_DATA
    /// before it was sent (`read::copy_next`).
    pub(super) ahead: Option<crate::service::gpu_io::Ahead>,
}

impl Turn {
    /// Whether a WRITE chunk is landing, unanswered.
    pub(super) fn landing(&self) -> bool {
        self.landing.is_some()
    }
}

/// A WRITE chunk whose answer waits for its copies into device memory.
struct Landing {
    chunk: Chunk,
    final_: bool,
    payload: u64,
    /// Keeps the region alive while the copies run.
    _region: Option<SharedRegion>,
    copies: gpu_io::Landing,
    /// Counts it as being placed until it is answered.
    _placing: Option<Placing>,
}

/// A chunk of a multi-chunk WRITE counted as being placed by its shard
/// ([`crate::service::Placing`]), from its header's check until it is answered or dropped
/// with its copies settled: a FINISH of its transfer on another connection waits for that.
pub(super) struct Placing {
    shard: Rc<Shard>,
    key: JoinKey,
}

impl Placing {
    /// Count `chunk` if it is one of several (a single chunk has no FINISH to wait for it).
    fn begin(shard: &Rc<Shard>, conn: &Link, chunk: &Chunk) -> Option<Self> {
        (chunk.n_chunks > 1).then(|| {
            let key = (conn.served.peer.clone(), conn.served.instance, chunk.uid);
            shard.shared.placing.begin(shard.id, key.clone());
            Self {
                shard: shard.clone(),
                key,
            }
        })
    }
}

impl Drop for Placing {
    fn drop(&mut self) {
        self.shard.shared.placing.end(self.shard.id, &self.key);
    }
}

/// Answer the chunk still landing, if any, once its copies are done.
pub(super) async fn answer_landed(
    shard: &Rc<Shard>,
    conn: &Link,
    writer: &mut FrameWriter,
    turn: &mut Turn,
) -> Result<(), ConnError> {
    let Some(l) = turn.landing.take() else {
        return Ok(());
    };
    let (code, msg) = landed(l.copies.finish(shard).await);
    let joined = answer_write(
        shard,
        conn,
        writer,
        (&l.chunk, l.final_),
        l.payload,
        code,
        msg,
    )
    .await?;
    if trace::enabled() {
        trace::mark(l.chunk.uid, trace::stage::T_PLACED);
        turn.last_uid = Some((l.chunk.uid, joined));
    }
    Ok(())
}

/// Count a placed WRITE chunk and queue its answer; whether a join's COMPLETE was queued.
async fn answer_write(
    shard: &Rc<Shard>,
    conn: &Link,
    writer: &mut FrameWriter,
    (chunk, final_): (&Chunk, bool),
    payload: u64,
    code: u32,
    msg: String,
) -> Result<bool, ConnError> {
    if code == codes::SUCCESS {
        let mut st = shard.stats.borrow_mut();
        st.count_inbound_write(conn.counters, payload);
    }
    let r = conn
        .served
        .write_done(chunk, final_, code, msg, &shard.shared.joins);
    respond(shard, conn, writer, r).await
}

/// Serve a WRITE chunk: check, place, answer (or leave it landing in `turn`: `None`).
pub(super) async fn on_write(
    shard: &Rc<Shard>,
    conn: &Link,
    (reader, writer): (&mut FrameReader<Rx>, &mut FrameWriter),
    (chunk, final_): (Chunk, bool),
    payload: u64,
    turn: &mut Turn,
) -> Result<Option<bool>, ConnError> {
    let (region, checked) = check(shard, conn, &chunk, final_)?;
    trace::mark(chunk.uid, trace::stage::T_CHECKED);
    // Until this function returns (its copies settled, even on a lost connection) or the
    // landing it leaves is answered.
    let placing = Placing::begin(shard, conn, &chunk);
    let device = checked.is_ok() && region.as_ref().is_some_and(|r| r.device().is_some());
    // Only a chunk of the same transfer is read while the one before lands: another
    // transfer's bytes never hold up this one's answer.
    let same = turn
        .landing
        .as_ref()
        .is_some_and(|l| l.chunk.uid == chunk.uid);
    if !(device && same) {
        answer_landed(shard, conn, writer, turn).await?;
    }
    let prev = turn.landing.as_mut().map(|l| &mut l.copies);
    let placed = place(
        shard,
        reader,
        &chunk,
        payload,
        checked,
        region.as_ref(),
        prev,
    )
    .await?;
    // Answers leave in the order of their frames: the chunk before this one first.
    answer_landed(shard, conn, writer, turn).await?;
    let (code, msg) = match placed {
        Placed::Now(code, msg) => (code, msg),
        Placed::Device(copies) if copies.may_land() && reader.input_waiting() => {
            turn.landing = Some(Landing {
                chunk,
                final_,
                payload,
                _region: region,
                copies,
                _placing: placing,
            });
            shard.stats.borrow_mut().gpu_overlapped_landings += 1;
            return Ok(None);
        }
        Placed::Device(copies) => landed(copies.finish(shard).await),
    };
    answer_write(shard, conn, writer, (&chunk, final_), payload, code, msg)
        .await
        .map(Some)
}
