//! The control service of `morio serve`: HTTP on `[control] listen` ([`super::http`]), where
//! initiators fetch descriptors, operators read stats, Prometheus scrapes metrics and
//! orchestrators check health; [`Client`] is `morio ctl`'s side.
//!
//! | endpoint | reply | proof needed with a secret |
//! |---|---|---|
//! | `GET /healthz` | 200 `ok` while the backend runs (503 otherwise) | no |
//! | `GET /metrics` | the Prometheus text exposition ([`morio::IoEngine::metrics_text`]) | no |
//! | `GET /nonce` | a fresh single-use nonce for a proof ([`super::auth`]) | no |
//! | `GET /descriptors` | JSON, or msgpack with `?format=msgpack` or `Accept: application/msgpack` | yes |
//! | `GET /stats` | JSON: per-shard and total counters, latency percentiles, per-peer counters | yes |
//!
//! Descriptors carry regions' access keys, and stats the engine's and its peers' keys, so
//! with a deployment secret they need a proof ([`super::auth`]); a request without one gets
//! 401 and a body that says only that. The open endpoints name no key, region, peer or
//! address, except that `/metrics` carries the per-peer families (`morio_peer_*`, labelled
//! with peers' engine keys) where `[control] peer_metrics` says so: by default only without
//! a secret, when every endpoint is open anyway.
//!
//! Descriptors as JSON: `{"engine": {"key", "node_id", "hostname", "host", "port", "pid",
//! "packed"}, "memory": {NAME: {"id", "size", "loc", "device_id", "packed"}}}`, where
//! `packed` is the msgpack descriptor (`EngineDesc::pack`, `MemoryDesc::pack`) in lower-case
//! hex (Python: `EngineDesc.unpack(bytes.fromhex(d["engine"]["packed"]))`). As msgpack
//! (`application/msgpack`): [`Descriptors`], a map of `engine` (packed bytes) and `memory` (a
//! list of `{name, desc}` in configuration order).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{bail, Context};
use morio::{AuthSecret, EngineDesc, IoEngine, MemoryDesc};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::auth::{self, Nonces};
use super::http::{self, Handler, Reply, Request, Response};

/// The msgpack content type of packed descriptors (`application/x-msgpack` and
/// `application/vnd.msgpack` are understood in `Accept` too).
pub const MSGPACK: &str = "application/msgpack";
const JSON: &str = "application/json";

/// What `/descriptors` returns as msgpack: the packed `EngineDesc` and every region's packed
/// `MemoryDesc` by name.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Descriptors {
    #[serde(with = "serde_bytes")]
    pub engine: Vec<u8>,
    pub memory: Vec<NamedDesc>,
}

/// One region's packed descriptor.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct NamedDesc {
    pub name: String,
    #[serde(with = "serde_bytes")]
    pub desc: Vec<u8>,
}

/// The node the service answers for.
struct Node {
    engine: Arc<IoEngine>,
    secret: Option<AuthSecret>,
    /// Whether `/metrics` carries the per-peer families.
    peer_metrics: bool,
    nonces: Nonces,
    packed: Vec<u8>,
    json: Vec<u8>,
}

/// The descriptors as JSON (see the module's documentation).
fn descriptors_json(d: &Descriptors) -> anyhow::Result<serde_json::Value> {
    let e = EngineDesc::unpack(&d.engine)?;
    let mut memory = serde_json::Map::new();
    for m in &d.memory {
        let md = MemoryDesc::unpack(&m.desc)?;
        memory.insert(
            m.name.clone(),
            json!({
                "id": md.id,
                "size": md.size,
                "loc": md.loc.to_string(),
                "device_id": md.device_id,
                "packed": auth::hex(&m.desc),
            }),
        );
    }
    Ok(json!({
        "engine": {
            "key": e.key,
            "node_id": e.node_id,
            "hostname": e.hostname,
            "host": e.host,
            "port": e.port,
            "pid": e.pid,
            "packed": auth::hex(&d.engine),
        },
        "memory": memory,
    }))
}

/// The service's handler for `engine` and its `descriptors`, requiring proofs of `secret`
/// where given. `peer_metrics` (`[control] peer_metrics`): whether the open `/metrics`
/// carries the per-peer families; by default, only without a secret.
pub fn handler(
    engine: Arc<IoEngine>,
    descriptors: &Descriptors,
    secret: Option<AuthSecret>,
    peer_metrics: Option<bool>,
) -> anyhow::Result<Handler> {
    let node = Node {
        engine,
        peer_metrics: peer_metrics.unwrap_or(secret.is_none()),
        secret,
        nonces: Nonces::default(),
        packed: rmp_serde::to_vec_named(descriptors)?,
        json: serde_json::to_vec_pretty(&descriptors_json(descriptors)?)?,
    };
    Ok(Arc::new(move |r: &Request| route(&node, r)))
}

/// Packed or JSON: `?format=` first, then the first of our types `Accept` names; JSON by
/// default. `None`: an unknown `format`.
fn wants_msgpack(r: &Request) -> Option<bool> {
    if let Some(f) = r.query_param("format") {
        return match f {
            "msgpack" => Some(true),
            "json" => Some(false),
            _ => None,
        };
    }
    let accept = r.header("accept").unwrap_or("");
    for t in accept.split(',') {
        let t = t.split(';').next().unwrap_or("").trim();
        if [MSGPACK, "application/x-msgpack", "application/vnd.msgpack"]
            .iter()
            .any(|m| t.eq_ignore_ascii_case(m))
        {
            return Some(true);
        }
        if t.eq_ignore_ascii_case(JSON) {
            return Some(false);
        }
    }
    Some(false)
}

fn route(n: &Node, r: &Request) -> Response {
    const PATHS: [&str; 6] = [
        "/",
        "/healthz",
        "/metrics",
        "/nonce",
        "/descriptors",
        "/stats",
    ];
    if !PATHS.contains(&r.path.as_str()) {
        return Response::text(404, "not found\n");
    }
    if r.method != "GET" {
        return Response::text(405, "only GET\n").with("Allow", "GET");
    }
    let secret = n.secret.as_ref().map(AuthSecret::as_bytes);
    let guarded = matches!(r.path.as_str(), "/descriptors" | "/stats");
    if let (true, Some(k)) = (guarded, secret) {
        if !auth::verify(k, &n.nonces, &r.method, &r.path, r.header("authorization")) {
            return Response::text(401, "authentication required\n")
                .with("WWW-Authenticate", auth::SCHEME);
        }
    }
    match r.path.as_str() {
        "/healthz" if n.engine.n_shards() > 0 => Response::text(200, "ok\n"),
        "/healthz" => Response::text(503, "no backend\n"),
        "/metrics" => {
            let text = match n.peer_metrics {
                true => n.engine.metrics_text(),
                false => n.engine.metrics_text_without_peers(),
            };
            Response::new(200, morio::METRICS_CONTENT_TYPE, text)
        }
        "/nonce" => {
            Response::text(200, format!("{}\n", n.nonces.issue())).with("Cache-Control", "no-store")
        }
        "/descriptors" => match wants_msgpack(r) {
            Some(true) => Response::new(200, MSGPACK, n.packed.clone()),
            Some(false) => Response::new(200, JSON, n.json.clone()),
            None => Response::text(400, "format is msgpack or json\n"),
        }
        .with("Cache-Control", "no-store"),
        "/stats" => match serde_json::to_vec_pretty(&super::stats_json(&n.engine)) {
            Ok(b) => Response::new(200, JSON, b).with("Cache-Control", "no-store"),
            Err(e) => Response::text(500, format!("{e}\n")),
        },
        _ => Response::text(
            200,
            "morio serve control: /healthz /metrics /nonce /descriptors /stats\n",
        ),
    }
}

/// `morio ctl`'s connection to a node's control service.
#[derive(Debug)]
pub struct Client {
    host: String,
    addrs: Vec<SocketAddr>,
    secret: Option<AuthSecret>,
}

impl Client {
    /// A client of the service at `hostport` (`HOST:PORT`, a name or an address), proving
    /// `secret` where given.
    pub fn new(hostport: &str, secret: Option<AuthSecret>) -> anyhow::Result<Self> {
        Ok(Self {
            host: hostport.to_string(),
            addrs: http::resolve(hostport)?,
            secret,
        })
    }

    /// `GET target` (a path, maybe with a query) with `headers`, proven when the client
    /// holds a secret (a nonce fetched first).
    pub fn get(&self, target: &str, headers: &[(&str, String)]) -> anyhow::Result<Reply> {
        let mut hs = headers.to_vec();
        if let Some(k) = &self.secret {
            let n = ok(self.plain_get("/nonce", &[])?, "/nonce", &self.host)?;
            let nonce = String::from_utf8_lossy(&n).trim().to_string();
            let path = target.split('?').next().unwrap_or(target);
            hs.push((
                "Authorization",
                auth::authorization(k.as_bytes(), &nonce, "GET", path),
            ));
        }
        self.plain_get(target, &hs)
    }

    fn plain_get(&self, target: &str, headers: &[(&str, String)]) -> anyhow::Result<Reply> {
        http::get(&self.addrs, &self.host, target, headers)
            .with_context(|| format!("GET {target} from {}", self.host))
    }

    /// The body of `GET target`; an error unless the status is 200.
    pub fn get_ok(&self, target: &str, headers: &[(&str, String)]) -> anyhow::Result<Vec<u8>> {
        ok(self.get(target, headers)?, target, &self.host)
    }

    /// The node's descriptors (msgpack, decoded).
    pub fn descriptors(&self) -> anyhow::Result<Descriptors> {
        let body = self.get_ok("/descriptors", &[("Accept", MSGPACK.to_string())])?;
        rmp_serde::from_slice(&body).context("decode descriptors")
    }
}

/// `r`'s body when it is a 200, else an error naming `target` at `host`.
fn ok(r: Reply, target: &str, host: &str) -> anyhow::Result<Vec<u8>> {
    if r.status != 200 {
        bail!(
            "GET {target} from {host}: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body).trim()
        );
    }
    Ok(r.body)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    const K: &[u8] = b"control secret, long enough";

    struct Up {
        addr: SocketAddr,
        stop: Arc<AtomicBool>,
        h: std::thread::JoinHandle<()>,
        _buf: morio::RegisteredBuffer,
    }

    impl Up {
        fn down(self) {
            self.stop.store(true, Ordering::Relaxed);
            self.h.join().unwrap();
        }
    }

    /// A service for an engine without a backend and one 4 KiB region.
    fn up(secret: Option<&[u8]>) -> Up {
        let e = IoEngine::new("ctl-test", morio::IoEngineConfig::new("127.0.0.1", 0)).unwrap();
        let buf = e.alloc_buffer(4096).unwrap();
        let d = Descriptors {
            engine: e.engine_desc().pack(),
            memory: vec![NamedDesc {
                name: "kv".into(),
                desc: buf.desc().pack(),
            }],
        };
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let handler = handler(Arc::new(e), &d, secret.map(AuthSecret::new), None).unwrap();
        let h = http::serve(l, stop.clone(), handler).unwrap();
        Up {
            addr,
            stop,
            h,
            _buf: buf,
        }
    }

    fn client(u: &Up, secret: Option<&[u8]>) -> Client {
        Client::new(&u.addr.to_string(), secret.map(AuthSecret::new)).unwrap()
    }

    #[test]
    fn endpoints_and_formats_without_a_secret() {
        let u = up(None);
        let c = client(&u, None);
        let r = c.get("/healthz", &[]).unwrap();
        assert_eq!((r.status, &r.body[..]), (503, &b"no backend\n"[..]));
        let m = c.get_ok("/metrics", &[]).unwrap();
        assert!(String::from_utf8(m).unwrap().contains("morio_backend_up 0"));
        let d = c.descriptors().unwrap();
        assert_eq!(d.memory[0].name, "kv");
        let j: serde_json::Value =
            serde_json::from_slice(&c.get_ok("/descriptors", &[]).unwrap()).unwrap();
        assert_eq!(j["engine"]["key"], "ctl-test");
        assert_eq!(j["memory"]["kv"]["size"], 4096);
        assert_eq!(j["memory"]["kv"]["loc"], "CPU");
        let packed = j["memory"]["kv"]["packed"].as_str().unwrap();
        assert_eq!(packed, auth::hex(&d.memory[0].desc));
        // `?format=` wins over Accept; an unknown format is a 400.
        let accept_json = [("Accept", JSON.to_string())];
        let p = c
            .get_ok("/descriptors?format=msgpack", &accept_json)
            .unwrap();
        assert_eq!(rmp_serde::from_slice::<Descriptors>(&p).unwrap(), d);
        let x = c.get(
            "/descriptors",
            &[("Accept", "application/vnd.msgpack".into())],
        );
        assert_eq!(x.unwrap().header("content-type"), Some(MSGPACK));
        assert_eq!(c.get("/descriptors?format=xml", &[]).unwrap().status, 400);
        let s: serde_json::Value =
            serde_json::from_slice(&c.get_ok("/stats", &[]).unwrap()).unwrap();
        assert_eq!(s["error"], "no backend");
        assert_eq!(c.get("/nope", &[]).unwrap().status, 404);
        u.down();
    }

    #[test]
    fn with_a_secret_guarded_endpoints_need_a_fresh_proof() {
        let u = up(Some(K));
        let outsider = client(&u, None);
        for p in ["/descriptors", "/stats", "/descriptors?format=msgpack"] {
            let r = outsider.get(p, &[]).unwrap();
            assert_eq!(r.status, 401, "{p}");
            assert_eq!(r.body, b"authentication required\n");
            assert_eq!(r.header("www-authenticate"), Some(auth::SCHEME));
        }
        // Open ones stay open.
        assert_eq!(outsider.get("/healthz", &[]).unwrap().status, 503);
        assert_eq!(outsider.get("/metrics", &[]).unwrap().status, 200);
        let member = client(&u, Some(K));
        assert_eq!(member.descriptors().unwrap().memory.len(), 1);
        assert_eq!(member.get("/stats", &[]).unwrap().status, 200);
        let wrong = client(&u, Some(b"another secret, long enough"));
        assert_eq!(wrong.get("/stats", &[]).unwrap().status, 401);
        // A proof made for one request is refused when replayed, and for another path.
        let n = String::from_utf8(outsider.get_ok("/nonce", &[]).unwrap()).unwrap();
        let a = auth::authorization(K, n.trim(), "GET", "/stats");
        let with = [("Authorization", a)];
        assert_eq!(outsider.get("/descriptors", &with).unwrap().status, 401);
        assert_eq!(outsider.get("/stats", &with).unwrap().status, 401);
        let n = String::from_utf8(outsider.get_ok("/nonce", &[]).unwrap()).unwrap();
        let with = [(
            "Authorization",
            auth::authorization(K, n.trim(), "GET", "/stats"),
        )];
        assert_eq!(outsider.get("/stats", &with).unwrap().status, 200);
        assert_eq!(
            outsider.get("/stats", &with).unwrap().status,
            401,
            "replayed"
        );
        u.down();
    }
}
