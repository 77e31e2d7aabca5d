//! The methods compared, the state each starts from and must end in, and their commands.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::args::Args;
use crate::floors::Floor;

/// The rchm release the benchmark builds (`cargo install --locked rcp-tools-rchm@VERSION`).
pub const RCHM_VERSION: &str = "0.41.0";
use crate::tree::{FS_GROUP, State};

/// What a method runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `find ROOT -printf '%U\n' >/dev/null`: stat every entry, change nothing.
    Floor,
    /// A floor of the machine (`floors.rs`): plain syscalls on the same parallel walk.
    Syscalls(crate::floors::Floor),
    /// The kubelet's pass, re-implemented (`kubelet.rs`).
    Kubelet,
    /// The kubelet's OnRootMismatch policy: a stat of the root.
    OnRootMismatch,
    /// `chown -R 1001:2000 ROOT`.
    ChownR,
    /// `chgrp -R 2000 ROOT && chmod -R g+rwX ROOT`.
    ChgrpChmod,
    /// rchm (crates.io `rcp-tools-rchm`, [`RCHM_VERSION`]): the same rule with
    /// `--group 2000 --mode 'f:ug+rw d:ug+rwx,g+s'`, in parallel.
    Rchm,
    /// `volprep apply` with extra flags.
    Apply(Vec<String>),
    /// `volprep check`.
    Check,
    /// `volprep apply` on a tree it prepared before (valid marker).
    Skip,
    /// `volprep apply` after a SIGKILL at this per cent of a full pass (of its entries, or of
    /// its time; runs as `Apply` with `--checkpoint-interval` set from the measured full pass).
    Resume(u32),
}

/// One row of the table: a method, its thread count and its start and end states.
#[derive(Debug, Clone)]
pub struct Method {
    /// `--methods` name and table name.
    pub id: &'static str,
    pub threads: Option<usize>,
    pub kind: Kind,
    pub start: State,
    /// The state the tree must be in afterwards, when the method promises one.
    pub expect: Option<State>,
    /// Exit code(s) meaning "ran as intended".
    pub ok_codes: &'static [i32],
}

/// What the volprep binary supports, found out from its `--help`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Features {
    /// `--progress-interval` exists (0 turns progress off).
    pub progress_interval: bool,
    /// `--verify full` exists (rescan even with a valid marker).
    pub verify_full: bool,
    /// `--checkpoint-interval` exists (resume checkpoints; `resume` sets it to 1/100 of a pass).
    pub checkpoint_interval: bool,
    /// `--load` exists: an explicit thread count runs with `--load full` (that many operations
    /// in flight), the default with volprep's own policy (adaptive on FUSE and CephFS).
    pub load: bool,
}

impl Features {
    pub fn detect(volprep: &Path) -> Features {
        let help = Command::new(volprep)
            .args(["apply", "--help"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        Features {
            progress_interval: help.contains("--progress-interval"),
            verify_full: help.contains("--verify"),
            checkpoint_interval: help.contains("--checkpoint-interval"),
            load: help.contains("--load"),
        }
    }
}

/// The methods to run, in order (every `full` comes before `resume`, which needs its time).
/// `remote`: slow storage or CephFS (no `progress` run there).
pub fn plan(args: &Args, features: Features, remote: bool) -> Vec<Method> {
    let max = *args.threads.iter().max().expect("non-empty thread list");
    let mut m = Vec::new();
    let one = |id, kind, start, expect, ok_codes| Method { id, threads: None, kind, start, expect, ok_codes };
    use State::{Golden, Prepared};
    m.push(one("floor", Kind::Floor, Golden, Some(Golden), &[0]));
    // The floors run at the largest thread count (volprep's own default, 32 on up to 8 cores,
    // for `default`), as `full` at that count does.
    let floor_threads = Some(if max == 0 { 32 } else { max });
    for (id, f, expect) in [
        ("read-floor", Floor::Read, Golden),
        ("unsafe-floor", Floor::Unsafe, Prepared),
        ("race-safe-floor", Floor::RaceSafe, Prepared),
    ] {
        m.push(Method { threads: floor_threads, ..one(id, Kind::Syscalls(f), Golden, Some(expect), &[0]) });
    }
    let mut check_threads = vec![1, max];
    check_threads.dedup();
    check_threads.retain(|&t| t != 0 || max == 0);
    for t in check_threads {
        m.push(Method { threads: Some(t), ..one("check", Kind::Check, Golden, Some(Golden), &[3]) });
    }
    m.push(one("kubelet", Kind::Kubelet, Golden, Some(Prepared), &[0]));
    m.push(one("kubelet-2nd", Kind::Kubelet, Prepared, Some(Prepared), &[0]));
    m.push(one("onrootmismatch", Kind::OnRootMismatch, Prepared, Some(Prepared), &[0]));
    m.push(one("onrootmismatch-1st", Kind::OnRootMismatch, Golden, Some(Prepared), &[0]));
    m.push(one("chown", Kind::ChownR, Golden, None, &[0]));
    m.push(one("chgrp", Kind::ChgrpChmod, Golden, None, &[0]));
    // Its result is compared with the kubelet's (a note), not required: rchm's `ug+rw` on a
    // setuid file whose chown cleared the bit does not put it back.
    m.push(one("rchm", Kind::Rchm, Golden, None, &[0]));
    for &t in &args.threads {
        m.push(Method { threads: Some(t), ..one("full", Kind::Apply(vec![]), Golden, Some(Prepared), &[0]) });
    }
    let rescan_flags = if features.verify_full { vec!["--verify".to_string(), "full".to_string()] } else { vec![] };
    for &t in &args.threads {
        m.push(Method {
            threads: Some(t),
            ..one("rescan", Kind::Apply(rescan_flags.clone()), Prepared, Some(Prepared), &[0])
        });
    }
    let at_max = |x: Method| Method { threads: Some(max), ..x };
    m.push(at_max(one("skip", Kind::Skip, Prepared, Some(Prepared), &[0])));
    m.push(at_max(one("resume", Kind::Resume(50), Golden, Some(Prepared), &[0])));
    m.push(at_max(one("resume80", Kind::Resume(80), Golden, Some(Prepared), &[0])));
    if features.progress_interval && !remote {
        // The same full pass with progress at its default interval (others run with it off).
        let every = vec!["--progress-interval".to_string(), "1s".to_string()];
        m.push(at_max(one("progress", Kind::Apply(every), Golden, Some(Prepared), &[0])));
    }
    m.retain(|x| args.wants(x.id));
    m
}

/// The table's thread count: 1 for the serial methods, `default` for volprep's own (0).
pub fn threads_label(t: Option<usize>) -> String {
    match t {
        None => "1".into(),
        Some(0) => "default".into(),
        Some(n) => n.to_string(),
    }
}

/// The table's name of a method.
pub fn label(id: &str) -> &'static str {
    match id {
        "floor" => "floor (find -printf %U)",
        "read-floor" => "read floor (getdents, statx)",
        "unsafe-floor" => "unsafe change floor (statx, fchownat, fchmodat by name)",
        "race-safe-floor" => "race-safe floor (O_PATH pin, statx, fchownat, fchmodat2, close)",
        "check" => "volprep check",
        "kubelet" => "kubelet",
        "kubelet-2nd" => "kubelet-2nd",
        "onrootmismatch" => "kubelet OnRootMismatch, restart",
        "onrootmismatch-1st" => "kubelet OnRootMismatch, first walk",
        "rchm" => "rchm",
        "chown" => "chown -R",
        "chgrp" => "chgrp -R && chmod -R g+rwX",
        "full" => "volprep full",
        "rescan" => "volprep rescan",
        "skip" => "volprep skip",
        "resume" => "volprep resume (kill at 50 %)",
        "resume80" => "volprep resume (kill at 80 %)",
        "progress" => "volprep full +progress 1s",
        _ => "?",
    }
}

/// How to start a method's child.
pub struct Runner<'a> {
    /// This benchmark's own executable (for `__kubelet`, `__onrootmismatch`).
    pub exe: &'a Path,
    pub volprep: &'a Path,
    pub features: Features,
    /// The rchm binary, when built.
    pub rchm: Option<&'a Path>,
}

impl Runner<'_> {
    /// `volprep SUB --fs-group 2000 --threads N --report FILE [flags] ROOT` (no `--threads`
    /// when `threads` is 0: volprep's own default).
    pub fn volprep(&self, sub: &str, threads: usize, report: &Path) -> Command {
        let mut c = Command::new(self.volprep);
        c.arg(sub).args(["--fs-group", &FS_GROUP.to_string()]);
        if threads > 0 {
            c.args(["--threads", &threads.to_string()]);
            if self.features.load {
                c.args(["--load", "full"]);
            }
        }
        c.arg("--report").arg(report);
        c.env_remove("RUST_LOG");
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("VOLPREP_") {
                c.env_remove(k);
            }
        }
        c
    }

    /// The command for `m` on `root`; `report` receives volprep's JSON report (or the
    /// kubelet re-implementation's `{"entries":N}`). `progress_off` adds
    /// `--progress-interval 0` where it exists.
    pub fn command(&self, m: &Method, root: &Path, report: &Path) -> (Command, Option<PathBuf>) {
        let threads = m.threads.unwrap_or(1);
        let own = matches!(&m.kind, Kind::Apply(x) if x.iter().any(|a| a == "--progress-interval"));
        let quiet = self.features.progress_interval && m.id != "progress" && !own;
        let volprep = |sub: &str, extra: &[String]| {
            let mut c = self.volprep(sub, threads, report);
            if quiet {
                c.args(["--progress-interval", "0"]);
            }
            c.args(extra).arg(root);
            (c, Some(report.to_path_buf()))
        };
        let gid = FS_GROUP.to_string();
        match &m.kind {
            Kind::Floor => {
                let mut c = Command::new("find");
                c.arg(root).args(["-printf", "%U\\n"]);
                (c, None)
            }
            Kind::Syscalls(f) => {
                let mut c = Command::new(self.exe);
                c.args(["__floor", f.name()]).arg(root).arg(&gid).arg(threads.to_string());
                (c, None)
            }
            Kind::Kubelet | Kind::OnRootMismatch => {
                let sub = if m.kind == Kind::Kubelet { "__kubelet" } else { "__onrootmismatch" };
                let mut c = Command::new(self.exe);
                c.arg(sub).arg(root).arg(&gid);
                (c, None)
            }
            Kind::ChownR => {
                let mut c = Command::new("chown");
                c.args(["-R", &format!("1001:{gid}")]).arg(root);
                (c, None)
            }
            Kind::ChgrpChmod => {
                let mut c = Command::new("sh");
                c.args(["-c", "chgrp -R \"$1\" \"$2\" && chmod -R g+rwX \"$2\"", "sh", &gid]).arg(root);
                (c, None)
            }
            Kind::Rchm => {
                let mut c = Command::new(self.rchm.unwrap_or(Path::new("rchm")));
                c.args(["--group", &gid, "--mode", "f:ug+rw d:ug+rwx,g+s"]).arg(root);
                (c, None)
            }
            Kind::Apply(extra) => volprep("apply", extra),
            Kind::Check => volprep("check", &[]),
            Kind::Skip | Kind::Resume(_) => volprep("apply", &[]),
        }
    }
}
