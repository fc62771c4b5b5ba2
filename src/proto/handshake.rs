//! The connection handshake: HELLO from the dialer, HELLO_ACK from the acceptor, and, when the
//! deployment has a secret, AUTH from the dialer; the checks each side makes before a single
//! request is served.
//!
//! With a secret, both sides prove they hold it, bound to this connection: the dialer's HELLO
//! carries a fresh nonce, the acceptor answers with its own nonce and
//! `HMAC-SHA-256(secret, "morio acceptor" ‖ transcript)`, the dialer checks that and answers
//! AUTH with `HMAC-SHA-256(secret, "morio dialer" ‖ transcript)`, where the transcript is the
//! version, lane, lane count, both engine keys, the dialer's instance and both nonces. Proofs
//! are compared in constant time. A recorded handshake cannot be replayed (the other side's
//! nonce differs), a proof for one lane or engine is no proof for another, and neither side's
//! proof can stand in for the other's. Until the dialer's proof is checked, an acceptor with a
//! secret tells a peer nothing but a generic refusal: no engine key, no reason.
//!
//! **Same host** (v7). A dialer that may use the same-host transport puts in its HELLO a tag
//! of its host for this connection ([`host_tag`]: a hash of the host's boot id and the HELLO's
//! nonce); an acceptor whose own tag for that nonce is equal, and that may use the transport,
//! says so in HELLO_ACK. Then each side proves that a process it names is the very peer of
//! this connection and that it can read that process's memory: the dialer writes
//! [`local_proof`]`(Dialer)` (a hash over both nonces) into a probe slot of its memory and
//! sends LOCAL with its pid and the slot's address; the acceptor reads the slot through the
//! kernel (cross-memory attach) and, if it holds the proof, writes its own proof and answers
//! LOCAL likewise (or with pid 0 to decline); the dialer reads that slot in turn. A host name,
//! an address or a pid proves nothing; reading a fresh value of this connection out of the
//! named process proves the process is the peer, on this host, in a reachable pid namespace,
//! and that cross-process reads are allowed: exactly what the transport needs.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::codes;
use super::frame::{Hello, HelloAck};
use super::limits::{MAX_LANES, MIN_VERSION, NONCE_BYTES, PROOF_BYTES, SAME_HOST_VERSION, VERSION};

type HmacSha256 = Hmac<Sha256>;

/// The refusal an acceptor with a secret sends for any reason, before it knows its peer.
pub const GENERIC_REFUSAL: &str = "connection refused";

/// Why an acceptor refuses a HELLO: the code and message of its HELLO_ACK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// Wire status code.
    pub code: u32,
    /// The reason.
    pub msg: String,
}

/// Which side a proof is from (domain separation: one side's proof is never the other's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The side that accepted the connection.
    Acceptor,
    /// The side that dialed.
    Dialer,
}

/// The tag of the host with boot id `host` for the HELLO with `nonce` (same-host transport,
/// v7): equal tags mean one host, and a tag tells another host nothing.
pub fn host_tag(host: &[u8; 16], nonce: &[u8; NONCE_BYTES]) -> [u8; NONCE_BYTES] {
    use sha2::Digest;
    let mut h = Sha256::new();
    h.update(b"morio host\0");
    h.update(host);
    h.update(nonce);
    let mut out = [0u8; NONCE_BYTES];
    out.copy_from_slice(&h.finalize()[..NONCE_BYTES]);
    out
}

/// What `role` writes into its probe slot for the peer to read, for the handshake of `hello`
/// answered with `ack_nonce`: fresh for every connection, so only a process taking part in
/// this very handshake can hold it.
pub fn local_proof(role: Role, hello: &Hello, ack_nonce: &[u8; NONCE_BYTES]) -> [u8; NONCE_BYTES] {
    use sha2::Digest;
    let mut h = Sha256::new();
    h.update(match role {
        Role::Acceptor => b"morio local acceptor",
        Role::Dialer => b"morio local dialer\0\0",
    });
    h.update(hello.nonce);
    h.update(ack_nonce);
    let mut out = [0u8; NONCE_BYTES];
    out.copy_from_slice(&h.finalize()[..NONCE_BYTES]);
    out
}

/// Whether the acceptor with boot id `host` and the dialer of `hello` are on one host and
/// may use the same-host transport (`willing`: the acceptor's configuration allows it).
pub fn same_host(hello: &Hello, host: Option<&[u8; 16]>, willing: bool) -> bool {
    match (hello.host_tag, host) {
        (Some(tag), Some(host)) if willing && hello.version >= SAME_HOST_VERSION => {
            use subtle::ConstantTimeEq;
            bool::from(tag.ct_eq(&host_tag(host, &hello.nonce)))
        }
        _ => false,
    }
}

/// The proof of `role` for the handshake of `hello` answered with `nonce`.
fn proof(secret: &[u8], role: Role, hello: &Hello, nonce: &[u8; NONCE_BYTES]) -> [u8; PROOF_BYTES] {
    let mac = transcript(secret, role, hello, nonce);
    let mut out = [0u8; PROOF_BYTES];
    out.copy_from_slice(&mac.finalize().into_bytes());
    out
}

/// The keyed MAC over the handshake's transcript, ready to finalize or verify.
fn transcript(secret: &[u8], role: Role, hello: &Hello, nonce: &[u8; NONCE_BYTES]) -> HmacSha256 {
    // HMAC takes keys of any length.
    let mut mac = HmacSha256::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    mac.update(match role {
        Role::Acceptor => b"morio acceptor\0",
        Role::Dialer => b"morio dialer\0\0\0",
    });
    mac.update(&hello.version.to_le_bytes());
    mac.update(&hello.lane.to_le_bytes());
    mac.update(&hello.n_lanes.to_le_bytes());
    for key in [&hello.src_key, &hello.dst_key] {
        mac.update(&(key.len() as u64).to_le_bytes());
        mac.update(key.as_bytes());
    }
    mac.update(&hello.instance.to_le_bytes());
    mac.update(&hello.nonce);
    mac.update(nonce);
    mac
}

/// Whether `got` is `role`'s proof for this handshake (constant time).
fn verify(
    secret: &[u8],
    role: Role,
    hello: &Hello,
    nonce: &[u8; NONCE_BYTES],
    got: &[u8; PROOF_BYTES],
) -> bool {
    transcript(secret, role, hello, nonce)
        .verify_slice(got)
        .is_ok()
}

/// The acceptor's check of a HELLO sent to engine `me`.
pub fn check_hello(hello: &Hello, me: &str) -> Result<(), Refused> {
    let bad = |msg: String| Refused {
        code: codes::ERR_INVALID_ARGS,
        msg,
    };
    if hello.version < MIN_VERSION {
        Err(bad(format!(
            "protocol version {} is older than the oldest this engine speaks ({MIN_VERSION})",
            hello.version
        )))
    } else if hello.dst_key != me {
        Err(Refused {
            code: codes::ERR_NOT_FOUND,
            msg: format!("this is engine {me:?}, not {:?}", hello.dst_key),
        })
    } else if hello.src_key.is_empty() {
        Err(bad("empty engine key".to_string()))
    } else if hello.n_lanes == 0 || hello.n_lanes > MAX_LANES || hello.lane >= hello.n_lanes {
        Err(bad(format!("bad lane {} of {}", hello.lane, hello.n_lanes)))
    } else {
        Ok(())
    }
}

/// A refusal as an acceptor sends it: with a secret, the same generic refusal whatever the
/// reason (the peer is not known to be one of ours).
pub fn refusal(r: Refused, secret: Option<&[u8]>) -> HelloAck {
    let (code, msg) = match secret {
        Some(_) => (codes::ERR_NOT_FOUND, GENERIC_REFUSAL.to_string()),
        None => (r.code, r.msg),
    };
    HelloAck {
        version: VERSION,
        code,
        key: String::new(),
        msg,
        nonce: [0; NONCE_BYTES],
        proof: None,
        same_host: false,
    }
}

/// The version a connection speaks: the newer both sides offer (the dialer offered
/// `hello.version`, the acceptor at most `max`, at most [`VERSION`]; the acceptor checked the
/// dialer's is not older than [`MIN_VERSION`]).
pub fn spoken(hello: &Hello, max: u32) -> u32 {
    hello.version.min(max).clamp(MIN_VERSION, VERSION)
}

/// The acceptor's answer to a HELLO it accepts, as engine `me`, with its fresh `nonce`: with
/// a secret, no key but a proof over that nonce (the dialer must then answer AUTH).
/// `same_host`: what [`same_host`] said (the LOCAL frames follow). The acceptor offers
/// `max` at most (its `max_protocol_version`).
pub fn accept(
    me: &str,
    hello: &Hello,
    secret: Option<&[u8]>,
    nonce: [u8; NONCE_BYTES],
    same_host: bool,
    max: u32,
) -> HelloAck {
    let version = spoken(hello, max);
    let same_host = same_host && version >= SAME_HOST_VERSION;
    match secret {
        Some(s) => HelloAck {
            version,
            code: codes::SUCCESS,
            key: String::new(),
            msg: String::new(),
            nonce,
            proof: Some(proof(s, Role::Acceptor, hello, &nonce)),
            same_host,
        },
        None => HelloAck {
            version,
            code: codes::SUCCESS,
            key: me.to_string(),
            msg: String::new(),
            // v6 sent zeros without a secret; from v7 the nonce also keys the LOCAL proofs.
            nonce: if version >= SAME_HOST_VERSION {
                nonce
            } else {
                [0; NONCE_BYTES]
            },
            proof: None,
            same_host,
        },
    }
}

/// The acceptor's check of the dialer's AUTH for the handshake of `hello`, which it answered
/// with `nonce`.
pub fn check_auth(
    secret: &[u8],
    hello: &Hello,
    nonce: &[u8; NONCE_BYTES],
    got: &[u8; PROOF_BYTES],
) -> bool {
    verify(secret, Role::Dialer, hello, nonce, got)
}

/// The dialer's check of the HELLO_ACK to its `hello`: `Ok(Some(proof))` when it must send
/// AUTH with that proof, `Ok(None)` when the connection is ready.
pub fn check_ack(
    ack: &HelloAck,
    hello: &Hello,
    secret: Option<&[u8]>,
) -> Result<Option<[u8; PROOF_BYTES]>, String> {
    let expected = &hello.dst_key;
    if ack.code != codes::SUCCESS {
        return Err(format!("peer refused the connection: {}", ack.msg));
    }
    if ack.version < MIN_VERSION || ack.version > hello.version.min(VERSION) {
        return Err(format!(
            "peer answered protocol version {}; we speak {MIN_VERSION} to {VERSION}",
            ack.version
        ));
    }
    match (secret, &ack.proof) {
        (Some(s), Some(p)) => {
            if !verify(s, Role::Acceptor, hello, &ack.nonce, p) {
                return Err(format!(
                    "peer {expected:?} failed authentication (a different secret?)"
                ));
            }
            Ok(Some(proof(s, Role::Dialer, hello, &ack.nonce)))
        }
        (Some(_), None) => Err(format!(
            "peer {expected:?} does not authenticate (no secret configured there?): refusing it"
        )),
        (None, Some(_)) => Err(format!(
            "peer {expected:?} requires authentication: configure the deployment secret"
        )),
        (None, None) if ack.key != *expected => Err(format!(
            "peer is engine {:?}, expected {expected:?}",
            ack.key
        )),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef-deployment";

    fn hello() -> Hello {
        Hello {
            version: VERSION,
            lane: 1,
            n_lanes: 2,
            src_key: "a".into(),
            dst_key: "b".into(),
            instance: 3,
            nonce: [7; NONCE_BYTES],
            host_tag: None,
        }
    }

    #[test]
    fn hellos_are_checked() {
        assert_eq!(check_hello(&hello(), "b"), Ok(()));
        assert_eq!(
            check_hello(&hello(), "c").unwrap_err().code,
            codes::ERR_NOT_FOUND
        );
        for h in [
            Hello {
                version: MIN_VERSION - 1,
                ..hello()
            },
            Hello {
                src_key: String::new(),
                ..hello()
            },
            Hello { lane: 2, ..hello() },
            Hello {
                n_lanes: 0,
                lane: 0,
                ..hello()
            },
            Hello {
                n_lanes: MAX_LANES + 1,
                ..hello()
            },
        ] {
            assert_eq!(
                check_hello(&h, "b").unwrap_err().code,
                codes::ERR_INVALID_ARGS,
                "{h:?}"
            );
        }
    }

    /// A newer dialer (a later version whose HELLO carries more at its end) is answered with
    /// this version, which both then speak; an older one than this build knows is refused.
    #[test]
    fn versions_are_negotiated_down_to_the_newer_both_know() {
        use crate::proto::decode::decode_frame;
        use crate::proto::frame::Frame;
        let newer = Hello {
            version: VERSION + 1,
            ..hello()
        };
        let mut bytes = Vec::new();
        Frame::Hello(newer.clone()).encode(0, &mut bytes);
        // A field a later version appends: the body grows by 8 bytes.
        bytes.extend_from_slice(&[0xEE; 8]);
        let body = (bytes.len() - crate::proto::limits::HEADER_BYTES) as u32;
        bytes[4..8].copy_from_slice(&body.to_le_bytes());
        let Ok(Some((Frame::Hello(got), 0, used))) = decode_frame(&bytes) else {
            panic!("a newer HELLO must decode");
        };
        assert_eq!((got.clone(), used), (newer.clone(), bytes.len()));
        assert_eq!(check_hello(&got, "b"), Ok(()));
        for secret in [None, Some(&b"a secret of the deployment"[..])] {
            let ack = accept("b", &got, secret, [1; NONCE_BYTES], false, VERSION);
            assert_eq!(ack.version, VERSION, "spoken: the newer both know");
            // The newer dialer, speaking this version now, takes the answer.
            assert!(check_ack(&ack, &newer, secret).is_ok());
        }
        // An answer above what the dialer offered, or below what it knows, is refused.
        let mut ack = accept("b", &hello(), None, [0; NONCE_BYTES], false, VERSION);
        ack.version = VERSION + 1;
        assert!(check_ack(&ack, &hello(), None).is_err());
        ack.version = MIN_VERSION - 1;
        assert!(check_ack(&ack, &hello(), None)
            .unwrap_err()
            .contains("protocol version"));
        // Other frames do not grow: trailing bytes there are an error.
        let mut auth = Vec::new();
        Frame::Auth([2; PROOF_BYTES]).encode(0, &mut auth);
        auth.push(0);
        let body = (auth.len() - crate::proto::limits::HEADER_BYTES) as u32;
        auth[4..8].copy_from_slice(&body.to_le_bytes());
        assert!(decode_frame(&auth).is_err());
    }

    #[test]
    fn without_a_secret_the_ack_names_the_engine() {
        let h = hello();
        assert_eq!(
            check_ack(&accept("b", &h, None, [0; 16], false, VERSION), &h, None),
            Ok(None)
        );
        let other = Hello {
            dst_key: "x".into(),
            ..hello()
        };
        assert!(check_ack(
            &accept("b", &h, None, [0; 16], false, VERSION),
            &other,
            None
        )
        .is_err());
        let no = refusal(check_hello(&h, "c").unwrap_err(), None);
        assert!(no.key.is_empty(), "a refusal names no engine");
        assert!(no.msg.contains("this is engine"), "{}", no.msg);
        assert!(check_ack(&no, &h, None).unwrap_err().contains("refused"));
    }

    #[test]
    fn with_a_secret_both_sides_prove_it_for_this_connection() {
        let h = hello();
        let ack = accept("b", &h, Some(SECRET), [9; NONCE_BYTES], false, VERSION);
        assert!(
            ack.key.is_empty(),
            "nothing about the engine before the dialer's proof"
        );
        let auth = check_ack(&ack, &h, Some(SECRET))
            .unwrap()
            .expect("must send AUTH");
        assert!(check_auth(SECRET, &h, &[9; NONCE_BYTES], &auth));
        // Another connection (another nonce of either side), lane or dialer: no proof.
        assert!(
            !check_auth(SECRET, &h, &[8; NONCE_BYTES], &auth),
            "replayed"
        );
        for other in [
            Hello {
                nonce: [1; NONCE_BYTES],
                ..hello()
            },
            Hello { lane: 0, ..hello() },
            Hello {
                src_key: "mallory".into(),
                ..hello()
            },
            Hello {
                instance: 4,
                ..hello()
            },
        ] {
            assert!(
                !check_auth(SECRET, &other, &[9; NONCE_BYTES], &auth),
                "{other:?}"
            );
        }
        // One side's proof is not the other's.
        let acceptors = ack.proof.unwrap();
        assert!(!check_auth(SECRET, &h, &[9; NONCE_BYTES], &acceptors));
        // A wrong secret fails on either side.
        assert!(check_ack(&ack, &h, Some(b"another secret, long enough"))
            .unwrap_err()
            .contains("failed authentication"));
        assert!(!check_auth(
            b"another secret, long enough",
            &h,
            &[9; NONCE_BYTES],
            &auth
        ));
    }

    /// One host is recognised by its tag, another is not, and the proofs of a connection are
    /// its own: another nonce of either side, or the other side's role, gives another value.
    #[test]
    fn same_host_is_recognised_and_proofs_are_per_connection() {
        let host = [3u8; 16];
        let h = Hello {
            host_tag: Some(host_tag(&host, &[7; NONCE_BYTES])),
            ..hello()
        };
        assert!(same_host(&h, Some(&host), true));
        assert!(!same_host(&h, Some(&host), false), "unwilling acceptor");
        assert!(!same_host(&h, Some(&[4u8; 16]), true), "another host");
        assert!(!same_host(&h, None, true), "acceptor without a boot id");
        assert!(!same_host(&hello(), Some(&host), true), "no offer");
        let replayed = Hello {
            nonce: [8; NONCE_BYTES],
            ..h.clone()
        };
        assert!(
            !same_host(&replayed, Some(&host), true),
            "tag of another HELLO"
        );
        let v6 = Hello {
            version: 6,
            ..h.clone()
        };
        assert!(
            !same_host(&v6, Some(&host), true),
            "v6 has no same-host transport"
        );
        let ack = accept("b", &h, None, [9; NONCE_BYTES], true, VERSION);
        assert!(ack.same_host && ack.nonce == [9; NONCE_BYTES]);
        assert!(!accept("b", &v6, None, [9; NONCE_BYTES], true, VERSION).same_host);
        // An acceptor that offers v6 at most answers a v7 HELLO with v6, without same host.
        let capped = accept("b", &h, None, [9; NONCE_BYTES], true, 6);
        assert_eq!((capped.version, capped.same_host), (6, false));
        let d = local_proof(Role::Dialer, &h, &ack.nonce);
        assert_ne!(d, local_proof(Role::Acceptor, &h, &ack.nonce));
        assert_ne!(d, local_proof(Role::Dialer, &h, &[1; NONCE_BYTES]));
        assert_ne!(d, local_proof(Role::Dialer, &replayed, &ack.nonce));
    }

    /// A v6 HELLO and HELLO_ACK are encoded exactly as v6 did (no v7 field), and a v7 build
    /// reads them with the v7 fields absent.
    #[test]
    fn v6_frames_carry_no_v7_fields() {
        use crate::proto::decode::decode_frame;
        use crate::proto::frame::Frame;
        let v6 = Hello {
            version: 6,
            host_tag: Some([1; NONCE_BYTES]),
            ..hello()
        };
        let mut b = Vec::new();
        Frame::Hello(v6.clone()).encode(0, &mut b);
        let body = b.len() - crate::proto::limits::HEADER_BYTES;
        assert_eq!(body, 4 + 2 + 2 + 3 + 3 + 8 + NONCE_BYTES, "the v6 layout");
        let Ok(Some((Frame::Hello(got), 0, _))) = decode_frame(&b) else {
            panic!("decodes");
        };
        assert_eq!(got.host_tag, None);
        let ack = accept("b", &v6, None, [9; NONCE_BYTES], true, VERSION);
        assert_eq!(
            (ack.version, ack.same_host, ack.nonce),
            (6, false, [0; NONCE_BYTES])
        );
        let mut b = Vec::new();
        Frame::HelloAck(ack.clone()).encode(0, &mut b);
        let Ok(Some((Frame::HelloAck(got), 0, _))) = decode_frame(&b) else {
            panic!("decodes");
        };
        assert_eq!(got, ack);
    }

    #[test]
    fn a_secret_on_one_side_only_fails_clearly() {
        let h = hello();
        let plain = accept("b", &h, None, [0; NONCE_BYTES], false, VERSION);
        assert!(check_ack(&plain, &h, Some(SECRET))
            .unwrap_err()
            .contains("does not authenticate"));
        let authed = accept("b", &h, Some(SECRET), [5; NONCE_BYTES], false, VERSION);
        assert!(check_ack(&authed, &h, None)
            .unwrap_err()
            .contains("requires authentication"));
    }

    #[test]
    fn with_a_secret_every_refusal_is_generic() {
        let h = hello();
        for r in [
            check_hello(&h, "c").unwrap_err(),
            check_hello(&Hello { lane: 5, ..hello() }, "b").unwrap_err(),
        ] {
            let ack = refusal(r, Some(SECRET));
            assert_eq!(
                (ack.code, ack.msg.as_str()),
                (codes::ERR_NOT_FOUND, GENERIC_REFUSAL)
            );
            assert!(ack.key.is_empty() && ack.proof.is_none());
        }
    }
}
