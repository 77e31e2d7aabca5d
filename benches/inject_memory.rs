//! `cargo bench --bench inject_memory`: `volprep inject`'s peak memory (`wait4`'s maxrss of the
//! child) and time on generated inputs: a stream of 50,047 small Deployments (about 30 MB), one
//! 60 MB ConfigMap of 2.4 million keys, one 60 MB ConfigMap holding one literal block, a `List`
//! of Deployments just under the largest document inject rewrites (2 MiB), and a 15 MB `List`
//! (refused, left as it is). Prints each peak and its multiple of the input, and fails (exit 1)
//! when a peak breaks its bound: the stream within 256 MiB, a document inject leaves alone or
//! refuses within 4x its size plus 16 MiB, the 2 MiB List within 256 MiB. `-- --smoke` runs a
//! tenth of the stream and the ConfigMaps (the stream's bound scaled).

use std::fmt::Write as _;
use std::fs;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_volprep");

fn deployment(i: usize, out: &mut String) {
    let _ = write!(
        out,
        "---\n# Source: chart/templates/deploy-{i}.yaml\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app-{i}\n  labels: {{app: app-{i}}}\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: app-{i}}}\n  template:\n    metadata:\n      labels: {{app: app-{i}}}\n    spec:\n      securityContext:\n        fsGroup: 1000\n      containers:\n        - name: app\n          image: registry.example.com/app:1.0\n          args: [\"--port=8080\", \"--verbose\"]\n          volumeMounts:\n            - name: data\n              mountPath: /data\n      volumes:\n        - name: data\n          persistentVolumeClaim:\n            claimName: data-{i}\n"
    );
}

fn stream(docs: usize) -> String {
    let mut s = String::new();
    for i in 0..docs {
        deployment(i, &mut s);
    }
    s
}

/// A ConfigMap of about `bytes`: many keys, or one literal block.
fn config_map(bytes: usize, keys: bool) -> String {
    let mut s = String::from("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n");
    if !keys {
        s.push_str("  big: |\n");
    }
    let mut i = 0;
    while s.len() < bytes {
        if keys {
            let _ = writeln!(s, "  key{i}: value-{i}-abcdefgh");
        } else {
            let _ = writeln!(s, "    line {i} of a large embedded file");
        }
        i += 1;
    }
    s
}

/// A `List` of Deployments of at most `bytes`.
fn list(bytes: usize) -> String {
    let mut s = String::from("apiVersion: v1\nkind: List\nitems:\n");
    for i in 0.. {
        let mut d = String::new();
        deployment(i, &mut d);
        let item: String = d
            .lines()
            .filter(|l| !l.starts_with('#') && *l != "---")
            .enumerate()
            .map(|(n, l)| format!("{}{l}\n", if n == 0 { "- " } else { "  " }))
            .collect();
        if s.len() + item.len() > bytes {
            break;
        }
        s.push_str(&item);
    }
    s
}

/// Runs `volprep inject FILE` (stdout to /dev/null): peak RSS in bytes, seconds, exit code.
/// The child is reaped by `wait4` (for its own rusage), not by `Child::wait`.
#[allow(clippy::zombie_processes)]
fn measure(file: &Path) -> (u64, f64, i32) {
    let start = Instant::now();
    let child = Command::new(BIN)
        .args(["inject"])
        .arg(file)
        .env("VOLPREP_LOG_LEVEL", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn volprep");
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the pid is our child, waited for once.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4");
    let code = std::process::ExitStatus::from_raw(status).code().unwrap_or(-1);
    (usage.ru_maxrss as u64 * 1024, start.elapsed().as_secs_f64(), code)
}

/// A case: its name, the input's maker and the peak's bound (0: 4x the input plus 16 MiB).
type Case = (&'static str, Box<dyn Fn() -> String>, u64);

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let scale = if smoke { 10 } else { 1 };
    let dir = tempfile::tempdir().expect("tempdir");
    const MIB: u64 = 1 << 20;
    // Each input is made when its turn comes and dropped before volprep starts: a child's
    // maxrss counts what it shared with this process when forked.
    let cases: Vec<Case> = vec![
        ("stream of small Deployments", Box::new(move || stream(50_047 / scale)), 256 * MIB / scale as u64),
        ("ConfigMap, many keys", Box::new(move || config_map(60_000_000 / scale, true)), 0),
        ("ConfigMap, one literal block", Box::new(move || config_map(60_000_000 / scale, false)), 0),
        ("List just under 2 MiB (rewritten)", Box::new(|| list(2 * MIB as usize - 4096)), 256 * MIB),
        ("List of 15 MB (refused)", Box::new(|| list(15_000_000)), 0),
    ];
    let mut failed = false;
    println!("{:<36} {:>10} {:>10} {:>9} {:>8} {:>5}", "input", "size MiB", "peak MiB", "x input", "seconds", "exit");
    for (name, text, bound) in cases {
        let file = dir.path().join("in.yaml");
        let size = {
            let text = text();
            fs::write(&file, &text).expect("write input");
            text.len() as u64
        };
        let (peak, secs, code) = measure(&file);
        let bound = if bound == 0 { 4 * size + 16 * MIB } else { bound };
        let over = peak > bound;
        failed |= over;
        println!(
            "{name:<36} {:>10.1} {:>10.1} {:>9.1} {secs:>8.2} {code:>5}{}",
            size as f64 / MIB as f64,
            peak as f64 / MIB as f64,
            peak as f64 / size as f64,
            if over { format!("  OVER the bound of {} MiB", bound / MIB) } else { String::new() }
        );
    }
    if failed {
        std::process::exit(1);
    }
}
