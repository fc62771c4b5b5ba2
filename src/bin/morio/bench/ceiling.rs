//! The raw-TCP ceiling: plain blocking std sockets, one stream per lane, sender threads pinned
//! round robin to the initiator's CPUs and receiver threads to the target's, each stream moving
//! an equal share with 4 MiB writes and reads from and into its own buffer of that share's
//! size (memory to memory, like the engine; not a cache-hot scratch buffer reused). GB/s = bytes / 1e9 / seconds from the first
//! write to the last receiver's 1-byte ack, measured on the initiator.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

/// Bytes per write and per read.
pub const IO_BYTES: usize = 4 << 20;
/// How long any single step may stall before the ceiling gives up.
const STALL: Duration = Duration::from_secs(60);

/// The measured ceiling.
#[derive(Serialize, Debug, Clone)]
pub struct Ceiling {
    /// Parallel streams (= --num-data-conns).
    pub streams: usize,
    /// Bytes moved in all.
    pub bytes: u64,
    /// First write to last ack.
    pub seconds: f64,
    /// bytes / 1e9 / seconds.
    pub gbps: f64,
    /// When it was measured relative to the rows.
    pub measured: &'static str,
    /// Raw TCP round trip of 8 bytes between pinned threads: p50 (µs), the latency floor.
    pub rtt_p50_us: Option<f64>,
    /// Its p99 (µs).
    pub rtt_p99_us: Option<f64>,
    /// The same round trip with both threads busy-polling non-blocking sockets instead of
    /// sleeping in `recv`: p50 (µs), the floor for spinning shards and waiters.
    pub rtt_spin_p50_us: Option<f64>,
    /// Its p99 (µs).
    pub rtt_spin_p99_us: Option<f64>,
}

/// Round trips the latency floor measures.
const ECHO_ROUNDS: usize = 5000;

/// Fill `m` from `s`: a blocking read, or (`spin`) a busy poll of a non-blocking socket.
fn recv_exact(s: &mut TcpStream, m: &mut [u8], spin: bool) -> std::io::Result<()> {
    if !spin {
        return s.read_exact(m);
    }
    let t0 = Instant::now();
    let mut got = 0;
    while got < m.len() {
        match s.read(&mut m[got..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if t0.elapsed() > STALL {
                    return Err(ErrorKind::TimedOut.into());
                }
                std::hint::spin_loop();
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Target side of the latency floor: echo 8-byte messages on one connection from a thread
/// pinned to the target's first CPU, until the peer closes; `spin` busy-polls.
pub fn serve_echo(host: IpAddr, cpus: Option<Vec<usize>>, spin: bool) -> anyhow::Result<u16> {
    let l = TcpListener::bind((host, 0)).context("echo: bind")?;
    let port = l.local_addr()?.port();
    std::thread::Builder::new()
        .name("ceiling-echo".into())
        .spawn(move || {
            pin_nth(&cpus, 0);
            let Ok((mut s, _)) = l.accept() else { return };
            let _ = s.set_nodelay(true);
            let _ = s.set_read_timeout(Some(STALL));
            if spin && s.set_nonblocking(true).is_err() {
                return;
            }
            let mut m = [0u8; 8];
            while recv_exact(&mut s, &mut m, spin).is_ok() && s.write_all(&m).is_ok() {}
        })
        .context("echo: spawn")?;
    Ok(port)
}

/// Initiator side of the latency floor: (p50, p99) in µs of 8-byte round trips; `spin`
/// busy-polls (the echo side must too, or it is not the floor it claims).
pub fn ping(addr: SocketAddr, cpus: Option<Vec<usize>>, spin: bool) -> anyhow::Result<(f64, f64)> {
    pin_nth(&cpus, 0);
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(10)).context("echo: connect")?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(STALL))?;
    s.set_nonblocking(spin)?;
    let mut m = [7u8; 8];
    let mut rtts = Vec::with_capacity(ECHO_ROUNDS);
    for i in 0..ECHO_ROUNDS + ECHO_ROUNDS / 10 {
        let t = Instant::now();
        s.write_all(&m).context("echo: send")?;
        recv_exact(&mut s, &mut m, spin).context("echo: receive")?;
        if i >= ECHO_ROUNDS / 10 {
            rtts.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    rtts.sort_by(f64::total_cmp);
    let at = |q: f64| rtts[((rtts.len() - 1) as f64 * q) as usize];
    Ok((at(0.5), at(0.99)))
}

/// Pin the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::other(format!("CPU {cpu} out of range")));
    }
    // SAFETY: a zeroed cpu_set_t is valid, CPU_SET is bounds-checked above, and
    // sched_setaffinity(0, ..) only reads the set we own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn pin_nth(cpus: &Option<Vec<usize>>, i: usize) {
    if let Some(c) = cpus.as_ref().filter(|c| !c.is_empty()) {
        if let Err(e) = pin_current_thread(c[i % c.len()]) {
            log::warn!("ceiling: cannot pin thread {i}: {e}");
        }
    }
}

/// Target side: listen on `host`, accept `streams` connections (each served by a pinned
/// thread that reads `bytes_per_stream` bytes, then acks with one byte). Returns the port and
/// a handle that ends when every receiver has.
pub fn serve(
    host: IpAddr,
    streams: usize,
    bytes_per_stream: u64,
    cpus: Option<Vec<usize>>,
) -> anyhow::Result<(u16, JoinHandle<anyhow::Result<()>>)> {
    // Destinations are allocated and touched before the port is handed out, so the timed
    // part moves bytes only.
    let mut dests: Vec<Vec<u8>> = (0..streams)
        .map(|_| vec![0xA5u8; bytes_per_stream as usize])
        .collect();
    let l = TcpListener::bind((host, 0)).context("ceiling: bind")?;
    let port = l.local_addr()?.port();
    l.set_nonblocking(true)?;
    let h = std::thread::Builder::new()
        .name("ceiling-accept".into())
        .spawn(move || -> anyhow::Result<()> {
            let t0 = Instant::now();
            let mut rx = Vec::new();
            while rx.len() < streams {
                match l.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(false)?;
                        let (i, cpus) = (rx.len(), cpus.clone());
                        let dest = dests.pop().unwrap_or_default();
                        rx.push(std::thread::spawn(move || {
                            pin_nth(&cpus, i);
                            receive(s, dest)
                        }));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        if t0.elapsed() > STALL {
                            bail!("ceiling: only {} of {streams} streams connected", rx.len());
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => return Err(e).context("ceiling: accept"),
                }
            }
            for h in rx {
                h.join()
                    .map_err(|_| anyhow::anyhow!("ceiling receiver panicked"))??;
            }
            Ok(())
        })
        .context("ceiling: spawn")?;
    Ok((port, h))
}

fn receive(mut s: TcpStream, mut dest: Vec<u8>) -> anyhow::Result<()> {
    s.set_read_timeout(Some(STALL))?;
    let bytes = dest.len();
    let mut got = 0usize;
    while got < bytes {
        let want = (bytes - got).min(IO_BYTES);
        let k = s
            .read(&mut dest[got..got + want])
            .context("ceiling: receive")?;
        if k == 0 {
            bail!("ceiling: stream closed after {got} of {bytes} bytes");
        }
        got += k;
    }
    s.write_all(&[1]).context("ceiling: ack")?;
    Ok(())
}

/// Initiator side: connect `streams` streams to `addr`, then send `bytes_per_stream` on each
/// from pinned threads released together, and time first write to last ack.
pub fn send(
    addr: SocketAddr,
    streams: usize,
    bytes_per_stream: u64,
    cpus: Option<Vec<usize>>,
) -> anyhow::Result<Ceiling> {
    let socks = (0..streams)
        .map(|_| {
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(STALL))?;
            s.set_write_timeout(Some(STALL))?;
            Ok(s)
        })
        .collect::<std::io::Result<Vec<_>>>()
        .context("ceiling: connect")?;
    let go = Arc::new(Barrier::new(streams));
    let threads: Vec<_> = socks
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            let (go, cpus) = (go.clone(), cpus.clone());
            std::thread::spawn(move || -> anyhow::Result<(Instant, Instant)> {
                pin_nth(&cpus, i);
                let data = vec![0x5Au8; bytes_per_stream as usize];
                go.wait();
                let start = Instant::now();
                for window in data.chunks(IO_BYTES) {
                    s.write_all(window).context("ceiling: send")?;
                }
                let mut ack = [0u8; 1];
                s.read_exact(&mut ack).context("ceiling: wait for ack")?;
                Ok((start, Instant::now()))
            })
        })
        .collect();
    let mut spans = Vec::new();
    for t in threads {
        spans.push(
            t.join()
                .map_err(|_| anyhow::anyhow!("ceiling sender panicked"))??,
        );
    }
    let first = spans.iter().map(|s| s.0).min();
    let last = spans.iter().map(|s| s.1).max();
    let (Some(first), Some(last)) = (first, last) else {
        bail!("ceiling: no streams");
    };
    let seconds = (last - first).as_secs_f64().max(1e-9);
    let bytes = bytes_per_stream * streams as u64;
    Ok(Ceiling {
        streams,
        bytes,
        seconds,
        gbps: bytes as f64 / 1e9 / seconds,
        measured: "after the rows",
        rtt_p50_us: None,
        rtt_p99_us: None,
        rtt_spin_p50_us: None,
        rtt_spin_p99_us: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_over_loopback() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let (port, h) = serve(ip, 3, 5 << 20, None).unwrap();
        let c = send(SocketAddr::new(ip, port), 3, 5 << 20, Some(vec![0])).unwrap();
        h.join().unwrap().unwrap();
        assert_eq!((c.streams, c.bytes), (3, 15 << 20));
        assert!(c.gbps > 0.0);
    }
}
