//! Target side: the chunks of multi-chunk WRITEs each shard is placing, from their header's
//! check until their answer (their copies into device memory settled, even on a connection
//! lost mid-chunk), so that a FINISH of their transfer, on any connection, is answered only
//! once none is: the initiator reports a write that failed early once its FINISHes are
//! answered, and nothing of it may land after that (protocol v11's fences).
//!
//! One short list per shard, written only by its shard (two uncontended lock turns per
//! chunk) and read by a FINISH (rare: a failure path). A shard places at most a few chunks at
//! once (one or two per connection it serves), so a list is searched linearly.

use std::sync::Mutex;

use crate::proto::join::JoinKey;

/// Per shard, the transfers (by join key) of the chunks it is placing, once per chunk.
#[derive(Debug)]
pub(crate) struct Placing {
    shards: Box<[Mutex<Vec<JoinKey>>]>,
}

/// Whether `a` and `b` name one transfer (the uid compared first: it differs most often).
fn same(a: &JoinKey, b: &JoinKey) -> bool {
    a.2 == b.2 && a.1 == b.1 && a.0 == b.0
}

impl Placing {
    /// Lists for `n_shards` shards.
    pub fn new(n_shards: usize) -> Self {
        Self {
            shards: (0..n_shards).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    fn list(&self, shard: usize) -> std::sync::MutexGuard<'_, Vec<JoinKey>> {
        self.shards[shard].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Shard `shard` begins to place a chunk of `key`'s transfer; [`Placing::end`] follows
    /// once it is placed or dropped.
    pub fn begin(&self, shard: usize, key: JoinKey) {
        self.list(shard).push(key);
    }

    /// Shard `shard` placed (or dropped) a chunk of `key`'s transfer counted by
    /// [`Placing::begin`]: nothing more of it can land.
    pub fn end(&self, shard: usize, key: &JoinKey) {
        let mut l = self.list(shard);
        if let Some(i) = l.iter().rposition(|k| same(k, key)) {
            l.swap_remove(i);
        }
    }

    /// Whether a chunk of `key`'s transfer is being placed, on any shard.
    pub fn any(&self, key: &JoinKey) -> bool {
        (0..self.shards.len()).any(|s| self.list(s).iter().any(|k| same(k, key)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_transfer_is_placing_until_its_last_chunk_on_any_shard_ends() {
        let p = Placing::new(3);
        let peer: Arc<str> = "peer".into();
        let (t7, t8) = ((peer.clone(), 1, 7), (peer.clone(), 1, 8));
        let other_instance = (peer.clone(), 2, 7);
        let other_peer: JoinKey = ("other".into(), 1, 7);
        assert!(!p.any(&t7));
        p.begin(0, t7.clone());
        p.begin(2, t7.clone());
        p.begin(2, t8.clone());
        assert!(p.any(&t7) && p.any(&t8));
        assert!(!p.any(&other_instance) && !p.any(&other_peer));
        p.end(0, &t7);
        assert!(p.any(&t7), "still placed on shard 2");
        p.end(2, &t7);
        assert!(!p.any(&t7));
        assert!(p.any(&t8));
        // An end that matches nothing (never begun here) changes nothing.
        p.end(1, &t8);
        assert!(p.any(&t8));
        p.end(2, &t8);
        assert!(!p.any(&t8));
    }
}
