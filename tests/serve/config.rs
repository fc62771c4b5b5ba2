//! `morio serve --dump-config` prints the commented default, and a bad config fails with a
//! message naming the bad setting.

use std::process::Command;

#[test]
fn dump_config_is_the_commented_default_and_bad_configs_fail_clearly() {
    let out = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["serve", "--dump-config"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("[engine]") && text.contains("# "), "{text}");
    let dir = std::env::temp_dir().join(format!("morio-serve-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("bad.toml");
    std::fs::write(
        &cfg,
        text.replace("num_data_conns = 8", "num_data_conns = 0"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_morio"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("num_data_conns"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
