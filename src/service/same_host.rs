//! The same-host step of a connection's handshake, on either side: after HELLO_ACK (and
//! AUTH) said both ends are on one host, the LOCAL frames prove each process to the other
//! (proto::handshake, "Same host") and the connection becomes a same-host one
//! (transport::local), or stays TCP.

use crate::config::SameHost;
use crate::proto::frame::{Frame, Hello, HelloAck, LocalOffer};
use crate::proto::handshake::{self, Role};
use crate::proto::limits::{NONCE_BYTES, SAME_HOST_VERSION};
use crate::transport::framed::read_frame_exact;
use crate::transport::local::{self, Offer};
use crate::transport::Conn;

use super::Shared;

/// Why a dialer's same-host step failed.
#[derive(Debug)]
pub(crate) enum DialFailure {
    /// The peer could not be proven (or read): dial again without offering it.
    Fallback(String),
    /// The connection failed.
    Failed(String),
}

/// The host tag a dialer puts in its HELLO to `peer` of `version` (`None`: it does not offer
/// the same-host transport: configured off, another transport, a version without it, this
/// host without a boot id, or a peer it already failed with).
pub(crate) fn offer(
    shared: &Shared,
    peer: &str,
    version: u32,
    nonce: &[u8; NONCE_BYTES],
) -> Option<[u8; NONCE_BYTES]> {
    if shared.same_host() == SameHost::Off
        || version < SAME_HOST_VERSION
        || shared.same_host_known_failed(peer)
    {
        return None;
    }
    let host = local::host_id()?;
    local::prepare();
    Some(handshake::host_tag(&host, nonce))
}

/// Whether an acceptor answers `hello` as one on the same host.
pub(crate) fn recognised(shared: &Shared, hello: &Hello) -> bool {
    let yes = shared.same_host() != SameHost::Off
        && handshake::same_host(hello, local::host_id().as_ref(), true);
    if yes {
        // The dialer must be able to read us too.
        local::prepare();
    }
    yes
}

/// The size of the rings this engine offers.
fn ring_bytes(shared: &Shared) -> usize {
    shared
        .cfg
        .same_host_ring_bytes
        .unwrap_or_else(local::default_ring_bytes)
}

async fn send(conn: &mut Conn, f: Frame) -> Result<(), String> {
    let mut buf = Vec::new();
    f.encode(0, &mut buf);
    conn.send(&buf)
        .await
        .map_err(|e| format!("send {:?}: {e}", f.kind()))
}

/// The dialer's step, once `ack` (to `hello`, which offered it) said the peer is on this host:
/// our proof out, the peer's LOCAL in, its proof read out of its memory.
pub(crate) async fn dial(
    shared: &Shared,
    mut conn: Conn,
    hello: &Hello,
    ack: &HelloAck,
) -> Result<Conn, DialFailure> {
    let offer = Offer::new(
        &handshake::local_proof(Role::Dialer, hello, &ack.nonce),
        ack.version,
        ring_bytes(shared),
    );
    let me = LocalOffer {
        pid: std::process::id(),
        slot: offer.addr(),
    };
    send(&mut conn, Frame::Local(me))
        .await
        .map_err(DialFailure::Failed)?;
    let t0 = std::time::Instant::now();
    let theirs = match read_frame_exact(&mut conn).await {
        Ok(Frame::Local(o)) => o,
        Ok(f) => {
            return Err(DialFailure::Failed(format!(
                "expected LOCAL, got {:?}",
                f.kind()
            )))
        }
        Err(e) => return Err(DialFailure::Failed(format!("handshake: {e}"))),
    };
    if theirs.pid == 0 {
        // The peer could not read us; it logged why, and the connection stays TCP.
        let why = "the peer could not read this process's memory".to_string();
        return if shared.same_host() == SameHost::Require {
            Err(DialFailure::Failed(format!(
                "same-host transport required: {why}"
            )))
        } else {
            shared.same_host_failed(&hello.dst_key, &why);
            Ok(conn)
        };
    }
    let answered = t0.elapsed();
    let expect = handshake::local_proof(Role::Acceptor, hello, &ack.nonce);
    let checked = local::check_peer(theirs.pid, theirs.slot, &expect, ack.version);
    log::debug!(
        "same-host step with {:?}: peer's LOCAL after {answered:?}, its proof checked after {:?}",
        hello.dst_key,
        t0.elapsed()
    );
    match checked {
        Ok(taken) => Ok(conn.into_local(offer.upgrade(
            theirs.pid,
            taken,
            shared.cfg.op_timeout,
            ack.version,
        ))),
        // The peer has switched already: this connection cannot go on as TCP.
        Err(why) if shared.same_host() == SameHost::Require => Err(DialFailure::Failed(format!(
            "same-host transport required: {why}"
        ))),
        Err(why) => Err(DialFailure::Fallback(why)),
    }
}

/// The acceptor's step, after HELLO_ACK said same host (and AUTH, with a secret, passed):
/// the dialer's LOCAL in, its proof read out of its memory, ours out (or a refusal). `None`
/// when the connection must close.
pub(crate) async fn accept(
    shared: &Shared,
    mut conn: Conn,
    hello: &Hello,
    nonce: &[u8; NONCE_BYTES],
    version: u32,
) -> Option<Conn> {
    let theirs = match read_frame_exact(&mut conn).await {
        Ok(Frame::Local(o)) => o,
        other => {
            log::debug!(
                "closing a connection of {:?}: expected LOCAL ({})",
                hello.src_key,
                match other {
                    Ok(f) => format!("{:?}", f.kind()),
                    Err(e) => e.to_string(),
                }
            );
            return None;
        }
    };
    let expect = handshake::local_proof(Role::Dialer, hello, nonce);
    let t0 = std::time::Instant::now();
    let checked = local::check_peer(theirs.pid, theirs.slot, &expect, version);
    log::debug!(
        "same-host step of {:?}: its proof checked in {:?}",
        hello.src_key,
        t0.elapsed()
    );
    match checked {
        Ok(taken) => {
            let offer = Offer::new(
                &handshake::local_proof(Role::Acceptor, hello, nonce),
                version,
                ring_bytes(shared),
            );
            let me = LocalOffer {
                pid: std::process::id(),
                slot: offer.addr(),
            };
            send(&mut conn, Frame::Local(me)).await.ok()?;
            Some(conn.into_local(offer.upgrade(theirs.pid, taken, shared.cfg.op_timeout, version)))
        }
        Err(why) if shared.same_host() == SameHost::Require => {
            log::warn!(
                "engine {}: closing a connection of {:?}: same-host transport required: {why}",
                shared.key,
                hello.src_key
            );
            None
        }
        Err(why) => {
            shared.same_host_failed(&hello.src_key, &why);
            send(&mut conn, Frame::Local(LocalOffer { pid: 0, slot: 0 }))
                .await
                .ok()?;
            Some(conn)
        }
    }
}
