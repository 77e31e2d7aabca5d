//! Runs one method as a child process and measures it: wall time, and user/sys CPU and peak RSS
//! from `wait4`'s rusage (which also covers the grandchildren a shell waited for).

use std::ffi::OsStr;
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl Exit {
    pub fn describe(self) -> String {
        match self {
            Exit::Code(c) => format!("exit {c}"),
            Exit::Signal(s) => format!("signal {s}"),
        }
    }
}

/// Figures of one child run.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub wall_s: f64,
    pub user_s: f64,
    pub sys_s: f64,
    pub maxrss_kib: u64,
    pub exit: Exit,
}

/// When to SIGKILL a child that is still running.
#[derive(Debug, Clone)]
pub enum Kill {
    /// This long after its start.
    After(Duration),
    /// Once a volprep progress line in its stderr file (text log) counts this many entries.
    AtEntries(u64, std::path::PathBuf),
}

/// The largest `entries=` of the progress lines in volprep's text log `log` (read from
/// `*offset` on, which moves past the whole lines read).
fn progress_in(log: &Path, offset: &mut u64) -> u64 {
    use std::io::{Read, Seek};
    let Ok(mut f) = std::fs::File::open(log) else { return 0 };
    let mut text = String::new();
    if f.seek(io::SeekFrom::Start(*offset)).is_err() || f.read_to_string(&mut text).is_err() {
        return 0;
    }
    let whole = text.rfind('\n').map_or(0, |i| i + 1);
    *offset += whole as u64;
    text[..whole]
        .lines()
        .filter(|l| l.contains(" progress "))
        .filter_map(|l| l.split(" entries=").nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// Spawns `cmd`; when it is still running at `kill`, SIGKILLs it. The kill only ever targets
/// our own unreaped child (checked with `WNOHANG` first), never a reused pid.
pub fn run_until(cmd: &mut Command, kill: Option<Kill>) -> io::Result<Measured> {
    let start = Instant::now();
    let child = cmd.spawn()?;
    let pid = child.id() as libc::pid_t;
    // `child` is not waited through std: wait4 below reaps it. Dropping a Child does not wait.
    drop(child);
    let mut status = 0;
    // SAFETY: rusage is plain old data; zeroed is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if let Some(kill) = kill {
        let deadline = match &kill {
            Kill::After(after) => start + *after,
            Kill::AtEntries(..) => start + Duration::from_secs(3600),
        };
        let (mut offset, mut seen) = (0, 0);
        loop {
            // SAFETY: valid pointers to locals.
            let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
            if r == pid {
                return Ok(measured(start, status, &ru));
            }
            if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return Err(io::Error::last_os_error());
            }
            if let Kill::AtEntries(at, log) = &kill {
                seen = seen.max(progress_in(log, &mut offset));
                if seen >= *at {
                    // SAFETY: pid is our child and has not been reaped (wait4 returned 0).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    break;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                // SAFETY: pid is our child and has not been reaped (wait4 returned 0).
                unsafe { libc::kill(pid, libc::SIGKILL) };
                break;
            }
            std::thread::sleep((deadline - now).min(Duration::from_micros(500)));
        }
    }
    loop {
        // SAFETY: valid pointers to locals.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            return Ok(measured(start, status, &ru));
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

fn measured(start: Instant, status: i32, ru: &libc::rusage) -> Measured {
    let wall_s = start.elapsed().as_secs_f64();
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let exit = if libc::WIFEXITED(status) {
        Exit::Code(libc::WEXITSTATUS(status))
    } else {
        Exit::Signal(libc::WTERMSIG(status))
    };
    Measured { wall_s, user_s: tv(ru.ru_utime), sys_s: tv(ru.ru_stime), maxrss_kib: ru.ru_maxrss as u64, exit }
}

/// A small helper process (`__spawner`) that starts every measured child.
///
/// Linux carries the memory high-water mark of the process image an `exec` replaces into the
/// new program's `ru_maxrss` (`exec_mmap`), and `posix_spawn` children share their parent's
/// memory until they exec. A child spawned by the benchmark itself, which holds the tree's
/// record (tens of MiB at 100k entries), would report at least that as its peak RSS. The
/// spawner is started before the record exists, so the floor under every figure is its own
/// few MiB.
pub struct Spawner {
    child: Child,
    tx: Option<ChildStdin>,
    rx: BufReader<ChildStdout>,
}

impl Spawner {
    pub fn start(exe: &Path) -> io::Result<Spawner> {
        let mut child = Command::new(exe).arg("__spawner").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        let tx = child.stdin.take();
        let rx = BufReader::new(child.stdout.take().expect("piped stdout"));
        Ok(Spawner { child, tx, rx })
    }

    /// Runs `cmd` (program, arguments, environment changes) with stdout and stderr sent to
    /// the given files (`None`: /dev/null); SIGKILLs it at `kill`.
    pub fn run(
        &mut self,
        cmd: &Command,
        stdout: Option<&Path>,
        stderr: Option<&Path>,
        kill: Option<Kill>,
    ) -> io::Result<Measured> {
        let (kill_after, kill_at) = match &kill {
            Some(Kill::After(d)) => (Some(d.as_secs_f64()), None),
            Some(Kill::AtEntries(n, _)) => (None, Some(*n)),
            None => (None, None),
        };
        let s = |p: &OsStr| p.to_string_lossy().into_owned();
        let req = json!({
            "program": s(cmd.get_program()),
            "args": cmd.get_args().map(s).collect::<Vec<_>>(),
            "env": cmd.get_envs().map(|(k, v)| json!([s(k), v.map(s)])).collect::<Vec<_>>(),
            "stdout": stdout.map(|p| s(p.as_os_str())),
            "stderr": stderr.map(|p| s(p.as_os_str())),
            "kill_after_s": kill_after,
            "kill_at_entries": kill_at,
        });
        let tx = self.tx.as_mut().ok_or_else(|| io::Error::other("spawner closed"))?;
        writeln!(tx, "{req}")?;
        tx.flush()?;
        let mut line = String::new();
        if self.rx.read_line(&mut line)? == 0 {
            return Err(io::Error::other("the spawner process ended"));
        }
        let v: Value = serde_json::from_str(&line).map_err(io::Error::other)?;
        if let Some(e) = v.get("error").and_then(Value::as_str) {
            return Err(io::Error::other(format!("spawning {}: {e}", s(cmd.get_program()))));
        }
        let f = |k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
        let exit = match (v.get("code").and_then(Value::as_i64), v.get("signal").and_then(Value::as_i64)) {
            (Some(c), _) => Exit::Code(c as i32),
            (None, Some(sig)) => Exit::Signal(sig as i32),
            _ => return Err(io::Error::other("spawner reply without an exit status")),
        };
        Ok(Measured {
            wall_s: f("wall_s"),
            user_s: f("user_s"),
            sys_s: f("sys_s"),
            maxrss_kib: v.get("maxrss_kib").and_then(Value::as_u64).unwrap_or(0),
            exit,
        })
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        drop(self.tx.take());
        let _ = self.child.wait();
    }
}

fn output(path: Option<&Value>) -> io::Result<Stdio> {
    match path.and_then(Value::as_str) {
        Some(p) => Ok(std::fs::File::create(p)?.into()),
        None => Ok(Stdio::null()),
    }
}

fn serve_one(req: &Value) -> io::Result<Measured> {
    let strs = |k: &str| -> Vec<String> {
        req.get(k)
            .and_then(Value::as_array)
            .map_or(Vec::new(), |a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
    };
    let program = req.get("program").and_then(Value::as_str).ok_or_else(|| io::Error::other("no program"))?;
    let mut cmd = Command::new(program);
    cmd.args(strs("args"));
    for kv in req.get("env").and_then(Value::as_array).into_iter().flatten() {
        match (kv.get(0).and_then(Value::as_str), kv.get(1).and_then(Value::as_str)) {
            (Some(k), Some(v)) => cmd.env(k, v),
            (Some(k), None) => cmd.env_remove(k),
            _ => &mut cmd,
        };
    }
    cmd.stdin(Stdio::null()).stdout(output(req.get("stdout"))?).stderr(output(req.get("stderr"))?);
    let kill =
        match (req.get("kill_after_s").and_then(Value::as_f64), req.get("kill_at_entries").and_then(Value::as_u64)) {
            (Some(s), _) => Some(Kill::After(Duration::from_secs_f64(s))),
            (None, Some(n)) => {
                let log = req
                    .get("stderr")
                    .and_then(Value::as_str)
                    .ok_or_else(|| io::Error::other("kill at entries needs a stderr file"))?;
                Some(Kill::AtEntries(n, log.into()))
            }
            (None, None) => None,
        };
    run_until(&mut cmd, kill)
}

/// `__spawner`: one JSON request per stdin line, one JSON reply per stdout line.
pub fn serve() -> i32 {
    let stdin = io::stdin();
    let mut out = io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return 1 };
        let reply = match serde_json::from_str::<Value>(&line).map_err(io::Error::other).and_then(|r| serve_one(&r)) {
            Ok(m) => {
                let (code, signal) = match m.exit {
                    Exit::Code(c) => (Some(c), None),
                    Exit::Signal(s) => (None, Some(s)),
                };
                json!({"wall_s": m.wall_s, "user_s": m.user_s, "sys_s": m.sys_s,
                       "maxrss_kib": m.maxrss_kib, "code": code, "signal": signal})
            }
            Err(e) => json!({"error": e.to_string()}),
        };
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            return 1;
        }
    }
    0
}
