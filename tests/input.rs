//! The binary against hostile input: the findings, each refused with exit code 2
//! and a short message naming the key; broken pipes that end quietly; excerpts, not
//! echoes, of huge input.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

fn strata() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strata"))
}

fn run(args: &[&str]) -> Output {
    strata().args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Each finding of the fuzz campaign (a panic, an abort, a wrap, a saturation) is now a
/// refusal naming the key and its limit.
#[test]
fn findings_are_refused_with_the_key_and_the_limit() {
    let cases: &[(&[&str], &str)] = &[
        (&["--set", "parallel.pp=65536", "--set", "parallel.vpp=65536"], "parallel."),
        (&["--set", "cluster.nic_gbps=5e-324"], "cluster.nic_gbps"),
        (&["--set", "cluster.switch_radix=2147483648"], "cluster.switch_radix"),
        (&["--set", "cluster.nics_per_node=4294967295"], "cluster.nics_per_node"),
        (&["--set", "parallel.global_batch=1048576"], "work budget"),
        (&["--set", "model.layers=100000"], "model.layers"),
        (&["--set", "model.hidden=4294967295"], "model.hidden"),
        (&["--set", "model.seq_len=2147483648"], "model.seq_len"),
        (&["--set", "cluster.nic_gbps=1e-15"], "cluster.nic_gbps"),
        (&["--set", "model.hidden=16777216", "--set", "model.ffn_hidden=67108864"], "model.hidden"),
        (&["--set", "parallel.global_batch=131072"], "work budget"),
    ];
    for cmd in ["inspect", "plan", "simulate"] {
        for (sets, key) in cases {
            let mut args = vec![cmd, "scenarios/gpt3-175b-1024xa100.toml"];
            args.extend_from_slice(sets);
            let o = run(&args);
            let e = stderr(&o);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
            assert!(e.contains(key) && e.len() < 2000, "{args:?}: {e}");
        }
    }
}

/// `strata plan … | head -1`: the reader goes away; the process ends quietly.
#[test]
fn a_closed_stdout_ends_quietly() {
    let mut child = strata()
        .args(["plan", "scenarios/gpt3-175b-1024xa100.toml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with('#'), "{line}");
    // The reader is dropped here: the rest of the program hits a closed pipe.
    let o = child.wait_with_output().unwrap();
    let e = stderr(&o);
    assert!(matches!(o.status.code(), Some(0) | Some(141)), "{:?}: {e}", o.status);
    assert!(e.is_empty(), "{e}");
}

/// An error printed to a closed stderr does not turn into a panic.
#[test]
fn a_closed_stderr_ends_quietly() {
    let mut child =
        strata().args(["inspect", "no-such-file.toml"]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    drop(child.stderr.take());
    let status = child.wait().unwrap();
    assert!(matches!(status.code(), Some(2) | Some(141)), "{status:?}");
}

/// A 3 MB line and a 60 KB plan file given as a scenario: excerpts, not echoes.
#[test]
fn errors_quote_excerpts_of_huge_input() {
    let dir = std::env::temp_dir().join(format!("strata-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let long = dir.join("long.toml");
    std::fs::write(&long, format!("[model]\nlayers = {}x\n", "9".repeat(3_000_000))).unwrap();
    let plan = dir.join("plan.json");
    let o = run(&["plan", "scenarios/tiny-gpt-cpu.toml", "--out", plan.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let huge_set = format!("model.name={}", "n".repeat(100_000));
    let huge_preset = format!("model.preset={}", "p".repeat(100_000));
    for args in [
        vec!["inspect", long.to_str().unwrap()],
        vec!["simulate", plan.to_str().unwrap()],
        vec!["inspect", "scenarios/tiny-gpt-cpu.toml", "--set", &huge_preset],
        vec!["inspect", "scenarios/tiny-gpt-cpu.toml", "--set", &huge_set, "--set", "model.layers=x"],
    ] {
        let o = run(&args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{}", &e[..e.len().min(500)]);
        assert!(e.len() < 2000, "{} bytes: {}…", e.len(), &e[..e.len().min(500)]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A build without the `cuda` feature (this test binary's) says so for every GPU path, exit 2.
#[test]
#[cfg(not(feature = "cuda"))]
fn gpu_paths_say_the_build_has_no_cuda() {
    for args in [
        &["kernels"][..],
        &["kernels", "--check"],
        &["train", "scenarios/tiny-gpt-cpu.toml", "--backend", "cuda"],
        &["compare", "scenarios/tiny-gpt-cpu.toml", "--backend", "cuda"],
        &["calibrate", "scenarios/tiny-gpt-cpu.toml", "--backend", "cuda"],
        &["probe", "--json"],
    ] {
        let o = run(args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains("built without CUDA") && e.contains("--features cuda"), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{args:?}: {e}");
    }
    let o = run(&["train", "scenarios/tiny-gpt-cpu.toml", "--backend", "tpu"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--backend \"tpu\""), "{}", stderr(&o));
}
