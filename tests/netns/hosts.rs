//! How engines see the hosts they run on: two pods of one host (a PID namespace each) fall
//! back from the same-host transport to TCP, and an engine listening on every interface
//! advertises the address its peers reach.

use std::process::Command;
use std::time::Duration;

use crate::common::*;
use crate::net::{ip, Net};

/// Two processes of one host as pods (a network and a PID namespace each, as Kubernetes
/// gives them): the same-host transport cannot prove the peer (its pid names nothing here),
/// so `auto` falls back to TCP, saying so in one log line, and moves verified bytes, while
/// `require` fails with the reason. (`morio bench`'s two roles, the target under `unshare`.)
#[test]
fn engines_in_separate_pid_namespaces_fall_back_to_tcp() {
    use std::io::BufRead;
    let Some(net) = Net::new() else { return };
    if Command::new("unshare").arg("--version").output().is_err() {
        eprintln!("skipped: no unshare(1) here");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_morio");
    for (mode, works) in [("auto", true), ("require", false)] {
        let mut target = Command::new("ip")
            .args([
                "netns",
                "exec",
                &net.ns[0],
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
            ])
            .args([
                bin, "bench", "--role", "target", "--no-pin", "--shards", "1",
            ])
            .args(["--host", &net.v4[0]])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(target.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line
            .strip_prefix("MORIO_BENCH_TARGET ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        let json =
            std::env::temp_dir().join(format!("morio-netns-pod-{}.json", std::process::id()));
        let out = Command::new("ip")
            .args(["netns", "exec", &net.ns[1]])
            .args([
                bin,
                "bench",
                "--role",
                "initiator",
                "--no-pin",
                "--shards",
                "1",
            ])
            .args([
                "--host",
                &net.v4[1],
                "--connect",
                &format!("{}:{port}", net.v4[0]),
            ])
            .args([
                "--iters",
                "8",
                "--op-type",
                "write",
                "--buffer-size",
                "64KiB",
            ])
            .args(["--transfer-batch-size", "16", "--enable-batch-transfer"])
            .args(["--same-host", mode, "--no-ceiling", "--no-floor", "--json"])
            .arg(&json)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let _ = target.kill();
        let t = target.wait_with_output().unwrap();
        let terr = String::from_utf8_lossy(&t.stderr);
        if works {
            assert!(out.status.success(), "{err}");
            let rep: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
            let row = &rep["rows"][0];
            assert_eq!(row["transport"], "tcp", "{row}");
            assert_eq!(row["validated"], true, "{row}");
            let said = terr.matches("same-host transport with").count();
            assert_eq!(said, 1, "one log line for the fallback:\n{terr}");
            assert!(terr.contains("using TCP"), "{terr}");
        } else {
            assert!(!out.status.success(), "require moved bytes: {err}");
            assert!(err.contains("same-host transport required"), "{err}");
        }
        let _ = std::fs::remove_file(&json);
    }
}

/// An engine listening on every interface (MORI-IO's empty host, `0.0.0.0`, `::`) advertises
/// the address its default route leaves from, and a peer on the other host reaches it there.
#[test]
fn an_engine_on_all_interfaces_advertises_the_address_peers_reach() {
    let Some(net) = Net::new() else { return };
    for i in 0..2 {
        let ns = &net.ns[i];
        ip(&["-n", ns, "route", "add", "default", "via", &net.v4[1 - i]]).unwrap();
        ip(&[
            "-n",
            ns,
            "-6",
            "route",
            "add",
            "default",
            "via",
            &net.v6[1 - i],
        ])
        .unwrap();
    }
    for (host, v6) in [("", false), ("0.0.0.0", false), ("::", true)] {
        let tag = format!("nsall{}", host.len());
        let a = net.engine(0, &format!("{tag}_a"), host, cfg(Duration::from_secs(20)));
        let want = if v6 { &net.v6[0] } else { &net.v4[0] };
        assert_eq!(&a.engine_desc().host, want, "listening on {host:?}");
        let b_host = if v6 { &net.v6[1] } else { &net.v4[1] };
        let b = net.engine(1, &format!("{tag}_b"), b_host, cfg(Duration::from_secs(20)));
        b.register_remote_engine(&a.engine_desc()).unwrap();
        a.register_remote_engine(&b.engine_desc()).unwrap();
        round_trips(&b, &a, 20);
    }
}
