//! The real-app matrix of tests/apps.rs: each app creates its data as its own uid, the volume is
//! staged as users have it (restored as another uid, or walked once by a kubelet with another
//! group), volprep runs as root with a setting, then the app runs as its uid with the group as
//! a supplementary group and serves a read and a write. Every process an app starts is in a
//! process group of its own, killed on drop (panics included). The expectations are the
//! README's table of apps: the test reads the setting to run and the outcome of the kubelet's
//! rule from it.

use std::fmt;
use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::mounts::{Tmpfs, tool};
use super::{as_user, privileged, run, volprep};

/// The app's uid and group: the pod's `runAsUser` and the group it gets (`supplementalGroups`).
pub const APP: u32 = 2000;
/// Who a restored (or migrated) volume's files belong to.
pub const RESTORED_AS: u32 = 3000;
/// The group an earlier cluster's kubelet walked the volume with.
pub const EARLIER_GROUP: u32 = 4000;
/// The app user's home in the passwd database (`.ci/apps.sh`): the ssh test binds its volume
/// there, in a mount namespace of its own.
pub const HOME: &str = "/var/lib/volprep-app";
/// The second member of the app's group (`.ci/apps.sh`): a shared group, as an fsGroup is.
pub const PEER: &str = "volprep-peer";
/// Where the matrix's lines are appended when set (`.ci/run` prints them).
pub const SUMMARY_ENV: &str = "VOLPREP_APPS_SUMMARY";

/// How a volume came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// Restored from a backup or migrated from another system: every entry belongs to
    /// [`RESTORED_AS`].
    Restored,
    /// The app's own, but an earlier kubelet walked it with [`EARLIER_GROUP`] (dirs 2770,
    /// files 0660, or more).
    Walked,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Case::Restored => "restored",
            Case::Walked => "walked",
        })
    }
}

/// What volprep runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// `--fs-group` alone: the kubelet's rule.
    KubeletRule,
    /// The README's setting for the app (with `--owner` on a restored volume).
    Documented,
}

/// What the app did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Started, served the read and the write, and said nothing about modes.
    Works,
    /// Served both, with a warning about modes or owners.
    Warns,
    /// Did not start, or failed the read or the write.
    Fails,
}

/// One app run: whether it started, read and wrote, and everything it said.
#[derive(Debug, Default)]
pub struct Probe {
    pub started: Option<bool>,
    pub read: Option<bool>,
    pub write: Option<bool>,
    pub warned: bool,
    pub transcript: String,
}

impl Probe {
    fn step(slot: &mut Option<bool>, transcript: &mut String, what: &str, ok: bool, said: &str) -> bool {
        *slot = Some(ok);
        transcript.push_str(&format!("--- {what}: {}\n{}\n", if ok { "ok" } else { "FAILED" }, said.trim_end()));
        ok
    }

    /// The app started (`ok`), saying `said`. Returns `ok`.
    pub fn started(&mut self, ok: bool, said: &str) -> bool {
        Self::step(&mut self.started, &mut self.transcript, "start", ok, said)
    }

    pub fn read(&mut self, ok: bool, said: &str) -> bool {
        Self::step(&mut self.read, &mut self.transcript, "read", ok, said)
    }

    pub fn write(&mut self, ok: bool, said: &str) -> bool {
        Self::step(&mut self.write, &mut self.transcript, "write", ok, said)
    }

    /// Something else the app said (a log), kept for the outcome's text.
    pub fn said(&mut self, what: &str, text: &str) {
        self.transcript.push_str(&format!("--- {what}\n{}\n", text.trim_end()));
    }

    /// The app warned about modes or owners when the transcript holds `pattern`.
    pub fn warns_on(&mut self, pattern: &str) {
        self.warned |= self.transcript.contains(pattern);
    }

    pub fn outcome(&self) -> Outcome {
        let all = [self.started, self.read, self.write];
        if all.iter().any(|s| *s != Some(true)) {
            Outcome::Fails
        } else if self.warned {
            Outcome::Warns
        } else {
            Outcome::Works
        }
    }

    /// `started ✔ read ✔ write ✔`.
    pub fn steps(&self) -> String {
        let mark = |s: Option<bool>| match s {
            Some(true) => "✔",
            Some(false) => "✗",
            None => "-",
        };
        format!("started {} read {} write {}", mark(self.started), mark(self.read), mark(self.write))
    }
}

/// What the README says of one app.
#[derive(Debug, Clone)]
pub struct Row {
    /// The app's name as its first cell starts (`PostgreSQL 15`).
    pub app: String,
    /// The outcome under the kubelet's rule on a restored volume and on a walked one, with
    /// the text the app's output must hold (for ✗ and ⚠).
    pub restored: (Outcome, String),
    pub walked: (Outcome, String),
    /// The volprep flags the README gives (`--modes app-safe`; `TMPDIR` stands for the app's
    /// temp dir).
    pub setting: String,
}

/// The heading of the README's table of apps.
pub const README_SECTION: &str = "## Apps that insist on private modes";

/// The rows of the README's table of apps.
pub fn readme_rows() -> Vec<Row> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).expect("README.md");
    let at = text.find(README_SECTION).unwrap_or_else(|| panic!("README.md: no {README_SECTION:?}"));
    let rows: Vec<&str> =
        text[at..].lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')).skip(2).collect();
    rows.iter()
        .map(|row| {
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), 5, "README.md: a row of the table of apps has 5 cells: {row}");
            let expect = |cell: &str| -> (Outcome, String) {
                let (mark, text) = cell.split_at(cell.chars().next().map_or(0, char::len_utf8));
                let text = text.trim().trim_matches('`').to_string();
                match mark {
                    "✔" => (Outcome::Works, text),
                    "⚠" => (Outcome::Warns, text),
                    "✗" => (Outcome::Fails, text),
                    _ => panic!("README.md: a cell of the table of apps starts with ✔, ⚠ or ✗: {cell:?}"),
                }
            };
            Row {
                app: cells[0].to_string(),
                restored: expect(cells[2]),
                walked: expect(cells[3]),
                setting: cells[4].trim_matches('`').to_string(),
            }
        })
        .collect()
}

/// The README's row of the app whose name starts with `app`.
pub fn readme_row(app: &str) -> Row {
    let rows = readme_rows();
    rows.iter()
        .find(|r| r.app.split_whitespace().next() == Some(app))
        .cloned()
        .unwrap_or_else(|| panic!("README.md: no row for {app} in the table of apps"))
}

/// The gate of the app tests (each `#[ignore]`d with what it needs): root, the tools, and the
/// users `.ci/apps.sh` makes. Run anyway where one is missing, the test fails, naming it.
#[track_caller]
pub fn gate(tools: &[&str]) {
    privileged(&["cp", "chown", "unshare", "setpriv"]);
    let mut missing: Vec<String> = tools.iter().filter(|t| app_tool(t).is_none()).map(|t| format!("`{t}`")).collect();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    if !passwd.lines().any(|l| l.split(':').nth(2) == Some("2000") && l.split(':').nth(5) == Some(HOME)) {
        missing.push(format!("user 2000 with home {HOME}"));
    }
    if !group
        .lines()
        .any(|l| l.split(':').nth(2) == Some("2000") && l.split(':').nth(3).is_some_and(|m| m.contains(PEER)))
    {
        missing.push(format!("group 2000 with member {PEER}"));
    }
    if !Path::new(HOME).is_dir() {
        missing.push(format!("directory {HOME}"));
    }
    if !missing.is_empty() {
        let test = std::thread::current().name().unwrap_or("?").to_string();
        panic!("{test}: app test cannot run: {} missing (source .ci/apps.sh)", missing.join(", "));
    }
}

/// A tool of an app, as the Debian packages install it: in PostgreSQL's bin directory (the
/// newest version's: Debian's wrappers on PATH want a cluster), then the system's directories
/// (the app runs as another user, who may not reach a tool of root's PATH), then PATH.
pub fn app_tool(name: &str) -> Option<PathBuf> {
    let pg = || {
        let mut dirs: Vec<PathBuf> =
            std::fs::read_dir("/usr/lib/postgresql").ok()?.flatten().map(|e| e.path()).collect();
        dirs.sort();
        dirs.into_iter().rev().map(|d| d.join("bin").join(name)).find(|p| p.is_file())
    };
    let system =
        || ["/usr/sbin", "/usr/bin", "/sbin", "/bin"].iter().map(|d| Path::new(d).join(name)).find(|p| p.is_file());
    pg().or_else(system).or_else(|| tool(name))
}

/// `app_tool`, or a panic naming it.
pub fn exe(name: &str) -> PathBuf {
    app_tool(name).unwrap_or_else(|| panic!("{name}: not found (source .ci/apps.sh)"))
}

/// A command for `tool` run as the app: uid and group [`APP`], the group as its supplementary
/// group, no capabilities, a clean environment (HOME is the lab's home unless set again).
pub fn as_app(lab: &Lab, tool: &str) -> Command {
    let mut c = Command::new(exe(tool));
    c.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", &lab.home)
        .env("LANG", "C.UTF-8")
        .current_dir(&lab.home);
    as_user(&mut c, APP, APP, &[APP]);
    c
}

/// What a command printed (stdout and stderr) and whether it succeeded.
#[derive(Debug)]
pub struct Said {
    pub ok: bool,
    pub text: String,
}

/// Runs `cmd` to completion in a process group of its own, killed after `limit`.
pub fn say(cmd: &mut Command, limit: Duration) -> Said {
    let line = format!("{cmd:?}");
    let out = tempfile::NamedTempFile::new().expect("output file");
    // One open file for both (a dup shares the offset): stdout and stderr interleave, as on a
    // terminal, never overwrite each other.
    let file = out.reopen().expect("reopen");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("dup"))
        .stderr(file)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {line}: {e}"));
    let mut group = Group { child, name: line.clone() };
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = group.child.try_wait().expect("wait") {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(group);
    let mut text = std::fs::read_to_string(out.path()).unwrap_or_default();
    if status.is_none() {
        text.push_str(&format!("\n(killed after {limit:?})"));
    }
    Said { ok: status.is_some_and(|s| s.success()), text }
}

/// [`say`] with a 60 s limit.
pub fn said(cmd: &mut Command) -> Said {
    say(cmd, Duration::from_secs(60))
}

/// A process group: killed (SIGKILL, the whole group) and reaped on drop.
struct Group {
    child: Child,
    name: String,
}

impl Drop for Group {
    fn drop(&mut self) {
        let pgid = self.child.id() as libc::pid_t;
        // SAFETY: kill takes plain integers: no memory is involved.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        if let Err(e) = self.child.wait() {
            eprintln!("{}: wait: {e}", self.name);
        }
    }
}

/// A long-running app process (a server), its output in a log file. Stopped gracefully by
/// [`Daemon::stop`]; its whole process group is killed on drop, whatever happened.
pub struct Daemon {
    group: Group,
    log: PathBuf,
}

impl Daemon {
    pub fn spawn(cmd: &mut Command, log: &Path) -> Daemon {
        let file = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let line = format!("{cmd:?}");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {line}: {e}"));
        Daemon { group: Group { child, name: line }, log: log.to_path_buf() }
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.group.child.try_wait().expect("wait").is_none()
    }

    /// Waits up to 30 s for `ready`, while the process lives. Returns whether it became ready.
    pub fn wait_ready(&mut self, mut ready: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if ready() {
                return true;
            }
            if !self.alive() {
                return ready();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` to the process group and waits up to 15 s for the process to end (then
    /// the group is killed). Returns the log.
    pub fn stop(mut self, signal: libc::c_int) -> String {
        let pgid = self.group.child.id() as libc::pid_t;
        // SAFETY: kill takes plain integers: no memory is involved.
        unsafe { libc::kill(-pgid, signal) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.log()
    }
}

/// A free TCP port on 127.0.0.1 (as free as a port the kernel just gave out can be).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// Whether something accepts connections on 127.0.0.1:`port`.
pub fn listening(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
}

/// The app's world for one test: a tmpfs holding the app's pristine data (`pristine`), one
/// volume per case and setting, and a run directory (sockets, configs, logs) and a home for
/// the app, outside the volumes.
pub struct Lab {
    pub name: &'static str,
    pub run: PathBuf,
    pub home: PathBuf,
    pub pristine: PathBuf,
    fs: Tmpfs,
}

impl Lab {
    pub fn new(name: &'static str) -> Lab {
        let fs = Tmpfs::new();
        let dir = |rel: &str, mode: u32| {
            let p = fs.path().join(rel);
            std::fs::create_dir(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            chown(&p, APP, APP);
            chmod(&p, mode);
            p
        };
        let (run, home, pristine) = (dir("run", 0o755), dir("home", 0o700), dir("pristine", 0o755));
        Lab { name, run, home, pristine, fs }
    }

    /// A copy of the pristine volume as `case` has it, at a path of its own.
    pub fn stage(&self, case: Case, label: &str) -> PathBuf {
        let vol = self.fs.path().join(label);
        let out = run(Command::new(exe("cp")).arg("-a").arg(&self.pristine).arg(&vol));
        assert_eq!(out.code, 0, "cp -a\n{}", out.describe());
        match case {
            Case::Restored => {
                let owner = format!("{RESTORED_AS}:{RESTORED_AS}");
                let out = run(Command::new(exe("chown")).args(["-R", "-h", &owner]).arg(&vol));
                assert_eq!(out.code, 0, "chown -R\n{}", out.describe());
            }
            Case::Walked => {
                // The kubelet's rule is volprep's `--fs-group` (tests/apply.rs): run with another
                // group, and the marker forgotten, as a kubelet leaves no marker.
                let group = EARLIER_GROUP.to_string();
                volprep_on(&vol, &["--fs-group", &group]);
                for name in ["user.volprep", "user.volprep.checkpoint"] {
                    let (p, n) = (cpath(&vol), std::ffi::CString::new(name).unwrap());
                    // SAFETY: `p` and `n` are valid C strings alive across the call.
                    unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) };
                }
            }
        }
        vol
    }

    /// A path in the run directory.
    pub fn run_path(&self, name: &str) -> PathBuf {
        self.run.join(name)
    }
}

fn cpath(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).expect("no NUL")
}

pub fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap_or_else(|e| panic!("chown {}: {e}", p.display()));
}

pub fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

/// Writes `text` to `p` (owned by the app, `mode`).
pub fn write_as_app(p: &Path, text: &str, mode: u32) {
    std::fs::write(p, text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    chown(p, APP, APP);
    chmod(p, mode);
}

/// `volprep apply ARGS --report - VOL` as root, expecting exit 0; returns the report of VOL (a
/// `--sticky` temp dir has its own).
pub fn volprep_on(vol: &Path, args: &[&str]) -> serde_json::Value {
    let out = run(volprep().arg("apply").args(args).args(["--report", "-"]).arg(vol));
    assert_eq!(out.code, 0, "volprep\n{}", out.describe());
    let report = out.report();
    let volumes = report["volumes"].as_array().cloned().unwrap_or_default();
    volumes
        .into_iter()
        .find(|v| v["path"] == vol.to_str().unwrap())
        .unwrap_or_else(|| panic!("no report of {}\n{}", vol.display(), out.describe()))
}

/// The flags of `setting` for `case` (`row`: the README's row of the app; `tmpdir` stands for
/// `TMPDIR` in it).
pub fn setting_args(row: &Row, case: Case, setting: Setting, tmpdir: &Path) -> Vec<String> {
    let group = APP.to_string();
    let mut args = vec!["--fs-group".to_string(), group];
    if setting == Setting::KubeletRule {
        return args;
    }
    if case == Case::Restored {
        args.extend(["--owner".to_string(), APP.to_string()]);
    }
    // The app's uid, as the chart (from the pod's runAsUser) and inject give it.
    args.extend(["--app-uid".to_string(), APP.to_string()]);
    let tmp = tmpdir.to_string_lossy();
    args.extend(row.setting.split_whitespace().map(|w| if w == "TMPDIR" { tmp.to_string() } else { w.to_string() }));
    args
}

/// A look at a staged volume before volprep runs.
pub type Staged<'a> = &'a dyn Fn(Case, &Path);

/// One app of the matrix: how it makes its data, and how it is checked on a volume.
pub struct App<'a> {
    /// Its README row starts with this word.
    pub row: &'static str,
    /// Makes the app's data in `vol` (the pristine volume), as the app.
    pub create: &'a dyn Fn(&Lab, &Path),
    /// Starts the app on `vol` (its `n`-th run: ports and names may differ per run), reads,
    /// writes and stops it.
    pub check: &'a dyn Fn(&Lab, &Path, usize) -> Probe,
    /// The app's temp dir in a volume (`TMPDIR` in the README's setting).
    pub tmpdir: &'static str,
    /// Looks at each staged volume before volprep runs (e.g. `inspect` on it).
    pub staged: Option<Staged<'a>>,
}

/// Runs the matrix of `app`: {restored, walked} × {the README's setting, the kubelet's rule};
/// asserts that the setting gives a working app in both cases, and that the kubelet's rule
/// gives what the README says. Prints (and appends to `$VOLPREP_APPS_SUMMARY`) one line per
/// cell.
pub fn matrix(app: &App<'_>) {
    let row = readme_row(app.row);
    let lab = Lab::new(app.row);
    (app.create)(&lab, &lab.pristine);
    let mut failures = Vec::new();
    let mut n = 0;
    for case in [Case::Restored, Case::Walked] {
        for setting in [Setting::Documented, Setting::KubeletRule] {
            n += 1;
            let vol = lab.stage(case, &format!("{case}-{n}"));
            if let Some(staged) = app.staged {
                staged(case, &vol);
            }
            let args = setting_args(&row, case, setting, &vol.join(app.tmpdir));
            let args_ref: Vec<&str> = args.iter().map(String::as_str).collect();
            let report = volprep_on(&vol, &args_ref);
            let started = Instant::now();
            let probe = (app.check)(&lab, &vol, n);
            let secs = started.elapsed().as_secs_f64();
            let (want, text) = match (setting, case) {
                (Setting::Documented, _) => (Outcome::Works, String::new()),
                (Setting::KubeletRule, Case::Restored) => row.restored.clone(),
                (Setting::KubeletRule, Case::Walked) => row.walked.clone(),
            };
            let got = probe.outcome();
            let flags = args.join(" ").replace(vol.to_str().unwrap(), "VOL");
            let shown = match setting {
                Setting::Documented => flags,
                Setting::KubeletRule => format!("{flags} (the kubelet's rule)"),
            };
            let line = format!(
                "{} | {case} | {shown} | {} | {got:?} | tightened {} | {secs:.1} s",
                row.app,
                probe.steps(),
                report["tightened"]
            );
            summary(&line);
            let matches = got == want && (text.is_empty() || probe.transcript.contains(&text));
            if !matches {
                failures.push(format!(
                    "{line}\n  README says {want:?} {text:?}\n  volprep report: {report}\n{}",
                    probe.transcript
                ));
            }
        }
    }
    failures.extend(shared_with_a_peer(app, &row, &lab, n + 1));
    assert!(failures.is_empty(), "{}: the app matrix differs from the README:\n{}", row.app, failures.join("\n"));
}

/// The uid of a second member of the app's group (`.ci/apps.sh` makes it).
const PEER_UID: u32 = 2001;

/// The README's setting on a walked volume that a second uid of the group shares: the peer keeps
/// a private directory and file there (0700, 0600) and plants names of app paths (`pubring.kbx`,
/// `PG_VERSION`, `.erlang.cookie`) in the volume's root. The app must still work, and reach the
/// peer's files through the group (app-safe gives another uid's entries the kubelet's bits,
/// and a name another uid planted proves nothing). The failure, if any.
fn shared_with_a_peer(app: &App<'_>, row: &Row, lab: &Lab, n: usize) -> Option<String> {
    let vol = lab.stage(Case::Walked, &format!("shared-{n}"));
    let peer = vol.join("peer-data");
    std::fs::create_dir(&peer).unwrap();
    std::fs::write(peer.join("notes"), "peer").unwrap();
    for (p, mode) in [(peer.join("notes"), 0o600), (peer.clone(), 0o700)] {
        chown(&p, PEER_UID, PEER_UID);
        chmod(&p, mode);
    }
    for name in ["pubring.kbx", "PG_VERSION", ".erlang.cookie"] {
        let p = vol.join(name);
        if !p.exists() {
            std::fs::write(&p, "").unwrap();
            chown(&p, PEER_UID, APP);
            chmod(&p, 0o660);
        }
    }
    let args = setting_args(row, Case::Walked, Setting::Documented, &vol.join(app.tmpdir));
    let args_ref: Vec<&str> = args.iter().map(String::as_str).collect();
    let report = volprep_on(&vol, &args_ref);
    let probe = (app.check)(lab, &vol, n);
    let peer_read = said(as_app(lab, "cat").arg(peer.join("notes")));
    let flags = args.join(" ").replace(vol.to_str().unwrap(), "VOL");
    let line = format!(
        "{} | walked, shared with uid {PEER_UID} | {flags} | {} | {:?} | peer's file read by the app: {} | tightened {}",
        row.app,
        probe.steps(),
        probe.outcome(),
        if peer_read.ok { "✔" } else { "✗" },
        report["tightened"]
    );
    summary(&line);
    (probe.outcome() != Outcome::Works || !peer_read.ok).then(|| {
        format!(
            "{line}\n  the app must work and read the peer's file\n  volprep report: {report}\n{}{}",
            probe.transcript, peer_read.text
        )
    })
}

/// Prints a line of the matrix, and appends it to `$VOLPREP_APPS_SUMMARY` when set.
fn summary(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "MATRIX {line}");
    if let Some(path) = std::env::var_os(SUMMARY_ENV) {
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }
}
