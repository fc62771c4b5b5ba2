//! The shard pool: start N pinned executors all-or-nothing, route messages, shut down and join.

use std::future::Future;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use glommio::{ExecutorJoinHandle, LocalExecutorBuilder, Placement};

/// Index of a shard within its pool, `0..n_shards`.
pub type ShardId = usize;

/// How to start a pool.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// One entry per shard: the CPU it is pinned to (`None` = unpinned).
    pub cpus: Vec<Option<usize>>,
    /// Thread name prefix; shard `i` runs on a thread named `{name}-{i}`.
    pub name: String,
    /// Busy-poll this long before parking the executor (trades a core for wake-up latency):
    /// glommio's own spin, and sockets polled directly while the shard has traffic
    /// (`busy/`).
    pub spin_before_park: Option<Duration>,
    /// Poll sockets and rings directly for this long after the shard's last work, without
    /// glommio's spin (`busy/`); a shard preempted while it does so stops for 50 ms, so it
    /// never holds a CPU another thread wants. Ignored when `spin_before_park` is set (that
    /// window applies, and a configured spin does not back off).
    pub busy_window: Option<Duration>,
    /// Bytes of io_uring registered memory per executor (glommio `io_memory`); 1 MiB keeps
    /// non-root users inside an 8 MiB memlock limit.
    pub io_memory_bytes: usize,
}

impl PoolConfig {
    /// `n` unpinned shards (tests, or machines whose topology could not be read).
    pub fn unpinned(n: usize, name: &str) -> Self {
        Self {
            cpus: vec![None; n],
            name: name.to_string(),
            spin_before_park: None,
            busy_window: None,
            io_memory_bytes: 1 << 20,
        }
    }

    /// One shard pinned to each CPU of `cpus`, in order.
    pub fn pinned(cpus: &[usize], name: &str) -> Self {
        Self {
            cpus: cpus.iter().map(|&c| Some(c)).collect(),
            ..Self::unpinned(0, name)
        }
    }
}

/// Why a pool could not start.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// The config asked for no shards at all.
    #[error("a shard pool needs at least one shard")]
    NoShards,
    /// The host cannot run shards ([`crate::preflight`]): the message says what to change.
    #[error(transparent)]
    Host(#[from] crate::preflight::Preflight),
    /// An executor failed to start (bad CPU, memlock limit, io_uring unavailable, ...).
    #[error("shard {shard} failed to start: {reason}")]
    Start {
        /// The shard that failed.
        shard: ShardId,
        /// What glommio reported.
        reason: String,
    },
}

/// The `Send + Sync` set of every shard's inbox. Cloned freely; used by shards and by
/// application threads alike. Sending never blocks (inboxes are unbounded queues whose
/// receivers are woken across threads).
#[derive(Debug)]
pub struct Mesh<M> {
    senders: Arc<[async_channel::Sender<M>]>,
}

impl<M> Clone for Mesh<M> {
    fn clone(&self) -> Self {
        Self {
            senders: self.senders.clone(),
        }
    }
}

impl<M> Mesh<M> {
    /// Number of shards in the pool.
    pub fn n_shards(&self) -> usize {
        self.senders.len()
    }

    /// Queue `msg` on shard `to`. Returns the message back if the pool is shut down or `to`
    /// is out of range.
    pub fn send(&self, to: ShardId, msg: M) -> Result<(), M> {
        match self.senders.get(to) {
            Some(s) => s.try_send(msg).map_err(|e| e.into_inner()),
            None => Err(msg),
        }
    }

    fn close(&self) {
        for s in self.senders.iter() {
            s.close();
        }
    }
}

/// What a shard's service receives when it is built on its executor.
#[derive(Debug)]
pub struct ShardCtx<M> {
    /// This shard's index.
    pub id: ShardId,
    /// This shard's inbox; `recv()` fails once the pool shuts down, which is the service's
    /// signal to finish. [`ShardCtx::recv`] is the faster way to read it on a spinning shard.
    pub inbox: async_channel::Receiver<M>,
    /// Every shard's inbox, this one included.
    pub mesh: Mesh<M>,
}

impl<M> ShardCtx<M> {
    /// The next message, or `Err` once the pool has shut down and the inbox is drained. On a
    /// busy spinning shard the busy poller notices new messages directly, without waiting for
    /// the runtime's cross-thread wake-up; and while the shard is busy no listener is
    /// registered with the inbox at all, so a sender on another thread queues its message
    /// without paying for a wake-up (a syscall) nobody needs. When the shard goes idle the
    /// poller wakes this loop, which registers with the inbox again.
    pub async fn recv(&self) -> Result<M, async_channel::RecvError> {
        loop {
            match self.inbox.try_recv() {
                Ok(m) => return Ok(m),
                Err(async_channel::TryRecvError::Closed) => return Err(async_channel::RecvError),
                Err(async_channel::TryRecvError::Empty) => {}
            }
            if crate::busy::is_busy() {
                crate::busy::inbox_ready().await;
                continue;
            }
            let woken = futures_lite::future::or(async { Some(self.inbox.recv().await) }, async {
                crate::busy::inbox_ready().await;
                None
            })
            .await;
            if let Some(r) = woken {
                return r;
            }
        }
    }
}

/// A running pool of pinned executors. Dropping it (or [`ShardPool::shutdown`]) closes every
/// inbox and joins every shard thread.
#[derive(Debug)]
pub struct ShardPool<M> {
    mesh: Mesh<M>,
    joins: Vec<ExecutorJoinHandle<()>>,
}

impl<M: Send + 'static> ShardPool<M> {
    /// Start one executor per entry of `cfg.cpus` and run `factory(ctx)` on each. Returns once
    /// every shard is running, or an error (after stopping the shards that did start).
    pub fn start<F, Fut>(cfg: PoolConfig, factory: F) -> Result<Self, ShardError>
    where
        F: Fn(ShardCtx<M>) -> Fut + Send + Sync + Clone + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let n = cfg.cpus.len();
        if n == 0 {
            return Err(ShardError::NoShards);
        }
        crate::preflight::check()?;
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..n).map(|_| async_channel::unbounded::<M>()).unzip();
        let mesh = Mesh {
            senders: senders.into(),
        };
        let (ready_tx, ready_rx) = mpsc::channel::<(ShardId, Result<(), String>)>();
        let mut joins = Vec::with_capacity(n);
        let mut first_err = None;
        for (id, (cpu, inbox)) in cfg.cpus.iter().zip(receivers).enumerate() {
            let placement = match cpu {
                Some(c) => Placement::Fixed(*c),
                None => Placement::Unbound,
            };
            // glommio names its threads "{name}-{executor id}"; the executor thread is renamed
            // to "{name}-{shard}" below, so helper threads carry a "-io" name instead.
            let mut b = LocalExecutorBuilder::new(placement)
                .name(&format!("{}-io", cfg.name))
                .io_memory(cfg.io_memory_bytes);
            if let Some(spin) = cfg.spin_before_park {
                b = b.spin_before_park(spin);
            }
            let ctx = ShardCtx {
                id,
                inbox,
                mesh: mesh.clone(),
            };
            let factory = factory.clone();
            let ready = ready_tx.clone();
            let thread_name = format!("{}-{id}", cfg.name);
            let spin = cfg.spin_before_park.or(cfg.busy_window);
            let back_off = cfg.spin_before_park.is_none();
            match b.spawn(move || async move {
                set_thread_name(&thread_name);
                if let Some(window) = spin {
                    let rx = ctx.inbox.clone();
                    crate::busy::enable(window, Box::new(move || !rx.is_empty() || rx.is_closed()));
                    if back_off {
                        crate::busy::back_off_when_preempted();
                    }
                    glommio::spawn_local(crate::busy::poller()).detach();
                }
                let _ = ready.send((id, Ok(())));
                drop(ready);
                factory(ctx).await;
            }) {
                Ok(j) => joins.push(j),
                Err(e) => {
                    first_err = Some(ShardError::Start {
                        shard: id,
                        reason: e.to_string(),
                    });
                    break;
                }
            }
        }
        drop(ready_tx);
        let pool = Self { mesh, joins };
        if let Some(e) = first_err {
            pool.stop();
            return Err(e);
        }
        // A shard whose executor fails to build drops its `ready` sender without sending.
        let mut up = 0;
        while up < n {
            match ready_rx.recv() {
                Ok((_, Ok(()))) => up += 1,
                Ok((shard, Err(reason))) => {
                    pool.stop();
                    return Err(ShardError::Start { shard, reason });
                }
                Err(_) => {
                    let reason = pool.stop_and_collect();
                    return Err(ShardError::Start {
                        shard: reason.0,
                        reason: reason.1,
                    });
                }
            }
        }
        Ok(pool)
    }
}

/// Name the calling thread (Linux keeps 15 bytes).
fn set_thread_name(name: &str) {
    let mut bytes: Vec<u8> = name.bytes().filter(|&b| b != 0).take(15).collect();
    bytes.push(0);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes, which `bytes` is.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, bytes.as_ptr() as libc::c_ulong, 0, 0, 0);
    }
}

impl<M> ShardPool<M> {
    /// The pool's mesh, for application threads to submit work.
    pub fn mesh(&self) -> &Mesh<M> {
        &self.mesh
    }

    /// Number of shards.
    pub fn n_shards(&self) -> usize {
        self.mesh.n_shards()
    }

    /// Close every inbox and join every shard thread.
    pub fn shutdown(self) {
        self.stop();
    }

    fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_and_collect(mut self) -> (ShardId, String) {
        self.mesh.close();
        let mut failed = (0, "executor exited before it was ready".to_string());
        for (i, j) in self.joins.drain(..).enumerate() {
            if let Err(e) = j.join() {
                failed = (i, e.to_string());
            }
        }
        failed
    }

    fn stop_inner(&mut self) {
        self.mesh.close();
        for j in self.joins.drain(..) {
            if let Err(e) = j.join() {
                log::error!("shard thread ended with an error: {e}");
            }
        }
    }
}

impl<M> Drop for ShardPool<M> {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn messages_reach_every_shard_and_shutdown_joins() {
        let seen = Arc::new(AtomicUsize::new(0));
        let s2 = seen.clone();
        let pool = ShardPool::<usize>::start(PoolConfig::unpinned(3, "t"), move |ctx| {
            let seen = s2.clone();
            async move {
                while let Ok(v) = ctx.inbox.recv().await {
                    // Forward once around the ring so shards message each other.
                    if v < 100 {
                        let next = (ctx.id + 1) % ctx.mesh.n_shards();
                        let _ = ctx.mesh.send(next, v + 100);
                    } else {
                        seen.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        })
        .unwrap();
        for i in 0..30 {
            pool.mesh().send(i % 3, i).unwrap();
        }
        let t0 = std::time::Instant::now();
        while seen.load(Ordering::SeqCst) < 30 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(seen.load(Ordering::SeqCst), 30);
        let mesh = pool.mesh().clone();
        pool.shutdown();
        assert!(mesh.send(0, 1).is_err(), "closed pool must refuse messages");
        assert!(mesh.send(9, 1).is_err());
    }

    #[test]
    fn shard_threads_are_named_by_shard() {
        let (tx, rx) = std::sync::mpsc::channel();
        let pool = ShardPool::<()>::start(PoolConfig::unpinned(2, "named-shard"), move |ctx| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(std::thread::current().name().map(str::to_string));
                let mut comm =
                    std::fs::read_to_string("/proc/thread-self/comm").unwrap_or_default();
                comm.truncate(comm.trim_end().len());
                let _ = tx.send(Some(comm));
                while ctx.inbox.recv().await.is_ok() {}
            }
        })
        .unwrap();
        let mut names: Vec<String> = (0..4).filter_map(|_| rx.recv().ok().flatten()).collect();
        names.sort();
        names.dedup();
        assert!(names.contains(&"named-shard-0".to_string()), "{names:?}");
        assert!(names.contains(&"named-shard-1".to_string()), "{names:?}");
        pool.shutdown();
    }

    #[test]
    fn bad_cpu_fails_whole_pool() {
        let r =
            ShardPool::<()>::start(PoolConfig::pinned(&[0, 100_000], "bad"), |ctx| async move {
                while ctx.inbox.recv().await.is_ok() {}
            });
        assert!(matches!(r, Err(ShardError::Start { .. })), "{r:?}");
        assert!(matches!(
            ShardPool::<()>::start(PoolConfig::unpinned(0, "none"), |_| async {}),
            Err(ShardError::NoShards)
        ));
    }
}
