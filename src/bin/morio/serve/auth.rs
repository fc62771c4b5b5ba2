//! Proof of the deployment secret on a control request (`Morio-HMAC`), usable from curl.
//!
//! 1. `GET /nonce` returns a fresh nonce: 32 lowercase hex digits (16 random bytes). The
//!    service keeps at most [`MAX_NONCES`] outstanding, each for [`NONCE_TTL`]; past the cap
//!    the oldest is dropped (a flood of `/nonce` can make a client ask again, never let it
//!    in).
//! 2. The request carries `Authorization: Morio-HMAC nonce=<hex>, proof=<hex>`, where proof is
//!    the hex HMAC-SHA-256, keyed with the secret, of `"morio control\0"` ‖ the nonce's 32 hex
//!    digits as returned ‖ the method ‖ the path (no query): for `GET /stats`, the bytes
//!    `morio control\0` `3f…9a` `GET` `/stats`.
//! 3. The service takes the nonce out of its store before it checks the proof (a nonce is
//!    good for one attempt), then compares the proof in constant time (`hmac`'s `verify`). A
//!    missing, unknown, expired, reused or wrong proof gets the same 401.
//!
//! With curl and openssl (`$S` the secret file, no NUL bytes in it):
//!
//! ```sh
//! n=$(curl -s node:7070/nonce)
//! p=$(printf 'morio control\0%sGET/stats' "$n" | openssl dgst -sha256 -hmac "$(cat $S)" -r | cut -c1-64)
//! curl -H "Authorization: Morio-HMAC nonce=$n, proof=$p" node:7070/stats
//! ```

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The `Authorization` scheme.
pub const SCHEME: &str = "Morio-HMAC";
/// Nonces outstanding at once; issuing more drops the oldest.
pub const MAX_NONCES: usize = 1024;
/// How long a nonce stays good.
pub const NONCE_TTL: Duration = Duration::from_secs(30);
/// Bytes of randomness in a nonce.
const NONCE_BYTES: usize = 16;

/// The outstanding nonces, oldest first.
#[derive(Debug, Default)]
pub struct Nonces {
    issued: Mutex<VecDeque<(Instant, [u8; NONCE_BYTES])>>,
}

impl Nonces {
    /// A fresh nonce, as its hex text.
    pub fn issue(&self) -> String {
        self.issue_at(Instant::now())
    }

    fn issue_at(&self, now: Instant) -> String {
        let n: [u8; NONCE_BYTES] = rand::random();
        let mut q = self.issued.lock().unwrap_or_else(|e| e.into_inner());
        expire(&mut q, now);
        while q.len() >= MAX_NONCES {
            q.pop_front();
        }
        q.push_back((now, n));
        hex(&n)
    }

    /// Take `nonce` (hex) out of the store: true when it was issued, not yet taken and not
    /// expired.
    pub fn take(&self, nonce: &str) -> bool {
        self.take_at(nonce, Instant::now())
    }

    fn take_at(&self, nonce: &str, now: Instant) -> bool {
        let Some(n) = unhex(nonce).and_then(|v| <[u8; NONCE_BYTES]>::try_from(v).ok()) else {
            return false;
        };
        let mut q = self.issued.lock().unwrap_or_else(|e| e.into_inner());
        expire(&mut q, now);
        match q.iter().position(|(_, x)| *x == n) {
            Some(i) => q.remove(i).is_some(),
            None => false,
        }
    }
}

fn expire(q: &mut VecDeque<(Instant, [u8; NONCE_BYTES])>, now: Instant) {
    while q
        .front()
        .is_some_and(|(t, _)| now.saturating_duration_since(*t) > NONCE_TTL)
    {
        q.pop_front();
    }
}

/// The MAC of a request: `"morio control\0" ‖ nonce (hex text) ‖ method ‖ path`.
fn mac(secret: &[u8], nonce: &str, method: &str, path: &str) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    m.update(b"morio control\0");
    m.update(nonce.as_bytes());
    m.update(method.as_bytes());
    m.update(path.as_bytes());
    m
}

/// The `Authorization` value proving `secret` for `method path` with `nonce` (a client's).
pub fn authorization(secret: &[u8], nonce: &str, method: &str, path: &str) -> String {
    let p = mac(secret, nonce, method, path).finalize().into_bytes();
    format!("{SCHEME} nonce={nonce}, proof={}", hex(&p))
}

/// The nonce and proof of an `Authorization` value of our scheme.
fn parse(value: &str) -> Option<(&str, Vec<u8>)> {
    let (scheme, params) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let (mut nonce, mut proof) = (None, None);
    for kv in params.split(',') {
        let (k, v) = kv.trim().split_once('=')?;
        let v = v.trim().trim_matches('"');
        match k.trim() {
            "nonce" => nonce = Some(v),
            "proof" => proof = Some(unhex(v)?),
            _ => return None,
        }
    }
    Some((nonce?, proof?))
}

/// Does `authorization` (the header, if any) prove `secret` for `method path` with a nonce
/// of `nonces`? The nonce is used up either way.
pub fn verify(
    secret: &[u8],
    nonces: &Nonces,
    method: &str,
    path: &str,
    authorization: Option<&str>,
) -> bool {
    let Some((nonce, proof)) = authorization.and_then(parse) else {
        return false;
    };
    if !nonces.take(nonce) {
        return false;
    }
    // The MAC over the nonce as issued (lower-case hex), whatever case the client sent.
    let nonce = nonce.to_ascii_lowercase();
    mac(secret, &nonce, method, path)
        .verify_slice(&proof)
        .is_ok()
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: &[u8] = b"control secret, long enough";

    #[test]
    fn a_proof_is_good_once_for_its_method_and_path() {
        let ns = Nonces::default();
        let n = ns.issue();
        assert_eq!(n.len(), 2 * NONCE_BYTES);
        let a = authorization(K, &n, "GET", "/stats");
        assert!(verify(K, &ns, "GET", "/stats", Some(&a)));
        // Replayed: the nonce is gone.
        assert!(!verify(K, &ns, "GET", "/stats", Some(&a)));
        // Bound to the path, the method and the secret; each try uses up its nonce.
        for (k, m, p) in [
            (K, "GET", "/descriptors"),
            (K, "POST", "/stats"),
            (&b"another secret, long enough"[..], "GET", "/stats"),
        ] {
            let n = ns.issue();
            let a = authorization(k, &n, m, p);
            assert!(!verify(K, &ns, "GET", "/stats", Some(&a)), "{m} {p}");
            let good = authorization(K, &n, "GET", "/stats");
            assert!(!verify(K, &ns, "GET", "/stats", Some(&good)), "reused");
        }
        // A nonce the service never issued, or no header, or another scheme.
        let made_up = authorization(K, &"ab".repeat(NONCE_BYTES), "GET", "/stats");
        assert!(!verify(K, &ns, "GET", "/stats", Some(&made_up)));
        assert!(!verify(K, &ns, "GET", "/stats", None));
        let n = ns.issue();
        let basic = authorization(K, &n, "GET", "/stats").replace(SCHEME, "Basic");
        assert!(!verify(K, &ns, "GET", "/stats", Some(&basic)));
    }

    #[test]
    fn the_header_parses_leniently_but_not_loosely() {
        let ns = Nonces::default();
        let n = ns.issue();
        let p = hex(&mac(K, &n, "GET", "/stats").finalize().into_bytes());
        let spaced = format!(
            "morio-hmac  nonce=\"{}\" ,proof={}",
            n.to_uppercase(),
            p.to_uppercase()
        );
        assert!(verify(K, &ns, "GET", "/stats", Some(&spaced)));
        for bad in [
            format!("{SCHEME} nonce={n}"),
            format!("{SCHEME} proof={p}"),
            format!("{SCHEME} nonce={n}, proof={p}, extra=1"),
            format!("{SCHEME} nonce={n}, proof=zz"),
            format!("{SCHEME} nonce={n}, proof={}", &p[..10]),
            String::new(),
        ] {
            let m = ns.issue();
            let bad = bad.replace(&n, &m);
            assert!(!verify(K, &ns, "GET", "/stats", Some(&bad)), "{bad}");
        }
    }

    #[test]
    fn nonces_expire_and_are_bounded() {
        let ns = Nonces::default();
        let t0 = Instant::now();
        let old = ns.issue_at(t0);
        assert!(!ns.take_at(&old, t0 + NONCE_TTL + Duration::from_secs(1)));
        let first = ns.issue_at(t0);
        let rest: Vec<String> = (0..MAX_NONCES).map(|_| ns.issue_at(t0)).collect();
        assert!(ns.issued.lock().unwrap().len() <= MAX_NONCES);
        assert!(!ns.take_at(&first, t0), "the oldest was not dropped");
        assert!(rest.iter().all(|n| ns.take_at(n, t0)));
        assert!(ns.issued.lock().unwrap().is_empty());
        assert!(!ns.take_at("not hex", t0) && !ns.take_at("abcd", t0));
        assert_eq!(unhex("+f+f"), None);
    }
}
