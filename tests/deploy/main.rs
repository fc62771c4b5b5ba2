//! The `deploy/` scripts, run for real: shellcheck, `--help` and bad options, `tune.sh` dry
//! run and `--apply` against fixture /proc and /sys trees built in a temporary directory,
//! `launch.sh --print` and `--unit`, and `verify.sh` on a pinned `morio-shard-0` thread of
//! this test process.
//!
//! One module per concern: `common` (paths, running a script, scratch directories),
//! `scripts` (what every script must do), `tune`, `launch`, `verify`, `plans` (the committed
//! testdata plans) and `containers` (the host check, the seccomp profile, the Kubernetes
//! example).

mod common;
mod containers;
mod launch;
mod plans;
mod scripts;
mod tune;
mod verify;
